package receipts

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

// jcsVectors are RFC 8785's test vectors (testdata/jcs/README.md).
const jcsVectors = "testdata/jcs"

func TestCanonicalizeVectors(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join(jcsVectors, "input", "*.json"))
	if err != nil || len(inputs) < 6 {
		t.Fatalf("RFC 8785 test vectors missing under %s: %d found, %v", jcsVectors, len(inputs), err)
	}
	for _, in := range inputs {
		name := filepath.Base(in)
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(jcsVectors, "output", name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Canonicalize(src)
			if err != nil {
				t.Fatalf("Canonicalize: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
			// Canonical output is a fixed point.
			again, err := Canonicalize(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("not idempotent: %s (%v)", again, err)
			}
		})
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":         ``,
		"not json":      `{"a":`,
		"duplicate key": `{"a":1,"a":2}`,
		"trailing":      `{} {}`,
		"invalid utf8":  "\"\xff\"",
		"nan":           `NaN`,
	} {
		if out, err := Canonicalize([]byte(in)); err == nil {
			t.Errorf("%s: Canonicalize(%q) = %s, want error", name, in, out)
		}
	}
}

type canonCase struct {
	A       string            `json:"a"`
	Omitted string            `json:"omitted,omitempty"`
	Skip    string            `json:"-"`
	Default int               `json:""`
	F       float64           `json:"f"`
	F32     float32           `json:"f32"`
	Bytes   []byte            `json:"bytes"`
	Raw     json.RawMessage   `json:"raw,omitempty"`
	Nil     []string          `json:"nil"`
	M       map[string]any    `json:"m"`
	P       *schemas.Chain    `json:"p"`
	Ptr     *int              `json:"ptr,omitempty"`
	Arr     [2]bool           `json:"arr"`
	S       map[string]string `json:"s,omitempty"`
	private int
}

func TestMarshalCanonicalMatchesJCS(t *testing.T) {
	seven := 7
	cases := map[string]any{
		"receipt":      sampleReceipt(1, 3),
		"receipt zero": &schemas.Receipt{},
		"strings": map[string]string{
			"html":     "<script>&amp;</script>",
			"controls": "\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f",
			"quotes":   `"\/\\`,
			"lsep":     "a\u2028b\u2029c",
			"emoji":    "😂 ö € דּ",
			"invalid":  "bad\xffutf8\xc3",
			"":         "empty key",
		},
		"key order utf16": map[string]int{"\U0001F600": 1, "\uFB33": 2, "a": 3, "\u00e9": 4, "aa": 5, "A": 6},
		"struct": canonCase{
			A: "x", Skip: "s", Default: 3, F: 333333333.33333329, F32: 0.1,
			Bytes: []byte{0, 1, 2, 250}, Raw: json.RawMessage(` { "z" : [1, 2.50, 1e30], "a": "\u0041" } `),
			M: map[string]any{"n": 1e-7, "b": true, "nil": nil, "nested": []any{"x", 2.0}},
			P: &schemas.Chain{ChainID: "c", Seq: 9, PrevHash: schemas.GenesisHash}, Ptr: &seven,
			S: map[string]string{}, private: 1,
		},
		"floats":      []float64{0, math.Copysign(0, -1), 1e21, 1e-7, 123456789012345680000, 5e-324, 1.7976931348623157e308},
		"max safe":    []int64{1 << 53, -(1 << 53), 0},
		"nil pointer": (*schemas.Receipt)(nil),
		"effect": &schemas.Receipt{Effect: &schemas.ToolEffect{EffectID: "e", DocumentHashes: []schemas.DocumentHash{{Pointer: "/a", Hash: "h", SizeBytes: 1}}},
			ReasonCodes: []string{"B", "A"}},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := MarshalCanonical(v)
			if err != nil {
				t.Fatalf("MarshalCanonical: %v", err)
			}
			j, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Canonicalize(j)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("MarshalCanonical differs from Canonicalize(json.Marshal):\ngot  %s\nwant %s", got, want)
			}
		})
	}
}

func TestMarshalCanonicalRejects(t *testing.T) {
	type embedded struct{ schemas.Chain }
	type stringOpt struct {
		N int `json:"n,string"`
	}
	cases := map[string]struct {
		v    any
		want error
	}{
		"uint above 2^53": {[]uint64{1<<53 + 1}, ErrUnsafeInteger},
		"int below -2^53": {map[string]int64{"x": -(1 << 53) - 1}, ErrUnsafeInteger},
		"receipt seq":     {&schemas.Receipt{Chain: schemas.Chain{Seq: math.MaxUint64}}, ErrUnsafeInteger},
		"size_bytes":      {schemas.DocumentHash{SizeBytes: math.MaxInt64}, ErrUnsafeInteger},
		"nan":             {math.NaN(), nil},
		"inf":             {math.Inf(1), nil},
		"embedded":        {embedded{}, nil},
		"string option":   {stringOpt{}, nil},
		"chan":            {make(chan int), nil},
		"int map key":     {map[int]string{1: "a"}, nil},
		"bad raw":         {json.RawMessage(`{"a":1,"a":2}`), nil},
		"cycle":           {cyclic(), nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := MarshalCanonical(c.v)
			if err == nil {
				t.Fatalf("MarshalCanonical = %s, want error", out)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
		})
	}
}

func cyclic() any {
	type node struct {
		Next *node `json:"next"`
	}
	n := &node{}
	n.Next = n
	return n
}

func FuzzCanonicalize(f *testing.F) {
	inputs, _ := filepath.Glob(filepath.Join(jcsVectors, "input", "*.json"))
	for _, in := range inputs {
		if b, err := os.ReadFile(in); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{`{}`, `[]`, `"\ud83d\ude02"`, `1e400`, `{"a":1,"a":2}`, `[[[[`, `-0.0`, `"\u0000"`, ` 1 `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q (input %q)", out, in)
		}
		again, err := Canonicalize(out)
		if err != nil {
			t.Fatalf("canonical output rejected: %v (output %q)", err, out)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent:\n1: %q\n2: %q", out, again)
		}
	})
}

// FuzzMarshalCanonical checks that the one-pass encoder agrees with
// Canonicalize(json.Marshal) on receipts with arbitrary strings.
func FuzzMarshalCanonical(f *testing.F) {
	f.Add("write_file", "/a/b", "<&>\u2028", int64(5), uint64(1))
	f.Add("\xff\xfe", "\x00", "😂", int64(-1), uint64(1<<53))
	f.Fuzz(func(t *testing.T, tool, pointer, code string, size int64, seq uint64) {
		r := sampleReceipt(1, 1)
		r.Tool, r.ToolName = tool, tool
		r.DocumentHashes[0].Pointer = pointer
		r.DocumentHashes[0].SizeBytes = size
		r.ReasonCodes = []string{code, strings.ToUpper(code)}
		r.Chain.Seq = seq
		got, err := MarshalCanonical(r)
		if size > 1<<53 || size < -(1<<53) || seq > 1<<53 {
			if !errors.Is(err, ErrUnsafeInteger) {
				t.Fatalf("want ErrUnsafeInteger, got %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(r)
		want, err := Canonicalize(j)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}

// TestPlainASCII8 checks the eight-byte fast skip of appendJCSString
// against the byte-by-byte rule: every byte value at every position, and
// random words.
func TestPlainASCII8(t *testing.T) {
	plain := func(s string) bool {
		for i := range len(s) {
			if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
				return false
			}
		}
		return true
	}
	check := func(b []byte) {
		if got, want := plainASCII8(string(b)), plain(string(b)); got != want {
			t.Fatalf("plainASCII8(%q) = %v, want %v", b, got, want)
		}
	}
	for pos := range 8 {
		for c := range 256 {
			for _, fill := range []byte{'a', 0x1f, '"', 0xff, 0x21, 0x5d} {
				b := bytes.Repeat([]byte{fill}, 8)
				b[pos] = byte(c)
				check(b)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		b := make([]byte, 8)
		for i := range b {
			b[i] = byte(r.IntN(256))
			if r.IntN(2) == 0 {
				b[i] = byte(0x20 + r.IntN(0x60))
			}
		}
		check(b)
	}
}
