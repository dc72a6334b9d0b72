package jsonkit

import (
	"bytes"

	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// This file walks canonical JSON (RFC 8785 output: valid JSON with no
// insignificant whitespace) by byte offsets, so that the signer can insert
// data.signature and the verifier can remove it without re-encoding
// anything (DESIGN.md §3). Inputs of the walkers MUST already be canonical;
// callers get them from Canonicalize or MarshalCanonical, or check them
// with IsCanonicalObject.

// ErrNotCanonical is returned by the walkers for input they cannot walk.
var ErrNotCanonical = errors.New("jsonkit: not canonical JSON")

// SkipString returns the index just past the string starting at b[i] ('"').
func SkipString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, ErrNotCanonical
	}
	for i++; ; i++ {
		if i = QuoteRun(b, i); i >= len(b) {
			return 0, ErrNotCanonical
		}
		if b[i] == '"' {
			return i + 1, nil
		}
		i++ // the escaped byte
	}
}

// SkipValue returns the index just past the value starting at b[i].
func SkipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, ErrNotCanonical
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				end, err := SkipString(b, i)
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
		return 0, ErrNotCanonical
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

// Member is the byte range of one object member: the key token starts at
// Start, the value occupies [ValStart, End).
type Member struct {
	Start, ValStart, End int
}

// FindMember looks for key among the members of the object starting at
// b[i] ('{'). If found, m is its range; otherwise m.Start is the index at
// which a member with that key would be inserted to keep RFC 8785 order
// (the start of the first greater key, or the closing '}'). objEnd is the
// index just past the object.
func FindMember(b []byte, i int, key string) (m Member, found bool, objEnd int, err error) {
	if i >= len(b) || b[i] != '{' {
		return Member{}, false, 0, ErrNotCanonical
	}
	insertAt := -1
	i++
	for {
		if i >= len(b) {
			return Member{}, false, 0, ErrNotCanonical
		}
		if b[i] == '}' {
			if insertAt < 0 {
				insertAt = i
			}
			if !found {
				m = Member{Start: insertAt}
			}
			return m, found, i + 1, nil
		}
		keyEnd, err := SkipString(b, i)
		if err != nil {
			return Member{}, false, 0, err
		}
		c, err := compareKey(b[i:keyEnd], key)
		if err != nil {
			return Member{}, false, 0, err
		}
		if keyEnd >= len(b) || b[keyEnd] != ':' {
			return Member{}, false, 0, ErrNotCanonical
		}
		valEnd, err := SkipValue(b, keyEnd+1)
		if err != nil {
			return Member{}, false, 0, err
		}
		switch {
		case c == 0:
			if found {
				return Member{}, false, 0, errors.New("jsonkit: duplicate key " + strconv.Quote(key))
			}
			m, found = Member{Start: i, ValStart: keyEnd + 1, End: valEnd}, true
		case c > 0 && insertAt < 0:
			insertAt = i
		}
		i = valEnd
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// FindPath looks for the member at the end of path in the object starting
// at b[i]: path[0] among its members, path[1] among the members of that
// member's value, and so on. It walks each object on the way once, where
// FindMember level by level would walk every nested one twice (skipped as a
// value, then searched), and, as FindMember, it walks every member of each
// of them, so a duplicate key on the way is an error. found is false when a
// key is missing or a value on the way is not an object.
func FindPath(b []byte, i int, path ...string) (m Member, found bool, err error) {
	if len(path) == 0 {
		return Member{}, false, errors.New("jsonkit: FindPath without a key")
	}
	m, found, _, err = findPath(b, i, path)
	return m, found, err
}

// findPath is FindPath that also returns the index just past the object.
func findPath(b []byte, i int, path []string) (m Member, found bool, objEnd int, err error) {
	if i >= len(b) || b[i] != '{' {
		return Member{}, false, 0, ErrNotCanonical
	}
	seen := false
	for i++; ; {
		if i >= len(b) {
			return Member{}, false, 0, ErrNotCanonical
		}
		if b[i] == '}' {
			return m, found, i + 1, nil
		}
		keyEnd, err := SkipString(b, i)
		if err != nil {
			return Member{}, false, 0, err
		}
		c, err := compareKey(b[i:keyEnd], path[0])
		if err != nil {
			return Member{}, false, 0, err
		}
		if keyEnd >= len(b) || b[keyEnd] != ':' {
			return Member{}, false, 0, ErrNotCanonical
		}
		val := keyEnd + 1
		var valEnd int
		switch {
		case c == 0 && seen:
			return Member{}, false, 0, errors.New("jsonkit: duplicate key " + strconv.Quote(path[0]))
		case c == 0 && len(path) == 1:
			seen = true
			if valEnd, err = SkipValue(b, val); err == nil {
				m, found = Member{Start: i, ValStart: val, End: valEnd}, true
			}
		case c == 0 && val < len(b) && b[val] == '{':
			seen = true
			m, found, valEnd, err = findPath(b, val, path[1:])
		default:
			seen = seen || c == 0
			valEnd, err = SkipValue(b, val)
		}
		if err != nil {
			return Member{}, false, 0, err
		}
		i = valEnd
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// compareKey compares the member name token tok (quotes included) with
// key in RFC 8785 order.
func compareKey(tok []byte, key string) (int, error) {
	if bytes.IndexByte(tok, '\\') < 0 {
		return compareUTF16(string(tok[1:len(tok)-1]), key), nil
	}
	// Canonical escapes (\" \\ \b \f \n \r \t \u00xx) are a subset of Go's.
	s, err := strconv.Unquote(string(tok))
	if err != nil {
		return 0, ErrNotCanonical
	}
	return compareUTF16(s, key), nil
}

// Without is the range of b that removing member m of an object drops:
// the member and one of the commas that separated it from its
// neighbours. b[:start] and b[end:] are the object without it.
func (m Member) Without(b []byte) (start, end int) {
	start, end = m.Start, m.End
	switch {
	case end < len(b) && b[end] == ',':
		end++
	case start > 0 && b[start-1] == ',':
		start--
	}
	return start, end
}

// RemoveMember returns b without member m of an object and without one of
// the commas that separated it from its neighbours. The result is a new
// slice.
func RemoveMember(b []byte, m Member) []byte {
	start, end := m.Without(b)
	out := make([]byte, 0, len(b)-(end-start))
	out = append(out, b[:start]...)
	return append(out, b[end:]...)
}

// maxFastDepth bounds the nesting the canonical-form check follows; deeper
// documents take the general path.
const maxFastDepth = 64

// IsCanonicalObject reports whether b is a JSON object exactly as RFC 8785
// writes it (what Canonicalize would return unchanged): no insignificant
// white space, members in UTF-16 order without duplicates, strings with
// only the escapes RFC 8785 uses and valid UTF-8, numbers in their
// ECMAScript form. It is conservative: a canonical document it cannot
// confirm cheaply (an escaped or non-ASCII member name, nesting beyond
// maxFastDepth) is reported as not canonical, and the caller canonicalizes
// it the general way.
func IsCanonicalObject(b []byte) bool {
	return CanonicalMembers(b, nil)
}

// CanonicalMembers is IsCanonicalObject that also calls member, if not
// nil, for each top-level member in order: its name (without quotes,
// plain ASCII) and the range [valStart, valEnd) of its value. It stops
// with false when member returns false.
func CanonicalMembers(b []byte, member func(name []byte, valStart, valEnd int) bool) bool {
	if len(b) == 0 || b[0] != '{' {
		return false
	}
	end, ok := canonObject(b, 0, 1, member)
	return ok && end == len(b)
}

// canonValue checks the canonical value starting at b[i] and returns the
// index just past it.
func canonValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; {
	case c == '"':
		return canonString(b, i)
	case c == '{':
		return canonObject(b, i, depth+1, nil)
	case c == '[':
		if depth+1 > maxFastDepth {
			return 0, false
		}
		i++
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = canonValue(b, i, depth+1); !ok || i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case ',':
				i++
			case ']':
				return i + 1, true
			default:
				return 0, false
			}
		}
	case c == 't':
		return canonLiteral(b, i, "true")
	case c == 'f':
		return canonLiteral(b, i, "false")
	case c == 'n':
		return canonLiteral(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return canonNumber(b, i)
	}
	return 0, false
}

func canonLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, false
	}
	return i + len(lit), true
}

// canonObject checks an object whose member names are plain ASCII (no
// escapes): their byte order is then their UTF-16 order. It calls member,
// if not nil, for each member.
func canonObject(b []byte, i, depth int, member func(name []byte, valStart, valEnd int) bool) (int, bool) {
	if depth > maxFastDepth {
		return 0, false
	}
	i++
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	var prev []byte
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, false
		}
		start := i + 1
		i++
		for i < len(b) && b[i] != '"' {
			if c := b[i]; c < 0x20 || c == '\\' || c >= 0x80 {
				return 0, false
			}
			i++
		}
		if i >= len(b) {
			return 0, false
		}
		key := b[start:i]
		if prev != nil && bytes.Compare(prev, key) >= 0 {
			return 0, false
		}
		prev = key
		i++
		if i >= len(b) || b[i] != ':' {
			return 0, false
		}
		valStart := i + 1
		var ok bool
		if i, ok = canonValue(b, valStart, depth); !ok || i >= len(b) {
			return 0, false
		}
		if member != nil && !member(key, valStart, i) {
			return 0, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// canonString checks a string as RFC 8785 writes it: valid UTF-8, no raw
// control character, and only the escapes \" \\ \b \f \n \r \t and \u00xx
// (lowercase hex) for the other control characters.
func canonString(b []byte, i int) (int, bool) {
	for i++; ; {
		if i = PlainRun(b, i); i >= len(b) {
			return 0, false
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1, true
		case c == '\\':
			n := canonEscape(b, i)
			if n == 0 {
				return 0, false
			}
			i += n
		case c < 0x20:
			return 0, false
		default: // not ASCII
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size <= 1 {
				return 0, false
			}
			i += size
		}
	}
}

// canonEscape is the length of the escape at b[i] ('\\') if it is one RFC
// 8785 writes (\" \\ \b \f \n \r \t, or \u00xx in lowercase hex for a
// control character without a short form), else 0.
func canonEscape(b []byte, i int) int {
	if i+1 >= len(b) {
		return 0
	}
	switch b[i+1] {
	case '"', '\\', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(b)-i < 6 || b[i+2] != '0' || b[i+3] != '0' || b[i+4] != '0' && b[i+4] != '1' || b[i+5] >= 'A' && b[i+5] <= 'F' {
			return 0
		}
		switch Hex4(b, i+2) {
		case -1, '\b', '\f', '\n', '\r', '\t': // not hex, or has a short form
			return 0
		}
		return 6
	}
	return 0
}

// canonNumber checks a number in its ECMAScript form (RFC 8785 §3.2.2.3).
func canonNumber(b []byte, i int) (int, bool) {
	start := i
	for i < len(b) {
		c := b[i]
		if c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' {
			i++
			continue
		}
		break
	}
	tok := b[start:i]
	// Integers of up to 15 digits without a leading zero are exact
	// doubles that ECMAScript writes digit for digit.
	digits := tok
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if n := len(digits); n > 0 && n <= 15 && (digits[0] != '0' || n == 1 && len(tok) == 1) {
		plain := true
		for _, c := range digits {
			if c < '0' || c > '9' {
				plain = false
				break
			}
		}
		if plain {
			return i, true
		}
	}
	if len(tok) == 0 || tok[0] != '-' && (tok[0] < '0' || tok[0] > '9') {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return 0, false
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil || s != string(tok) {
		return 0, false
	}
	return i, true
}
