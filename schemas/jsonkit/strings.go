package jsonkit

import (
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the string primitives every JSON reader of the project
// builds on: the word-at-a-time byte tests, the escape decoder, the string
// scanner and unescaper, and the number grammar. They read a document as
// bytes or as a string (Text), so a reader that keeps its input as a string
// slices values out of it without copying.

// Text is the two forms a JSON document is read in.
type Text interface{ ~string | ~[]byte }

// Word-at-a-time byte tests (eight bytes in a uint64, little-endian): the
// high bit of a byte of (x - ones*c) &^ x is set, for the lowest such byte
// at least, exactly where a byte of x is below c (c ≤ 0x80). A borrow only
// flags bytes above a true one, so the lowest flagged byte is always right.
const ones, highs = 0x0101010101010101, 0x8080808080808080

// PlainWord is zero when none of the eight bytes of x ends, escapes or
// breaks a JSON string: no '"', no '\\', no control character and no byte
// ≥ 0x80 (those are checked one rune at a time). Otherwise the high bit of
// the lowest such byte is set.
func PlainWord(x uint64) uint64 {
	return ((x-ones*0x20)&^x | zeroByte(x^(ones*'"')) | zeroByte(x^(ones*'\\')) | x) & highs
}

// QuoteWord is zero when no byte of x is '"' or '\\'; otherwise the high
// bit of the lowest such byte is set.
func QuoteWord(x uint64) uint64 {
	return (zeroByte(x^(ones*'"')) | zeroByte(x^(ones*'\\'))) & highs
}

// zeroByte has the high bit of some byte set if a byte of y is zero.
func zeroByte(y uint64) uint64 { return (y - ones) &^ y }

// Word is the eight bytes of s at i, little-endian; i+8 MUST be ≤ len(s).
func Word[T Text](s T, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

// PlainRun is the index of the first byte at or after i in s that PlainWord
// flags ('"', '\\', a control character or a byte ≥ 0x80), or len(s).
func PlainRun[T Text](s T, i int) int {
	for ; i+8 <= len(s); i += 8 {
		if w := PlainWord(Word(s, i)); w != 0 {
			return i + bits.TrailingZeros64(w)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return i
		}
	}
	return i
}

// QuoteRun is the index of the first '"' or '\\' at or after i in s, or
// len(s).
func QuoteRun[T Text](s T, i int) int {
	for ; i+8 <= len(s); i += 8 {
		if w := QuoteWord(Word(s, i)); w != 0 {
			return i + bits.TrailingZeros64(w)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			return i
		}
	}
	return i
}

// Hex4 is the value of the four hex digits (either case) at s[i:], or -1.
func Hex4[T Text](s T, i int) rune {
	if i < 0 || i+4 > len(s) {
		return -1
	}
	var r rune
	for _, c := range [4]byte{s[i], s[i+1], s[i+2], s[i+3]} {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return -1
		}
	}
	return r
}

// DecodeEscape decodes the escape sequence at s[i] ('\\'): the character
// it stands for and its length (2, 6, or 12 for a UTF-16 surrogate pair).
// n is 0 for anything RFC 8259 does not allow and for an unpaired surrogate
// (I-JSON, RFC 7493 §2.1, which RFC 8785 inherits).
func DecodeEscape[T Text](s T, i int) (r rune, n int) {
	if i+1 >= len(s) {
		return 0, 0
	}
	switch c := s[i+1]; c {
	case '"', '\\', '/':
		return rune(c), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
	default:
		return 0, 0
	}
	r = Hex4(s, i+2)
	switch {
	case r < 0:
		return 0, 0
	case !utf16.IsSurrogate(r):
		return r, 6
	case r >= 0xDC00 || i+12 > len(s) || s[i+6] != '\\' || s[i+7] != 'u':
		return 0, 0 // a low surrogate first, or a high one alone
	}
	lo := Hex4(s, i+8)
	if lo < 0xDC00 || lo > 0xDFFF {
		return 0, 0
	}
	return utf16.DecodeRune(r, lo), 12
}

// ScanString checks the JSON string that starts at s[i] ('"') and returns
// the index just past its closing quote and whether it holds an escape. ok
// is false unless the string is valid RFC 8259 and I-JSON: valid UTF-8, no
// raw control character, no escape outside RFC 8259's set, no unpaired
// surrogate escape.
func ScanString[T Text](s T, i int) (end int, escaped, ok bool) {
	if i >= len(s) || s[i] != '"' {
		return 0, false, false
	}
	for i++; ; {
		if i = PlainRun(s, i); i >= len(s) {
			return 0, escaped, false
		}
		switch c := s[i]; {
		case c == '"':
			return i + 1, escaped, true
		case c == '\\':
			_, n := DecodeEscape(s, i)
			if n == 0 {
				return 0, true, false
			}
			escaped = true
			i += n
		case c < 0x20:
			return 0, escaped, false
		default: // not ASCII
			r, n := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
			if r == utf8.RuneError && n == 1 {
				return 0, escaped, false
			}
			i += n
		}
	}
}

// AppendUnescaped appends to dst the text of the contents of a JSON string
// (between its quotes) that ScanString accepted, or that is canonical.
func AppendUnescaped[T Text](dst []byte, s T) []byte {
	for i := 0; i < len(s); {
		j := QuoteRun(s, i)
		dst = append(dst, s[i:j]...)
		if j >= len(s) {
			break
		}
		r, n := DecodeEscape(s, j) // s[j] is '\\': a closed string holds no '"'
		dst = utf8.AppendRune(dst, r)
		i = j + n
	}
	return dst
}

// Unescape is the text of the contents of a JSON string that ScanString
// accepted, or that is canonical.
func Unescape[T Text](s T) string {
	return string(AppendUnescaped(make([]byte, 0, len(s)), s))
}

// NumberEnd is the index just past the JSON number (RFC 8259 §6) that
// starts at s[i], or -1 if none starts there.
func NumberEnd[T Text](s T, i int) int {
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = digitsEnd(s, i+1)
	default:
		return -1
	}
	if i < len(s) && s[i] == '.' {
		d := i + 1
		if i = digitsEnd(s, d); i == d {
			return -1
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d := i
		if i = digitsEnd(s, d); i == d {
			return -1
		}
	}
	return i
}

func digitsEnd[T Text](s T, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
