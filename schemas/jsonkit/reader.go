package jsonkit

import "strconv"

// Reader reads JSON tokens from B, starting at I, for the one-pass
// readers of small documents (a decision reply, a stream's
// acknowledgement): each method consumes one token and reports whether it
// was there, leaving I unchanged otherwise. It does not skip white space
// by itself: Space does, where a document may hold some.
type Reader struct {
	B []byte
	I int
}

// Peek is the next byte, or 0 at the end.
func (r *Reader) Peek() byte {
	if r.I < len(r.B) {
		return r.B[r.I]
	}
	return 0
}

// Byte consumes c if it is the next byte.
func (r *Reader) Byte(c byte) bool {
	if r.Peek() == c {
		r.I++
		return true
	}
	return false
}

// Space consumes JSON white space.
func (r *Reader) Space() {
	for {
		switch r.Peek() {
		case ' ', '\t', '\n', '\r':
			r.I++
		default:
			return
		}
	}
}

// Literal consumes s if it comes next (true, false, null).
func (r *Reader) Literal(s string) bool {
	if len(r.B)-r.I >= len(s) && string(r.B[r.I:r.I+len(s)]) == s {
		r.I += len(s)
		return true
	}
	return false
}

// PlainString reads a valid string without escapes (ScanString), whose
// text is the bytes between its quotes.
func (r *Reader) PlainString() (string, bool) {
	end, escaped, ok := ScanString(r.B, r.I)
	if !ok || escaped {
		return "", false
	}
	s := string(r.B[r.I+1 : end-1])
	r.I = end
	return s, true
}

// Uint reads a number that is an unsigned integer in range (no sign,
// fraction or exponent).
func (r *Reader) Uint() (uint64, bool) {
	end := NumberEnd(r.B, r.I)
	if end < 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(r.B[r.I:end]), 10, 64)
	if err != nil {
		return 0, false
	}
	r.I = end
	return v, true
}

// Object reads an object whose member names are plain strings, calling
// member at each value: member reads the value and returns the member's
// bit (a power of two of its own per name it knows, 0 for a name it does
// not) and whether the value was there. Object reports false for bad
// syntax, a value member could not read, an unknown name or one given
// twice (encoding/json would keep the last: a caller that falls back to it
// stays in agreement); otherwise it returns the bits of the members read.
// With space, white space is allowed around every token (Space); without
// it, the object must be compact.
func (r *Reader) Object(space bool, member func(name string) (bit uint, ok bool)) (seen uint, ok bool) {
	sp := func() {
		if space {
			r.Space()
		}
	}
	sp()
	if !r.Byte('{') {
		return 0, false
	}
	sp()
	if r.Byte('}') {
		return 0, true
	}
	for {
		name, ok := r.PlainString()
		sp()
		if !ok || !r.Byte(':') {
			return 0, false
		}
		sp()
		bit, ok := member(name)
		if !ok || bit == 0 || seen&bit != 0 {
			return 0, false
		}
		seen |= bit
		sp()
		if r.Byte('}') {
			return seen, true
		}
		if !r.Byte(',') {
			return 0, false
		}
		sp()
	}
}
