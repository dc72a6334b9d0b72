package schemas

import (
	"bytes"
	"fmt"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// member is the value span of one object member, as byte offsets into the
// scanned document.
type member struct {
	key        string
	start, end int
}

// scanInfo receives the member spans of the top-level object and of its
// "request" object, so that raw fields (arguments, result, capability) can be
// sliced out of the input instead of being re-encoded.
type scanInfo struct {
	top     []member
	request []member
}

// scanError is what the structural scan found; it never carries input bytes.
type scanError struct {
	what   string // "duplicate object key", "nesting deeper than N", "unpaired surrogate escape"
	offset int
}

func (e *scanError) Error() string { return fmt.Sprintf("%s at byte offset %d", e.what, e.offset) }

type scanFrame struct {
	obj     bool
	capture int // 0: none, 1: top-level object, 2: top-level "request" object
	keys    []string
	set     map[string]struct{}
	lastKey string
}

// keyListMax is the object size above which duplicate detection switches from
// a linear scan to a map, so that a wide object cannot make the scan quadratic.
const keyListMax = 16

// scanStructure makes one pass over raw, which MUST already be valid JSON
// (json.Valid), and rejects what encoding/json silently accepts: duplicate
// object keys (compared after unescaping) at any depth, nesting deeper than
// maxDepth, and \u escapes that are unpaired UTF-16 surrogates (I-JSON, and
// RFC 8785 cannot canonicalise them). If info is non-nil it records the value
// spans of the top-level members and of the top-level "request" members.
func scanStructure(raw []byte, maxDepth int, info *scanInfo) error {
	var stack []scanFrame
	expectKey := false
	n := len(raw)
	for i := 0; i < n; {
		c := raw[i]
		switch c {
		case '"':
			end, escaped, err := scanString(raw, i+1)
			if err != nil {
				return err
			}
			if expectKey && len(stack) > 0 {
				f := &stack[len(stack)-1]
				key := memberName(raw[i+1:end], escaped)
				if f.hasKey(key) {
					return &scanError{what: "duplicate object key", offset: i}
				}
				f.addKey(key)
				f.lastKey = key
				if info != nil {
					switch f.capture {
					case 1:
						info.top = append(info.top, member{key: key, start: -1})
					case 2:
						info.request = append(info.request, member{key: key, start: -1})
					}
				}
				expectKey = false
			}
			i = end + 1
		case ':':
			if info != nil && len(stack) > 0 {
				if ms := info.list(stack[len(stack)-1].capture); ms != nil {
					(*ms)[len(*ms)-1].start = i + 1
				}
			}
			i++
		case ',', '}', ']':
			if len(stack) > 0 {
				f := &stack[len(stack)-1]
				if info != nil && f.obj {
					if ms := info.list(f.capture); ms != nil && len(*ms) > 0 {
						m := &(*ms)[len(*ms)-1]
						if m.end == 0 && m.start > 0 {
							m.start, m.end = trimSpan(raw, m.start, i)
						}
					}
				}
				if c == ',' {
					expectKey = f.obj
				} else {
					stack = stack[:len(stack)-1]
					expectKey = false
				}
			}
			i++
		case '{', '[':
			if len(stack) >= maxDepth {
				return &scanError{what: fmt.Sprintf("nesting deeper than %d", maxDepth), offset: i}
			}
			capture := 0
			if c == '{' {
				if len(stack) == 0 {
					capture = 1
				} else if p := stack[len(stack)-1]; p.capture == 1 && p.obj && p.lastKey == "request" {
					capture = 2
				}
			}
			stack = pushFrame(stack, c == '{', capture)
			expectKey = c == '{'
			i++
		default:
			i++
		}
	}
	return nil
}

// memberName is the name of a member from the bytes between its quotes;
// escaped says whether they hold an escape.
func memberName(quoted []byte, escaped bool) string {
	if escaped {
		return jsonkit.Unescape(quoted)
	}
	return string(quoted)
}

// pushFrame opens a frame for an object (obj) or an array, reusing the
// key list of a frame popped earlier when the stack has room.
func pushFrame(stack []scanFrame, obj bool, capture int) []scanFrame {
	if len(stack) < cap(stack) {
		stack = stack[:len(stack)+1]
		f := &stack[len(stack)-1]
		f.obj, f.capture, f.keys, f.set, f.lastKey = obj, capture, f.keys[:0], nil, ""
		return stack
	}
	return append(stack, scanFrame{obj: obj, capture: capture})
}

func (si *scanInfo) list(capture int) *[]member {
	switch capture {
	case 1:
		return &si.top
	case 2:
		return &si.request
	}
	return nil
}

func (f *scanFrame) hasKey(k string) bool {
	if f.set != nil {
		_, ok := f.set[k]
		return ok
	}
	for _, x := range f.keys {
		if x == k {
			return true
		}
	}
	return false
}

func (f *scanFrame) addKey(k string) {
	if f.set != nil {
		f.set[k] = struct{}{}
		return
	}
	f.keys = append(f.keys, k)
	if len(f.keys) > keyListMax {
		f.set = make(map[string]struct{}, 2*len(f.keys))
		for _, x := range f.keys {
			f.set[x] = struct{}{}
		}
	}
}

func trimSpan(raw []byte, a, b int) (int, int) {
	for a < b && isSpace(raw[a]) {
		a++
	}
	for b > a && isSpace(raw[b-1]) {
		b--
	}
	return a, b
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// scanString returns the offset of the closing quote of the string whose
// contents start at i, whether it contains escapes, and an error for an
// unpaired surrogate escape (the only escape problem json.Valid input can
// have).
func scanString(raw []byte, i int) (end int, escaped bool, err error) {
	for {
		q := bytes.IndexByte(raw[i:], '"')
		if q < 0 {
			return len(raw), escaped, &scanError{what: "unterminated string", offset: i}
		}
		bs := bytes.IndexByte(raw[i:i+q], '\\')
		if bs < 0 {
			return i + q, escaped, nil
		}
		escaped = true
		j := i + bs
		_, n := jsonkit.DecodeEscape(raw, j)
		if n == 0 {
			return 0, true, &scanError{what: "unpaired surrogate escape", offset: j}
		}
		i = j + n
	}
}
