package opa

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// engineDecision is what Talos decides for raw: parse, then DecidePre.
func engineDecision(t testing.TB, e *enforce.Engine, raw []byte) Decision {
	t.Helper()
	pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
	if err != nil {
		t.Fatalf("envelope invalid: %v", err)
	}
	out := e.DecidePre(pc)
	codes := slices.Clone(out.ReasonCodes)
	slices.Sort(codes)
	return Decision{Decision: out.Decision, ReasonCodes: codes}
}

// TestPolicyAgreesWithEngine: on envelopes that exercise each REG 9.2
// rule, alone and together, the Rego policy and enforce.Engine reach the
// same decision with the same reason codes.
func TestPolicyAgreesWithEngine(t *testing.T) {
	ctx := context.Background()
	prod, prodPolicy := deciders(t, enforce.ModeProd)
	dev, devPolicy := deciders(t, enforce.ModeDev)
	digest := prod.Registry().Digest()
	good := benchCall(digest, "hello\n")
	with := func(f func(c *call)) call {
		c := good
		c.args = map[string]any{"path": "bench/report.txt", "content": "hello\n"}
		c.expected = slices.Clone(good.expected)
		f(&c)
		return c
	}
	const b64 = "aGVsbG8K" // "hello\n"
	cases := []struct {
		name  string
		call  call
		dev   bool
		codes []string // the engine's, sorted; nil for an allow without codes
	}{
		{name: "write document, all rules pass", call: good},
		{name: "read tool", call: call{server: "files", tool: "list_dir", args: map[string]any{"path": "/"}, toolClass: "read"}},
		{name: "read tool unsigned", call: call{server: "files", tool: "list_dir", args: map[string]any{}, unsigned: true}},
		{name: "unknown tool", call: call{server: "files", tool: "delete_everything", args: map[string]any{}},
			codes: []string{schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}},
		{name: "unknown server", call: call{server: "nowhere", tool: "write_file", args: map[string]any{}, registryDigest: "sha256:" + strings.Repeat("0", 64)},
			codes: []string{schemas.CodeRegistryVersionMismatch, schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}},
		{name: "unknown tool in dev", dev: true, call: call{server: "files", tool: "delete_everything", args: map[string]any{}},
			codes: []string{schemas.CodeToolUnclassifiedAllowedDev}},
		{name: "declared read, registry write", call: with(func(c *call) { c.toolClass = "read" }),
			codes: []string{schemas.CodeToolClassDeclarationMismatch}},
		{name: "declared write, registry read", call: call{server: "files", tool: "list_dir", args: map[string]any{}, toolClass: "write"},
			codes: []string{schemas.CodeToolClassDeclarationMismatch}},
		{name: "read-only capability, write tool", call: with(func(c *call) { c.readOnly = true }),
			codes: []string{schemas.CodeToolClassMismatch}},
		{name: "read-only capability, read tool", call: call{server: "files", tool: "list_dir", args: map[string]any{}, readOnly: true}},
		{name: "no idempotency key", call: with(func(c *call) { c.idemKey = "" }),
			codes: []string{schemas.CodeIdempotencyKeyRequired}},
		{name: "write tool that is no document op, no key", call: call{server: "limits", tool: "put_not_document", args: map[string]any{}},
			codes: []string{schemas.CodeIdempotencyKeyRequired}},
		{name: "other registry", call: with(func(c *call) { c.registryDigest = "sha256:" + strings.Repeat("ab", 32) }),
			codes: []string{schemas.CodeRegistryVersionMismatch}},
		{name: "content missing", call: with(func(c *call) { delete(c.args, "content"); c.expected = nil }),
			codes: []string{schemas.CodeDocContentPointerInvalid}},
		{name: "content not a string", call: with(func(c *call) { c.args["content"] = []any{"hello"}; c.expected = nil }),
			codes: []string{schemas.CodeDocContentPointerInvalid}},
		{name: "expected hash differs", call: with(func(c *call) { c.expected[0].Hash = hashOf("other") }),
			codes: []string{schemas.CodeDocHashMismatch}},
		{name: "expected hash for an undeclared pointer", call: with(func(c *call) {
			c.expected = append(c.expected, schemas.ExpectedHash{Pointer: "/path", Hash: hashOf("bench/report.txt")})
		}), codes: []string{schemas.CodeDocHashMismatch}},
		{name: "expected hash on a read tool", call: call{server: "files", tool: "list_dir", args: map[string]any{"path": "/"},
			expected: []schemas.ExpectedHash{{Pointer: "/path", Hash: hashOf("/")}}}, codes: []string{schemas.CodeDocHashMismatch}},
		{name: "expected hash of an unreadable document", call: with(func(c *call) { c.args["content"] = 7 }),
			codes: []string{schemas.CodeDocContentPointerInvalid}},
		{name: "base64 document", call: call{server: "files", tool: "upload_blob", args: map[string]any{"data": b64}, idemKey: "k",
			expected: []schemas.ExpectedHash{{Pointer: "/data", Hash: hashOf("hello\n")}}}},
		{name: "base64 with a newline", call: call{server: "files", tool: "upload_blob", args: map[string]any{"data": "aGVs\nbG8K"}, idemKey: "k"},
			codes: []string{schemas.CodeDocEncodingInvalid}},
		{name: "base64 without padding", call: call{server: "files", tool: "upload_blob", args: map[string]any{"data": "aGVsbG8"}, idemKey: "k"},
			codes: []string{schemas.CodeDocEncodingInvalid}},
		{name: "base64 with stray bits", call: call{server: "files", tool: "upload_blob", args: map[string]any{"data": "aGVsbG9="}, idemKey: "k"},
			codes: []string{schemas.CodeDocEncodingInvalid}},
		{name: "base64 url alphabet", call: call{server: "files", tool: "upload_blob", args: map[string]any{"data": "-_-_"}, idemKey: "k"},
			codes: []string{schemas.CodeDocEncodingInvalid}},
		{name: "base64 not decoding to UTF-8", call: call{server: "files", tool: "upload_blob", args: map[string]any{"data": "/wA="}, idemKey: "k",
			expected: []schemas.ExpectedHash{{Pointer: "/data", Hash: "ea5dbf9596d187e9500f23e9a680109475341cf4e81f7e043f7d97152c10772f"}}}},
		{name: "documents within limits", call: call{server: "limits", tool: "put", args: map[string]any{"a": "1234567890", "b": "12345"}, idemKey: "k"}},
		{name: "document over its limit", call: call{server: "limits", tool: "put", args: map[string]any{"a": "12345678901", "b": ""}, idemKey: "k"},
			codes: []string{schemas.CodeDocSizeExceeded}},
		{name: "limit counts bytes, not characters", call: call{server: "limits", tool: "put", args: map[string]any{"a": "éééééé", "b": ""}, idemKey: "k"},
			codes: []string{schemas.CodeDocSizeExceeded}},
		{name: "batch over its limit", call: call{server: "limits", tool: "put", args: map[string]any{"a": "1234567890", "b": "123456"}, idemKey: "k"},
			codes: []string{schemas.CodeDocSizeExceeded}},
		{name: "nested pointers", call: call{server: "limits", tool: "put_nested", idemKey: "k", args: map[string]any{
			"files": []any{map[string]any{"content": 1}, map[string]any{"content": "x"}}, "x/y": map[string]any{"z~w": "y"}}}},
		{name: "nested pointer past the array", call: call{server: "limits", tool: "put_nested", idemKey: "k", args: map[string]any{
			"files": []any{map[string]any{"content": "x"}}, "x/y": map[string]any{"z~w": "y"}}},
			codes: []string{schemas.CodeDocContentPointerInvalid}},
		{name: "array index on an object", call: call{server: "limits", tool: "put_nested", idemKey: "k", args: map[string]any{
			"files": map[string]any{"1": map[string]any{"content": "x"}}, "x/y": map[string]any{"z~w": "y"}}}},
		{name: "array index with a leading zero", call: call{server: "limits", tool: "put_indexed", idemKey: "k", args: map[string]any{
			"files": []any{"a", "b"}}}, codes: []string{schemas.CodeDocContentPointerInvalid}},
		{name: "everything wrong at once", call: call{server: "limits", tool: "put", toolClass: "read", readOnly: true,
			registryDigest: "sha256:" + strings.Repeat("cd", 32), args: map[string]any{"a": strings.Repeat("x", 16), "b": []any{}},
			expected: []schemas.ExpectedHash{{Pointer: "/a", Hash: hashOf("x")}, {Pointer: "/c", Hash: hashOf("x")}}},
			codes: []string{schemas.CodeDocContentPointerInvalid, schemas.CodeDocHashMismatch, schemas.CodeDocSizeExceeded,
				schemas.CodeIdempotencyKeyRequired, schemas.CodeRegistryVersionMismatch, schemas.CodeToolClassDeclarationMismatch,
				schemas.CodeToolClassMismatch}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, p := prod, prodPolicy
			if tc.dev {
				e, p = dev, devPolicy
			}
			raw := envelope(t, tc.call)
			want := engineDecision(t, e, raw)
			if !slices.Equal(want.ReasonCodes, tc.codes) {
				t.Fatalf("the engine's codes are %v, the case expects %v: the case no longer tests what it says", want.ReasonCodes, tc.codes)
			}
			got, err := p.Decide(ctx, raw)
			if err != nil {
				t.Fatal(err)
			}
			if got.Decision != want.Decision || !slices.Equal(got.ReasonCodes, want.ReasonCodes) {
				t.Fatalf("policy %s %v, engine %s %v", got.Decision, got.ReasonCodes, want.Decision, want.ReasonCodes)
			}
		})
	}
}

// TestBenchEnvelope: the benchmark envelope is 2 KB, valid and allowed by
// both deciders, so the benchmarks time a full allow.
func TestBenchEnvelope(t *testing.T) {
	e, p := deciders(t, enforce.ModeProd)
	raw := benchEnvelope(t, e)
	if want := engineDecision(t, e, raw); want.Decision != schemas.DecisionAllow || len(want.ReasonCodes) != 0 {
		t.Fatalf("engine: %+v", want)
	}
	got, err := p.Decide(context.Background(), raw)
	if err != nil || got.Decision != schemas.DecisionAllow || len(got.ReasonCodes) != 0 {
		t.Fatalf("policy: %+v %v", got, err)
	}
}
