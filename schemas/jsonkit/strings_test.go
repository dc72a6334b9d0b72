package jsonkit

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestWordTests checks PlainRun and QuoteRun (the eight-byte skips every
// reader uses) against the byte-by-byte rule: every byte value at every
// position of a word, in both forms of a document, and random words.
func TestWordTests(t *testing.T) {
	firstPlain := func(b []byte) int {
		for i, c := range b {
			if c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
				return i
			}
		}
		return len(b)
	}
	firstQuote := func(b []byte) int {
		for i, c := range b {
			if c == '"' || c == '\\' {
				return i
			}
		}
		return len(b)
	}
	check := func(b []byte) {
		if got, want := PlainRun(b, 0), firstPlain(b); got != want || PlainRun(string(b), 0) != want {
			t.Fatalf("PlainRun(%q) = %d, want %d", b, got, want)
		}
		if got, want := QuoteRun(b, 0), firstQuote(b); got != want || QuoteRun(string(b), 0) != want {
			t.Fatalf("QuoteRun(%q) = %d, want %d", b, got, want)
		}
	}
	for pos := range 8 {
		for c := range 256 {
			for _, fill := range []byte{'a', 0x1f, '"', 0xff, 0x21, 0x5d, '\\'} {
				b := bytes.Repeat([]byte{fill}, 11)
				b[pos] = byte(c)
				check(b)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		b := make([]byte, 8+r.IntN(9))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		check(b)
	}
}

// TestScanString: ScanString accepts exactly the strings encoding/json
// decodes that are valid UTF-8 without unpaired surrogate escapes, and
// Unescape gives what encoding/json decodes.
func TestScanString(t *testing.T) {
	cases := []struct {
		in string
		ok bool
	}{
		{`"abc"`, true}, {`"a\"b"`, true}, {`"\u00e9\n\/"`, true}, {`"\ud83d\ude00"`, true}, {`"\uD83D\uDE00x"`, true},
		{`"\ud83d"`, false}, {`"\ude00"`, false}, {`"\ud83d\u0041"`, false}, {`"\x"`, false}, {`"\u12"`, false},
		{"\"\x01\"", false}, {"\"\xff\"", false}, {`"abc`, false}, {`"abcdefghijklmnop\`, false}, {"\"héllo wörld\"", true},
	}
	for _, tc := range cases {
		end, _, ok := ScanString(tc.in, 0)
		if ok != tc.ok || ok && end != len(tc.in) {
			t.Errorf("ScanString(%s) = %d, %v; want ok %v", tc.in, end, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		var want string
		if err := json.Unmarshal([]byte(tc.in), &want); err != nil {
			t.Fatal(err)
		}
		if got := Unescape(tc.in[1 : len(tc.in)-1]); got != want {
			t.Errorf("Unescape(%s) = %q, want %q", tc.in, got, want)
		}
	}
}

// TestNumberEnd: NumberEnd takes exactly RFC 8259's number grammar.
func TestNumberEnd(t *testing.T) {
	for _, s := range []string{"0", "-0", "12", "1.5", "-1.5e3", "1E+2", "0.0e-0"} {
		if NumberEnd(s, 0) != len(s) {
			t.Errorf("NumberEnd(%q) = %d", s, NumberEnd(s, 0))
		}
	}
	for _, s := range []string{"-", "+1", ".5", "1.", "1e", "1e+", "x"} {
		if end := NumberEnd(s, 0); end == len(s) {
			t.Errorf("NumberEnd(%q) accepted it", s)
		}
	}
	if NumberEnd("01", 0) != 1 {
		t.Error("NumberEnd(01) did not stop after the 0")
	}
}

// PlainRun stops at the first quote, backslash, control character or
// non-ASCII byte wherever it is in a word, and nowhere else.
func TestPlainRunOffsets(t *testing.T) {
	for b := 0; b < 256; b++ {
		special := b < 0x20 || b == '"' || b == '\\' || b >= 0x80
		for pos := 0; pos < 20; pos++ {
			for start := 0; start < 3; start++ {
				s := []byte(strings.Repeat("a~ ZZ!#[", 3))
				s[pos] = byte(b)
				want := len(s)
				if special && pos >= start {
					want = pos
				}
				if got := PlainRun(string(s), start); got != want {
					t.Fatalf("byte %#x at %d from %d: stopped at %d, want %d", b, pos, start, got, want)
				}
			}
		}
	}
}
