package receipts

import (
	"bytes"
	"errors"
	"strconv"
)

// This file walks canonical JSON (RFC 8785 output: valid JSON with no
// insignificant whitespace) by byte offsets, so that the signer can insert
// data.signature and the verifier can remove it without re-encoding
// anything. Inputs MUST already be canonical; callers get them from
// Canonicalize or MarshalCanonical.

var errNotCanonical = errors.New("receipts: not canonical JSON")

// skipString returns the index just past the string starting at b[i] ('"').
func skipString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, errNotCanonical
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, errNotCanonical
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errNotCanonical
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				end, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, errNotCanonical
	default: // number or literal
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']':
				return i, nil
			}
		}
		return i, nil
	}
}

// member is the byte range of one object member: the key token starts at
// start, the value occupies [valStart, end).
type member struct {
	start, valStart, end int
	key                  string
}

// findMember looks for key among the members of the object starting at
// b[i] ('{'). If found, m is its range; otherwise m.start is the index at
// which a member with that key would be inserted to keep RFC 8785 order
// (the start of the first greater key, or the closing '}'). objEnd is the
// index just past the object.
func findMember(b []byte, i int, key string) (m member, found bool, objEnd int, err error) {
	if i >= len(b) || b[i] != '{' {
		return member{}, false, 0, errNotCanonical
	}
	insertAt := -1
	i++
	for {
		if i >= len(b) {
			return member{}, false, 0, errNotCanonical
		}
		if b[i] == '}' {
			if insertAt < 0 {
				insertAt = i
			}
			if !found {
				m = member{start: insertAt}
			}
			return m, found, i + 1, nil
		}
		keyEnd, err := skipString(b, i)
		if err != nil {
			return member{}, false, 0, err
		}
		k, err := decodeKey(b[i:keyEnd])
		if err != nil {
			return member{}, false, 0, err
		}
		if keyEnd >= len(b) || b[keyEnd] != ':' {
			return member{}, false, 0, errNotCanonical
		}
		valEnd, err := skipValue(b, keyEnd+1)
		if err != nil {
			return member{}, false, 0, err
		}
		c := compareUTF16(k, key)
		switch {
		case c == 0:
			if found {
				return member{}, false, 0, errors.New("receipts: duplicate key " + strconv.Quote(key))
			}
			m, found = member{start: i, valStart: keyEnd + 1, end: valEnd, key: k}, true
		case c > 0 && insertAt < 0:
			insertAt = i
		}
		i = valEnd
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

func decodeKey(tok []byte) (string, error) {
	if bytes.IndexByte(tok, '\\') < 0 {
		return string(tok[1 : len(tok)-1]), nil
	}
	// Canonical escapes (\" \\ \b \f \n \r \t \u00xx) are a subset of Go's.
	s, err := strconv.Unquote(string(tok))
	if err != nil {
		return "", errNotCanonical
	}
	return s, nil
}

// removeMember returns b without member m of an object and without one of
// the commas that separated it from its neighbours. The result is a new
// slice.
func removeMember(b []byte, m member) []byte {
	start, end := m.start, m.end
	switch {
	case end < len(b) && b[end] == ',':
		end++
	case start > 0 && b[start-1] == ',':
		start--
	}
	out := make([]byte, 0, len(b)-(end-start))
	out = append(out, b[:start]...)
	return append(out, b[end:]...)
}
