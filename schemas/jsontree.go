package schemas

import (
	"encoding/json"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// envelopeSpans are the exact input bytes of the envelope members that
// ParsedCall keeps raw instead of re-encoding them. A nil span means the
// member is absent.
type envelopeSpans struct {
	request, capability, senderSignature, result []byte // top-level members
	arguments, meta                              []byte // members of the top-level "request" object
}

// spansFromScan converts what scanStructure recorded into envelopeSpans.
func spansFromScan(raw []byte, info *scanInfo) envelopeSpans {
	return envelopeSpans{
		request:         spanOf(raw, info.top, "request"),
		capability:      spanOf(raw, info.top, "capability"),
		senderSignature: spanOf(raw, info.top, "sender_signature"),
		result:          spanOf(raw, info.top, "result"),
		arguments:       spanOf(raw, info.request, "arguments"),
		meta:            spanOf(raw, info.request, "_meta"),
	}
}

// jsonNestingLimit is the deepest nesting encoding/json decodes; deeper
// input is a syntax error there, so the tree parser never goes past it.
const jsonNestingLimit = 10000

// decodeObjectTree is the envelope's one-pass decoder. If raw is exactly
// one JSON object (whitespace around it allowed) that passes every
// structural check of parseToolCallReference — valid UTF-8, no duplicate
// key in any object (keys compared after unescaping), nesting no deeper
// than maxDepth (the top-level object is level 1), no unpaired surrogate
// escape — it returns the tree encoding/json with UseNumber decodes
// (objects map[string]any, arrays []any, numbers json.Number) and the
// envelope's member spans, with ok=true. For anything else it returns
// ok=false and says no more: the caller MUST then run the reference
// checks, which say exactly what is wrong. It also declines nesting deeper
// than encoding/json decodes (jsonNestingLimit).
//
// Strings without escapes are substrings of one copy of raw, so their
// bytes are copied once for the whole tree.
func decodeObjectTree(raw []byte, maxDepth int) (doc map[string]any, spans envelopeSpans, ok bool) {
	p := treeParser{src: string(raw), raw: raw, maxDepth: min(maxDepth, jsonNestingLimit)}
	p.skipSpace()
	if p.pos >= len(p.src) || p.src[p.pos] != '{' {
		return nil, envelopeSpans{}, false
	}
	doc, ok = p.object(1, captureTop)
	if !ok {
		return nil, envelopeSpans{}, false
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, envelopeSpans{}, false
	}
	return doc, p.spans, true
}

// capture says which member spans an object records.
type capture uint8

const (
	captureNone    capture = iota
	captureTop             // the top-level object
	captureRequest         // the top-level "request" object
)

type keyValue struct {
	key string
	val any
}

// treeParser is a recursive-descent JSON decoder over src (a copy of raw:
// offsets are shared). Members and elements of the containers being
// decoded wait on two scratch stacks, so each map and slice is allocated
// once at its final size.
type treeParser struct {
	src      string
	raw      []byte
	pos      int
	maxDepth int
	kvs      scratch[keyValue]
	vals     scratch[any]
	spans    envelopeSpans
}

// scratch is a stack whose first entries live in the parser itself (no
// slice points into it, so a parser on the stack stays there) and whose
// overflow goes to the heap.
type scratch[T any] struct {
	n     int
	fixed [24]T
	more  []T
}

func (s *scratch[T]) push(v T) {
	if s.n < len(s.fixed) {
		s.fixed[s.n] = v
	} else {
		s.more = append(s.more, v)
	}
	s.n++
}

func (s *scratch[T]) at(i int) T {
	if i < len(s.fixed) {
		return s.fixed[i]
	}
	return s.more[i-len(s.fixed)]
}

// truncate drops the entries from n on.
func (s *scratch[T]) truncate(n int) {
	s.n = n
	if over := n - len(s.fixed); over >= 0 {
		s.more = s.more[:over]
	} else {
		s.more = s.more[:0]
	}
}

func (p *treeParser) skipSpace() {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			return
		}
		p.pos++
	}
}

// value decodes the value at p.pos (whitespace already skipped); level is
// the nesting level a container here would have.
func (p *treeParser) value(level int, c capture) (any, bool) {
	if p.pos >= len(p.src) {
		return nil, false
	}
	switch ch := p.src[p.pos]; {
	case ch == '"':
		return p.str()
	case ch == '{':
		m, ok := p.object(level, c)
		if !ok {
			return nil, false
		}
		return m, true
	case ch == '[':
		return p.array(level)
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return p.number()
	case ch == 't':
		return true, p.literal("true")
	case ch == 'f':
		return false, p.literal("false")
	case ch == 'n':
		return nil, p.literal("null")
	}
	return nil, false
}

func (p *treeParser) literal(lit string) bool {
	if len(p.src)-p.pos < len(lit) || p.src[p.pos:p.pos+len(lit)] != lit {
		return false
	}
	p.pos += len(lit)
	return true
}

// object decodes the object at p.pos ('{'). Objects directly under a
// captured object record the spans envelopeSpans names.
func (p *treeParser) object(level int, c capture) (map[string]any, bool) {
	if level > p.maxDepth {
		return nil, false
	}
	p.pos++ // '{'
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return map[string]any{}, true
	}
	base := p.kvs.n
	for {
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			return nil, false
		}
		key, ok := p.str()
		if !ok {
			return nil, false
		}
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return nil, false
		}
		p.pos++
		p.skipSpace()
		start := p.pos
		sub := captureNone
		if c == captureTop && key == "request" {
			sub = captureRequest
		}
		v, ok := p.value(level+1, sub)
		if !ok {
			return nil, false
		}
		if c != captureNone {
			p.record(c, key, p.raw[start:p.pos:p.pos])
		}
		p.kvs.push(keyValue{key, v})
		p.skipSpace()
		if p.pos >= len(p.src) {
			return nil, false
		}
		if p.src[p.pos] == ',' {
			p.pos++
			p.skipSpace()
			continue
		}
		if p.src[p.pos] != '}' {
			return nil, false
		}
		p.pos++
		break
	}
	n := p.kvs.n - base
	m := make(map[string]any, n)
	for i := base; i < p.kvs.n; i++ {
		kv := p.kvs.at(i)
		m[kv.key] = kv.val
	}
	p.kvs.truncate(base)
	return m, len(m) == n // fewer entries than members: a duplicate key
}

func (p *treeParser) record(c capture, key string, span []byte) {
	s := &p.spans
	switch c {
	case captureTop:
		switch key {
		case "request":
			s.request = span
		case "capability":
			s.capability = span
		case "sender_signature":
			s.senderSignature = span
		case "result":
			s.result = span
		}
	case captureRequest:
		switch key {
		case "arguments":
			s.arguments = span
		case "_meta":
			s.meta = span
		}
	}
}

// array decodes the array at p.pos ('['). Like encoding/json it yields a
// non-nil slice for [].
func (p *treeParser) array(level int) (any, bool) {
	if level > p.maxDepth {
		return nil, false
	}
	p.pos++ // '['
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		return []any{}, true
	}
	base := p.vals.n
	for {
		v, ok := p.value(level+1, captureNone)
		if !ok {
			return nil, false
		}
		p.vals.push(v)
		p.skipSpace()
		if p.pos >= len(p.src) {
			return nil, false
		}
		if p.src[p.pos] == ',' {
			p.pos++
			p.skipSpace()
			continue
		}
		if p.src[p.pos] != ']' {
			return nil, false
		}
		p.pos++
		break
	}
	a := make([]any, p.vals.n-base)
	for i := range a {
		a[i] = p.vals.at(base + i)
	}
	p.vals.truncate(base)
	return a, true
}

// number decodes a number with RFC 8259's grammar, as json.Number.
func (p *treeParser) number() (any, bool) {
	end := jsonkit.NumberEnd(p.src, p.pos)
	if end < 0 {
		return nil, false
	}
	n := json.Number(p.src[p.pos:end])
	p.pos = end
	return n, true
}

// str decodes the string at p.pos ('"'). One without escapes is a
// substring of src.
func (p *treeParser) str() (string, bool) {
	end, escaped, ok := jsonkit.ScanString(p.src, p.pos)
	if !ok {
		return "", false
	}
	start := p.pos + 1
	p.pos = end
	if escaped {
		return jsonkit.Unescape(p.src[start : end-1]), true
	}
	return p.src[start : end-1], true
}
