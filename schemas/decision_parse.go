package schemas

import (
	"encoding/json"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// ParseDecision decodes a decision reply as json.Unmarshal into a Decision
// would, faster for what workers send: one pass over the members, the
// receipt taken as the bytes it spans (a copy), strings without escapes
// sliced out. Anything else (escapes, duplicate or unknown members, other
// layouts) is handed to json.Unmarshal, so the result never depends on which
// path ran. Enforcement points decode one per call.
func ParseDecision(b []byte) (*Decision, error) {
	if d, ok := parseDecisionFast(b); ok {
		return d, nil
	}
	var d Decision
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

func parseDecisionFast(b []byte) (*Decision, bool) {
	p := decisionParser{jsonkit.Reader{B: b}}
	d := &Decision{}
	_, ok := p.Object(false, func(name string) (bit uint, ok bool) {
		switch name {
		case "tool_call_id":
			d.ToolCallID, ok = p.PlainString()
			return 1, ok
		case "phase":
			d.Phase, ok = p.PlainString()
			return 2, ok
		case "decision":
			d.Decision, ok = p.PlainString()
			return 4, ok
		case "reason_codes":
			d.ReasonCodes, ok = p.strings()
			return 8, ok
		case "receipt_id":
			d.ReceiptID, ok = p.PlainString()
			return 16, ok
		case "registry_digest":
			d.RegistryDigest, ok = p.PlainString()
			return 32, ok
		case "receipt":
			start := p.I
			if ok = p.skip(0); ok {
				// As json.Unmarshal: a RawMessage keeps even "null".
				d.Receipt = append(json.RawMessage(nil), b[start:p.I]...)
			}
			return 64, ok
		case "details":
			d.Details, ok = p.strings()
			return 128, ok
		}
		return 0, false
	})
	// Every string was checked for UTF-8 (jsonkit.ScanString); the rest
	// of what was read is ASCII.
	if !ok || p.I != len(b) {
		return nil, false
	}
	return d, true
}

// decisionParser reads the compact JSON workers write: no whitespace.
type decisionParser struct{ jsonkit.Reader }

// strings reads null or an array of plain strings.
func (p *decisionParser) strings() ([]string, bool) {
	if p.Literal("null") {
		return nil, true
	}
	if !p.Byte('[') {
		return nil, false
	}
	out := []string{}
	if p.Byte(']') {
		return out, true
	}
	for {
		s, ok := p.PlainString()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		if p.Byte(']') {
			return out, true
		}
		if !p.Byte(',') {
			return nil, false
		}
	}
}

// skip passes over one JSON value (objects, arrays, strings, numbers and
// literals, checked as it goes); json.Valid of the value it spans holds.
func (p *decisionParser) skip(depth int) bool {
	if depth > DefaultMaxDepth {
		return false
	}
	switch c := p.Peek(); {
	case c == '{':
		p.I++
		if p.Byte('}') {
			return true
		}
		for {
			if !p.skipString() || !p.Byte(':') || !p.skip(depth+1) {
				return false
			}
			if p.Byte('}') {
				return true
			}
			if !p.Byte(',') {
				return false
			}
		}
	case c == '[':
		p.I++
		if p.Byte(']') {
			return true
		}
		for {
			if !p.skip(depth + 1) {
				return false
			}
			if p.Byte(']') {
				return true
			}
			if !p.Byte(',') {
				return false
			}
		}
	case c == '"':
		return p.skipString()
	case c == 't':
		return p.Literal("true")
	case c == 'f':
		return p.Literal("false")
	case c == 'n':
		return p.Literal("null")
	case c == '-' || c >= '0' && c <= '9':
		end := jsonkit.NumberEnd(p.B, p.I)
		p.I = end
		return end >= 0
	}
	return false
}

// skipString passes over a string, escapes included.
func (p *decisionParser) skipString() bool {
	end, _, ok := jsonkit.ScanString(p.B, p.I)
	p.I = end
	return ok
}
