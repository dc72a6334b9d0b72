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
	p := decisionParser{b: b}
	d := &Decision{}
	if !p.byte('{') {
		return nil, false
	}
	seen := 0
	for first := true; ; first = false {
		if p.peek() == '}' && first {
			p.i++
			break
		}
		key, ok := p.plainString()
		if !ok || !p.byte(':') {
			return nil, false
		}
		var bit int
		switch key {
		case "tool_call_id":
			bit = 1
			d.ToolCallID, ok = p.plainString()
		case "phase":
			bit = 2
			d.Phase, ok = p.plainString()
		case "decision":
			bit = 4
			d.Decision, ok = p.plainString()
		case "reason_codes":
			bit = 8
			d.ReasonCodes, ok = p.strings()
		case "receipt_id":
			bit = 16
			d.ReceiptID, ok = p.plainString()
		case "registry_digest":
			bit = 32
			d.RegistryDigest, ok = p.plainString()
		case "receipt":
			bit = 64
			start := p.i
			if ok = p.skip(0); ok {
				// As json.Unmarshal: a RawMessage keeps even "null".
				d.Receipt = append(json.RawMessage(nil), b[start:p.i]...)
			}
		case "details":
			bit = 128
			d.Details, ok = p.strings()
		default:
			return nil, false
		}
		if !ok || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
		if p.byte(',') {
			continue
		}
		if !p.byte('}') {
			return nil, false
		}
		break
	}
	// Every string was checked for UTF-8 (jsonkit.ScanString); the rest
	// of what was read is ASCII.
	if p.i != len(b) {
		return nil, false
	}
	return d, true
}

// decisionParser reads the compact JSON workers write: no whitespace.
type decisionParser struct {
	b []byte
	i int
}

func (p *decisionParser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *decisionParser) byte(c byte) bool {
	if p.peek() == c {
		p.i++
		return true
	}
	return false
}

// plainString reads a string without escapes.
func (p *decisionParser) plainString() (string, bool) {
	end, escaped, ok := jsonkit.ScanString(p.b, p.i)
	if !ok || escaped {
		return "", false
	}
	str := string(p.b[p.i+1 : end-1])
	p.i = end
	return str, true
}

// strings reads null or an array of plain strings.
func (p *decisionParser) strings() ([]string, bool) {
	if p.literal("null") {
		return nil, true
	}
	if !p.byte('[') {
		return nil, false
	}
	out := []string{}
	if p.byte(']') {
		return out, true
	}
	for {
		s, ok := p.plainString()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		if p.byte(']') {
			return out, true
		}
		if !p.byte(',') {
			return nil, false
		}
	}
}

func (p *decisionParser) literal(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// skip passes over one JSON value (objects, arrays, strings, numbers and
// literals, checked as it goes); json.Valid of the value it spans holds.
func (p *decisionParser) skip(depth int) bool {
	if depth > DefaultMaxDepth {
		return false
	}
	switch c := p.peek(); {
	case c == '{':
		p.i++
		if p.byte('}') {
			return true
		}
		for {
			if !p.skipString() || !p.byte(':') || !p.skip(depth+1) {
				return false
			}
			if p.byte('}') {
				return true
			}
			if !p.byte(',') {
				return false
			}
		}
	case c == '[':
		p.i++
		if p.byte(']') {
			return true
		}
		for {
			if !p.skip(depth + 1) {
				return false
			}
			if p.byte(']') {
				return true
			}
			if !p.byte(',') {
				return false
			}
		}
	case c == '"':
		return p.skipString()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		end := jsonkit.NumberEnd(p.b, p.i)
		p.i = end
		return end >= 0
	}
	return false
}

// skipString passes over a string, escapes included.
func (p *decisionParser) skipString() bool {
	end, _, ok := jsonkit.ScanString(p.b, p.i)
	p.i = end
	return ok
}
