package jsonkit_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
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
			got, err := jsonkit.Canonicalize(src)
			if err != nil {
				t.Fatalf("Canonicalize: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
			// Canonical output is a fixed point.
			again, err := jsonkit.Canonicalize(got)
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
		if out, err := jsonkit.Canonicalize([]byte(in)); err == nil {
			t.Errorf("%s: jsonkit.Canonicalize(%q) = %s, want error", name, in, out)
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
			got, err := jsonkit.MarshalCanonical(v)
			if err != nil {
				t.Fatalf("MarshalCanonical: %v", err)
			}
			j, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want, err := jsonkit.Canonicalize(j)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("MarshalCanonical differs from jsonkit.Canonicalize(json.Marshal):\ngot  %s\nwant %s", got, want)
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
		"uint above 2^53": {[]uint64{1<<53 + 1}, jsonkit.ErrUnsafeInteger},
		"int below -2^53": {map[string]int64{"x": -(1 << 53) - 1}, jsonkit.ErrUnsafeInteger},
		"receipt seq":     {&schemas.Receipt{Chain: schemas.Chain{Seq: math.MaxUint64}}, jsonkit.ErrUnsafeInteger},
		"size_bytes":      {schemas.DocumentHash{SizeBytes: math.MaxInt64}, jsonkit.ErrUnsafeInteger},
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
			out, err := jsonkit.MarshalCanonical(c.v)
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
		out, err := jsonkit.Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q (input %q)", out, in)
		}
		again, err := jsonkit.Canonicalize(out)
		if err != nil {
			t.Fatalf("canonical output rejected: %v (output %q)", err, out)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent:\n1: %q\n2: %q", out, again)
		}
	})
}

// FuzzMarshalCanonical checks that the one-pass encoder agrees with
// jsonkit.Canonicalize(json.Marshal) on receipts with arbitrary strings.
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
		got, err := jsonkit.MarshalCanonical(r)
		if size > 1<<53 || size < -(1<<53) || seq > 1<<53 {
			if !errors.Is(err, jsonkit.ErrUnsafeInteger) {
				t.Fatalf("want jsonkit.ErrUnsafeInteger, got %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(r)
		want, err := jsonkit.Canonicalize(j)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}

func hexOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// sampleReceipt is a realistic decision receipt with docs document hashes.
func sampleReceipt(i, docs int) *schemas.Receipt {
	r := &schemas.Receipt{
		EventType: schemas.KindDecision, Tool: "write_file", CapabilityHash: hexOf("cap"),
		RequestHash: hexOf(fmt.Sprint("req", i)), AgentID: "agent-7", ToolID: "fs/write_file",
		Timestamp: "2025-03-01T12:00:00.123Z", ResultCode: schemas.DecisionAllow, EnvelopeHash: hexOf(fmt.Sprint("env", i)),
		ToolCallID: fmt.Sprintf("0190f5d2-7b3a-7c4e-8a1b-%012d", i), TraceID: "0190f5d2-7b3a-7c4e-8a1b-aaaaaaaaaaaa",
		CorrelationID: "q2Xo9Fh3bTz1c5Vd8KpL0w", SessionID: "sess-42", EPID: "gw-1", ServerID: "fs", ToolName: "write_file",
		Phase: schemas.PhasePre, Mode: "prod", Decision: schemas.DecisionAllow, ReasonCodes: []string{},
		ToolClass: schemas.ClassWrite, RegistryDigest: "sha256:" + hexOf("registry"), ContentHashAlg: schemas.ContentHashAlg,
	}
	for d := range docs {
		r.DocumentHashes = append(r.DocumentHashes, schemas.DocumentHash{Pointer: fmt.Sprintf("/files/%d/content", d),
			Hash: hexOf(fmt.Sprint("doc", i, d)), SizeBytes: int64(1000 * (d + 1))})
		r.BatchTotalBytes += int64(1000 * (d + 1))
	}
	return r
}

// A Canonical is appended as it is, where a json.RawMessage of the same
// bytes is canonicalized; encoding/json treats it as a json.RawMessage.
func TestCanonicalAppendedAsItIs(t *testing.T) {
	type payloads struct {
		Canon jsonkit.Canonical `json:"canon,omitempty"`
		Raw   json.RawMessage   `json:"raw,omitempty"`
		None  jsonkit.Canonical `json:"none,omitempty"`
	}
	in, err := jsonkit.CanonicalTree(map[string]any{"z": []any{json.Number("1"), "é"}, "a": nil})
	if err != nil {
		t.Fatal(err)
	}
	// Bytes no one canonicalized show which path each field took.
	loose := ` { "b" : 1 } `
	for _, tc := range []struct {
		v    payloads
		want string
	}{
		{payloads{Canon: in, Raw: json.RawMessage(in)}, `{"canon":` + string(in) + `,"raw":` + string(in) + `}`},
		{payloads{Canon: jsonkit.Canonical(loose), Raw: json.RawMessage(loose)}, `{"canon":` + loose + `,"raw":{"b":1}}`},
	} {
		got, err := jsonkit.MarshalCanonical(tc.v)
		if err != nil || string(got) != tc.want {
			t.Errorf("MarshalCanonical = %s, %v; want %s", got, err, tc.want)
		}
	}
	var back payloads
	if err := json.Unmarshal([]byte(`{"canon":{"b":[1, 2]},"raw":3}`), &back); err != nil || string(back.Canon) != `{"b":[1, 2]}` || back.None != nil {
		t.Fatalf("json.Unmarshal: %+v, %v", back, err)
	}
	if got, err := json.Marshal(payloads{Canon: in}); err != nil || string(got) != `{"canon":`+string(in)+`}` {
		t.Fatalf("json.Marshal = %s, %v", got, err)
	}
	if got, err := jsonkit.MarshalCanonical(struct{ C jsonkit.Canonical }{}); err != nil || string(got) != `{"C":null}` {
		t.Fatalf("nil Canonical = %s, %v", got, err)
	}
}
