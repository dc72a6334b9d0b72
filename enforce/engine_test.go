package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

const (
	hashHello  = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03" // "hello\n"
	hashCRLF   = "18745f36a05e29072709042d6062ce54f1b08ff36c27ba80c39f81fb010c8ce2" // "a\r\nb"
	hashFF00   = "ea5dbf9596d187e9500f23e9a680109475341cf4e81f7e043f7d97152c10772f" // 0xff 0x00
	hashEmpty  = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	hashReqMin = "79b09ee5935b792efb3a0e58afe2b0f164028763f264f612b0f441a72bef439b" // JCS of the base request
	testCallID = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e"
	fixedID    = "0190f5b2-7c1e-7a3b-8d4e-000000000001"
)

// limitsManifest is a write/read document tool pair with tiny limits, and
// one tool that leaves every size field at its default.
const limitsManifest = `{
  "schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "limits",
  "tools": [
    {"tool_name": "put", "tool_class": "write", "is_document_op": true,
     "document_spec": {"content_encoding": "utf8", "write_content_pointers": ["/a", "/b"],
                       "max_write_bytes": 10, "max_batch_bytes": 15}},
    {"tool_name": "get", "tool_class": "read", "is_document_op": true,
     "document_spec": {"content_encoding": "utf8", "read_content_pointers": ["/content/0/text", "/content/1/text"],
                       "max_read_bytes": 10, "max_batch_bytes": 15}},
    {"tool_name": "put_default", "tool_class": "write", "is_document_op": true,
     "document_spec": {"content_encoding": "utf8", "write_content_pointers": ["/a"]}},
    {"tool_name": "get_default", "tool_class": "read", "is_document_op": true,
     "document_spec": {"content_encoding": "base64", "read_content_pointers": ["/a"]}}
  ]
}`

func testRegistry(t testing.TB) *Registry {
	t.Helper()
	dir, err := os.ReadDir("testdata/registry")
	if err != nil {
		t.Fatal(err)
	}
	var ms [][]byte
	for _, f := range dir {
		b, err := os.ReadFile(filepath.Join("testdata/registry", f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, b)
	}
	r, err := NewRegistry(append(ms, []byte(limitsManifest))...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func testEngine(t testing.TB, mode Mode) *Engine {
	t.Helper()
	e, err := New(Config{Mode: mode, Registry: testRegistry(t), NewEffectID: func() string { return fixedID }})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// envelope builds a valid envelope for server/tool with the given arguments.
func envelope(phase, server, tool string, args map[string]any) map[string]any {
	return map[string]any{
		"schema_version": "talos.tool_call.v1", "phase": phase, "tool_call_id": testCallID,
		"trace_id": "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "correlation_id": "q3V2bH7pR9sT1uW4xY6zAb",
		"session_id": "s1", "ep_id": "gw-1", "server_id": server, "tool_name": tool, "transport": "mcp",
		"actor":     map[string]any{"kind": "agent", "agent_id": "agent-1"},
		"request":   map[string]any{"name": tool, "arguments": args},
		"issued_at": "2026-03-04T05:06:06.123Z", // just before t0: within the replay window
	}
}

func parse(t testing.TB, env map[string]any) *schemas.ParsedCall {
	t.Helper()
	raw, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := schemas.ParseToolCall(raw, schemas.Limits{MaxBytes: 16 << 20})
	if err != nil {
		t.Fatalf("test envelope invalid: %v", err)
	}
	return pc
}

func writeFile(content any) map[string]any {
	env := envelope("pre", "files", "write_file", map[string]any{"path": "/tmp/x", "content": content})
	env["idempotency_key"] = "idem-1"
	return env
}

func TestDecidePreTable(t *testing.T) {
	e := testEngine(t, ModeProd)
	dev := testEngine(t, ModeDev)
	cases := []struct {
		name     string
		engine   *Engine
		env      map[string]any
		decision string
		codes    []string
		class    string
		hashes   []schemas.DocumentHash
	}{
		{name: "write doc allowed", env: writeFile("hello\n"), decision: "allow", codes: []string{}, class: "write",
			hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: hashHello, SizeBytes: 6}}},
		{name: "utf8 exact bytes, no newline normalisation", env: writeFile("a\r\nb"), decision: "allow", codes: []string{}, class: "write",
			hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: hashCRLF, SizeBytes: 4}}},
		{name: "empty document", env: writeFile(""), decision: "allow", codes: []string{}, class: "write",
			hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: hashEmpty, SizeBytes: 0}}},
		{name: "read tool, no idempotency key needed", env: envelope("pre", "files", "list_dir", map[string]any{"path": "/"}),
			decision: "allow", codes: []string{}, class: "read"},
		{name: "request_hash matches", env: with(writeFile("hi"), "request_hash", hashReqMin), decision: "allow", codes: []string{}, class: "write",
			hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", SizeBytes: 2}}},
		{name: "request_hash mismatch", env: with(writeFile("hi"), "request_hash", strings.Repeat("0", 64)), decision: "deny",
			codes: []string{"REQUEST_HASH_MISMATCH"}, class: "write"},
		{name: "registry digest mismatch", env: with(writeFile("hi"), "registry_digest", "sha256:"+strings.Repeat("0", 64)), decision: "deny",
			codes: []string{"REGISTRY_VERSION_MISMATCH"}, class: "write"},
		{name: "unknown tool prod", env: envelope("pre", "files", "delete_file", map[string]any{}), decision: "deny",
			codes: []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}},
		{name: "unknown server prod", env: envelope("pre", "nope", "write_file", map[string]any{}), decision: "deny",
			codes: []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}},
		{name: "unauthenticated report prod", env: envelope("pre", "unauthenticated", "initialize", map[string]any{"reason": "missing_token"}),
			decision: "deny", codes: []string{"DENY_UNAUTHENTICATED"}},
		{name: "unauthenticated report dev is denied too", engine: dev, env: envelope("pre", "unauthenticated", "tools/call", map[string]any{}),
			decision: "deny", codes: []string{"DENY_UNAUTHENTICATED"}},
		{name: "unknown tool dev", engine: dev, env: with(envelope("pre", "files", "delete_file", map[string]any{}), "tool_class", "read"),
			decision: "allow", codes: []string{"TOOL_UNCLASSIFIED_ALLOWED_DEV"}},
		{name: "known tool in dev is enforced", engine: dev, env: envelope("pre", "files", "write_file", map[string]any{"content": "x"}),
			decision: "deny", codes: []string{"IDEMPOTENCY_KEY_REQUIRED"}, class: "write",
			hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881", SizeBytes: 1}}},
		{name: "read-only capability on a write tool", env: with(writeFile("hi"), "capability", map[string]any{"capability_id": "c1", "constraints": map[string]any{"read_only": true}}),
			decision: "deny", codes: []string{"TOOL_CLASS_MISMATCH"}, class: "write", hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", SizeBytes: 2}}},
		{name: "read-only link in a delegation chain", env: with(writeFile("hi"), "capability", []any{map[string]any{"constraints": map[string]any{}}, map[string]any{"constraints": map[string]any{"read_only": true}}}),
			decision: "deny", codes: []string{"TOOL_CLASS_MISMATCH"}, class: "write", hashes: []schemas.DocumentHash{{Pointer: "/content", Hash: "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", SizeBytes: 2}}},
		{name: "read-only capability on a read tool", env: with(envelope("pre", "files", "list_dir", map[string]any{"path": "/"}), "capability", map[string]any{"constraints": map[string]any{"read_only": true}}),
			decision: "allow", codes: []string{}, class: "read"},
		{name: "declared class differs", env: with(writeFile("hi"), "tool_class", "read"), decision: "deny",
			codes: []string{"TOOL_CLASS_DECLARATION_MISMATCH"}, class: "write"},
		{name: "declared class agrees", env: with(writeFile("hi"), "tool_class", "write"), decision: "allow", codes: []string{}, class: "write"},
		{name: "write without idempotency key", env: without(writeFile("hi"), "idempotency_key"), decision: "deny",
			codes: []string{"IDEMPOTENCY_KEY_REQUIRED"}, class: "write"},
		{name: "action read-only", env: envelope("pre", "assistant", "github", map[string]any{"action": "list_prs", "repo": "x"}),
			decision: "allow", codes: []string{}, class: "read"},
		{name: "action mutating needs key", env: envelope("pre", "assistant", "github", map[string]any{"action": "create_issue"}),
			decision: "deny", codes: []string{"IDEMPOTENCY_KEY_REQUIRED"}, class: "write"},
		{name: "action mutating with key", env: with(envelope("pre", "assistant", "github", map[string]any{"action": "create_issue"}), "idempotency_key", "k"),
			decision: "allow", codes: []string{}, class: "write"},
		{name: "action declared read but is write", env: with(with(envelope("pre", "assistant", "github", map[string]any{"action": "trigger_workflow"}), "idempotency_key", "k"), "tool_class", "read"),
			decision: "deny", codes: []string{"TOOL_CLASS_DECLARATION_MISMATCH"}, class: "write"},
		{name: "action missing", env: envelope("pre", "assistant", "github", map[string]any{"repo": "x"}),
			decision: "deny", codes: []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}},
		{name: "action unknown", env: envelope("pre", "assistant", "github", map[string]any{"action": "delete_repo"}),
			decision: "deny", codes: []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}},
		{name: "action not a string", env: envelope("pre", "assistant", "github", map[string]any{"action": []any{"list_prs"}}),
			decision: "deny", codes: []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}},
		{name: "action unknown dev", engine: dev, env: envelope("pre", "assistant", "github", map[string]any{"action": "delete_repo"}),
			decision: "allow", codes: []string{"TOOL_UNCLASSIFIED_ALLOWED_DEV"}},
		{name: "pointer missing", env: with(envelope("pre", "files", "write_file", map[string]any{"path": "/x"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_CONTENT_POINTER_INVALID"}, class: "write"},
		{name: "pointer not a string", env: writeFile(map[string]any{"text": "hi"}), decision: "deny",
			codes: []string{"DOC_CONTENT_POINTER_INVALID"}, class: "write"},
		{name: "pointer null", env: writeFile(nil), decision: "deny", codes: []string{"DOC_CONTENT_POINTER_INVALID"}, class: "write"},
		{name: "base64 decoded", env: with(envelope("pre", "files", "upload_blob", map[string]any{"data": "aGVsbG8K"}), "idempotency_key", "k"),
			decision: "allow", codes: []string{}, class: "write", hashes: []schemas.DocumentHash{{Pointer: "/data", Hash: hashHello, SizeBytes: 6}}},
		{name: "base64 binary", env: with(envelope("pre", "files", "upload_blob", map[string]any{"data": "/wA="}), "idempotency_key", "k"),
			decision: "allow", codes: []string{}, class: "write", hashes: []schemas.DocumentHash{{Pointer: "/data", Hash: hashFF00, SizeBytes: 2}}},
		{name: "base64 garbage", env: with(envelope("pre", "files", "upload_blob", map[string]any{"data": "not base64!"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_ENCODING_INVALID"}, class: "write"},
		{name: "base64 unpadded", env: with(envelope("pre", "files", "upload_blob", map[string]any{"data": "/wA"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_ENCODING_INVALID"}, class: "write"},
		{name: "base64 non-canonical padding bits", env: with(envelope("pre", "files", "upload_blob", map[string]any{"data": "/wB="}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_ENCODING_INVALID"}, class: "write"},
		{name: "base64 with line break", env: with(envelope("pre", "files", "upload_blob", map[string]any{"data": "aGVs\nbG8K"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_ENCODING_INVALID"}, class: "write"},
		{name: "item at limit", env: with(envelope("pre", "limits", "put", map[string]any{"a": strings.Repeat("x", 10), "b": "y"}), "idempotency_key", "k"),
			decision: "allow", codes: []string{}, class: "write"},
		{name: "item over limit", env: with(envelope("pre", "limits", "put", map[string]any{"a": strings.Repeat("x", 11), "b": "y"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_SIZE_EXCEEDED"}, class: "write"},
		{name: "item limit counts bytes not runes", env: with(envelope("pre", "limits", "put", map[string]any{"a": strings.Repeat("é", 6), "b": "y"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_SIZE_EXCEEDED"}, class: "write"},
		{name: "batch at limit", env: with(envelope("pre", "limits", "put", map[string]any{"a": strings.Repeat("x", 10), "b": "12345"}), "idempotency_key", "k"),
			decision: "allow", codes: []string{}, class: "write"},
		{name: "batch over limit", env: with(envelope("pre", "limits", "put", map[string]any{"a": strings.Repeat("x", 10), "b": "123456"}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_SIZE_EXCEEDED"}, class: "write"},
		{name: "default write limit exactly", env: with(envelope("pre", "limits", "put_default", map[string]any{"a": strings.Repeat("x", 5242880)}), "idempotency_key", "k"),
			decision: "allow", codes: []string{}, class: "write"},
		{name: "default write limit +1", env: with(envelope("pre", "limits", "put_default", map[string]any{"a": strings.Repeat("x", 5242881)}), "idempotency_key", "k"),
			decision: "deny", codes: []string{"DOC_SIZE_EXCEEDED"}, class: "write"},
		{name: "expected hash matches", env: with(writeFile("hello\n"), "expected_document_hashes", []any{map[string]any{"pointer": "/content", "hash": hashHello}}),
			decision: "allow", codes: []string{}, class: "write"},
		{name: "expected hash differs", env: with(writeFile("hello\n"), "expected_document_hashes", []any{map[string]any{"pointer": "/content", "hash": hashEmpty}}),
			decision: "deny", codes: []string{"DOC_HASH_MISMATCH"}, class: "write"},
		{name: "expected hash for undeclared pointer", env: with(writeFile("hello\n"), "expected_document_hashes", []any{map[string]any{"pointer": "/path", "hash": hashHello}}),
			decision: "deny", codes: []string{"DOC_HASH_MISMATCH"}, class: "write"},
		{name: "expected hash on a non-document tool", env: with(envelope("pre", "files", "list_dir", map[string]any{}), "expected_document_hashes", []any{map[string]any{"pointer": "/content", "hash": hashHello}}),
			decision: "deny", codes: []string{"DOC_HASH_MISMATCH"}, class: "read"},
		{name: "every reason listed", env: with(with(without(envelope("pre", "limits", "put", map[string]any{"a": strings.Repeat("x", 11), "b": 7}), "idempotency_key"),
			"tool_class", "read"), "request_hash", strings.Repeat("0", 64)),
			decision: "deny", class: "write",
			codes: []string{"REQUEST_HASH_MISMATCH", "TOOL_CLASS_DECLARATION_MISMATCH", "IDEMPOTENCY_KEY_REQUIRED", "DOC_SIZE_EXCEEDED", "DOC_CONTENT_POINTER_INVALID"}},
		{name: "unknown tool and stale registry", env: with(envelope("pre", "files", "nope", map[string]any{}), "registry_digest", "sha256:"+strings.Repeat("1", 64)),
			decision: "deny", codes: []string{"REGISTRY_VERSION_MISMATCH", "TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}},
		{name: "codes deduplicated", env: with(with(envelope("pre", "limits", "put", map[string]any{}), "idempotency_key", "k"), "expected_document_hashes",
			[]any{map[string]any{"pointer": "/x", "hash": hashHello}, map[string]any{"pointer": "/y", "hash": hashHello}}),
			decision: "deny", codes: []string{"DOC_CONTENT_POINTER_INVALID", "DOC_HASH_MISMATCH"}, class: "write"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := tc.engine
			if eng == nil {
				eng = e
			}
			out := eng.DecidePre(parse(t, tc.env))
			if out.Decision != tc.decision || !reflect.DeepEqual(out.ReasonCodes, tc.codes) {
				t.Fatalf("got %s %v (%q), want %s %v", out.Decision, out.ReasonCodes, out.Details, tc.decision, tc.codes)
			}
			if out.ToolClass != tc.class {
				t.Errorf("class %q, want %q", out.ToolClass, tc.class)
			}
			if tc.hashes != nil && !reflect.DeepEqual(out.DocumentHashes, tc.hashes) {
				t.Errorf("hashes %+v, want %+v", out.DocumentHashes, tc.hashes)
			}
			if out.DocumentHashes == nil || out.ReasonCodes == nil {
				t.Error("nil slices in outcome")
			}
			if len(out.RequestHash) != 64 {
				t.Errorf("request hash %q", out.RequestHash)
			}
			var sum int64
			for _, h := range out.DocumentHashes {
				sum += h.SizeBytes
			}
			if sum != out.BatchTotalBytes {
				t.Errorf("batch_total_bytes %d, sum %d", out.BatchTotalBytes, sum)
			}
			if len(out.ReasonCodes) > 0 && len(out.Details) == 0 {
				t.Error("codes without details")
			}
			for _, d := range out.Details {
				if strings.Contains(d, "hello") || strings.Contains(d, "xxxxxxxxxx") || strings.Contains(d, "delete_repo") {
					t.Errorf("detail echoes content: %q", d)
				}
			}
		})
	}
}

func with(env map[string]any, k string, v any) map[string]any {
	env[k] = v
	return env
}

func without(env map[string]any, k string) map[string]any {
	delete(env, k)
	return env
}

func TestRequestHashIsJCS(t *testing.T) {
	// Key order and whitespace in the input do not change the request hash.
	raw := `{"schema_version":"talos.tool_call.v1","phase":"pre","tool_call_id":"` + testCallID + `",
	  "trace_id":"4bf92f35-77b3-4da6-a3ce-929d0e0e4736","correlation_id":"q3V2bH7pR9sT1uW4xY6zAb","session_id":"s",
	  "ep_id":"gw","server_id":"files","tool_name":"write_file","transport":"mcp","actor":{"kind":"agent"},
	  "request" : { "name" : "write_file", "arguments" : { "path":"/tmp/x" , "content":"hi" } },
	  "issued_at":"2025-01-15T10:20:30Z","idempotency_key":"k","request_hash":"` + hashReqMin + `"}`
	pc, err := schemas.ParseToolCall([]byte(raw), schemas.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	out := testEngine(t, ModeProd).DecidePre(pc)
	if out.RequestHash != hashReqMin || out.Decision != "allow" {
		t.Fatalf("got %s %v %s", out.Decision, out.ReasonCodes, out.RequestHash)
	}
}

func readResult(server, tool string, result map[string]any) map[string]any {
	env := envelope("post", server, tool, map[string]any{"path": "/x"})
	if result != nil {
		env["result"] = result
	}
	return env
}

func text(parts ...string) map[string]any {
	var content []any
	for _, p := range parts {
		content = append(content, map[string]any{"type": "text", "text": p})
	}
	return map[string]any{"content": content}
}

func TestDecidePostTable(t *testing.T) {
	e := testEngine(t, ModeProd)
	cases := []struct {
		name     string
		env      map[string]any
		decision string
		codes    []string
		hashes   []schemas.DocumentHash
	}{
		{"read doc hashed", readResult("files", "read_file", text("hello\n")), "allow", []string{},
			[]schemas.DocumentHash{{Pointer: "/content/0/text", Hash: hashHello, SizeBytes: 6}}},
		{"base64 read doc", readResult("github", "get-file", map[string]any{"content": []any{}, "structuredContent": map[string]any{"content": "/wA="}}), "allow", []string{},
			[]schemas.DocumentHash{{Pointer: "/structuredContent/content", Hash: hashFF00, SizeBytes: 2}}},
		{"read pointer missing", readResult("files", "read_file", map[string]any{"content": []any{}}), "deny", []string{"DOC_CONTENT_POINTER_INVALID"}, nil},
		{"read bad base64", readResult("github", "get-file", map[string]any{"structuredContent": map[string]any{"content": "%%"}}), "deny", []string{"DOC_ENCODING_INVALID"}, nil},
		{"no result at all", readResult("files", "read_file", nil), "deny", []string{"DOC_CONTENT_POINTER_INVALID"}, nil},
		{"tool error result skips documents", readResult("files", "read_file", map[string]any{"content": []any{}, "isError": true}), "allow", []string{}, []schemas.DocumentHash{}},
		{"failed call skips documents", with(readResult("files", "read_file", nil), "ok", false), "allow", []string{}, []schemas.DocumentHash{}},
		{"read at limits", readResult("limits", "get", text(strings.Repeat("x", 10), "12345")), "allow", []string{}, nil},
		{"read item over limit", readResult("limits", "get", text(strings.Repeat("x", 11), "1")), "deny", []string{"DOC_SIZE_EXCEEDED"}, nil},
		{"read batch over limit", readResult("limits", "get", text(strings.Repeat("x", 10), "123456")), "deny", []string{"DOC_SIZE_EXCEEDED"}, nil},
		{"unknown tool post", readResult("files", "nope", text("x")), "deny", []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}, []schemas.DocumentHash{}},
		{"write tool post has no read docs", with(readResult("files", "write_file", text("x")), "idempotency_key", "k"), "allow", []string{}, []schemas.DocumentHash{}},
		{"action read post", readResult("assistant", "github", text("x")), "deny", []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc := parse(t, tc.env)
			out := e.DecidePost(pc)
			if out.Decision != tc.decision || !reflect.DeepEqual(out.ReasonCodes, tc.codes) {
				t.Fatalf("got %s %v (%q), want %s %v", out.Decision, out.ReasonCodes, out.Details, tc.decision, tc.codes)
			}
			if tc.hashes != nil && !reflect.DeepEqual(out.DocumentHashes, tc.hashes) {
				t.Errorf("hashes %+v, want %+v", out.DocumentHashes, tc.hashes)
			}
			if _, has := tc.env["result"]; has != (out.ResponseHash != "") {
				t.Errorf("response hash %q with result present=%v", out.ResponseHash, has)
			}
			if out.Effect == nil {
				t.Fatal("no effect")
			}
			if out.Effect.EffectID != fixedID || out.Effect.ToolCallID != testCallID || out.Effect.BatchTotalBytes != out.BatchTotalBytes ||
				!reflect.DeepEqual(out.Effect.DocumentHashes, out.DocumentHashes) {
				t.Errorf("effect %+v", out.Effect)
			}
			b, _ := json.Marshal(out.Effect)
			if err := schemas.ValidateToolEffect(b); err != nil {
				t.Errorf("effect does not validate: %v\n%s", err, b)
			}
		})
	}
}

func TestDecidePostResponseHashAndRealIDs(t *testing.T) {
	e, err := New(Config{Registry: testRegistry(t)})
	if err != nil {
		t.Fatal(err)
	}
	pc := parse(t, readResult("files", "read_file", map[string]any{"content": []any{map[string]any{"type": "text", "text": "hi"}}}))
	out := e.DecidePost(pc)
	// JCS of {"content":[{"text":"hi","type":"text"}]}
	if out.ResponseHash != hashHex([]byte(`{"content":[{"text":"hi","type":"text"}]}`)) {
		t.Fatalf("response hash %s", out.ResponseHash)
	}
	b, _ := json.Marshal(out.Effect)
	if err := schemas.ValidateToolEffect(b); err != nil {
		t.Fatalf("UUIDv7 effect does not validate: %v", err)
	}
	if out2 := e.DecidePost(pc); out2.Effect.EffectID == out.Effect.EffectID {
		t.Fatal("effect ids repeat")
	}
}

func TestDefaultReadLimit(t *testing.T) {
	e := testEngine(t, ModeProd)
	// 10485760 decoded bytes are allowed; one more is not. base64 keeps the envelope small enough.
	at := strings.Repeat("AAAA", 10485760/3) + "AA==" // 3*(n) + 1 bytes
	n := 3*(10485760/3) + 1
	if n != 10485760 {
		t.Fatalf("test arithmetic: %d", n)
	}
	over := strings.Repeat("AAAA", 10485760/3) + "AAA=" // +2 bytes → 10485761
	for _, tc := range []struct {
		data string
		want string
	}{{at, "allow"}, {over, "deny"}} {
		out := e.DecidePost(parse(t, readResult("limits", "get_default", map[string]any{"a": tc.data})))
		if out.Decision != tc.want {
			t.Fatalf("size %d: %s %v", out.BatchTotalBytes, out.Decision, out.ReasonCodes)
		}
	}
}

func TestInvalidOutcome(t *testing.T) {
	_, err := schemas.ParseToolCall([]byte(`{"phase":"pre","phase":"post"}`), schemas.Limits{})
	out := InvalidOutcome(err)
	if out.Decision != "deny" || !reflect.DeepEqual(out.ReasonCodes, []string{"VAL-HTC-001"}) || len(out.Details) == 0 ||
		!strings.Contains(out.Details[0], "duplicate") {
		t.Fatalf("%+v", out)
	}
	out = InvalidOutcome(errors.New("secret-value in a message"))
	if strings.Contains(strings.Join(out.Details, ""), "secret") || out.Decision != "deny" {
		t.Fatalf("%+v", out)
	}
}

func TestNewConfig(t *testing.T) {
	if _, err := New(Config{Mode: "staging"}); !errors.Is(err, ErrMode) {
		t.Fatalf("bad mode accepted: %v", err)
	}
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if e.Mode() != ModeProd {
		t.Fatalf("zero mode = %q", e.Mode())
	}
	out := e.DecidePre(parse(t, writeFile("x")))
	if out.Decision != "deny" || out.ReasonCodes[0] != "TOOL_UNCLASSIFIED_DENIED" {
		t.Fatalf("empty registry in prod: %+v", out)
	}
}

func ExampleEngine_DecidePre() {
	reg, err := LoadRegistry("testdata/registry")
	if err != nil {
		panic(err)
	}
	eng, err := New(Config{Registry: reg}) // zero Mode is prod
	if err != nil {
		panic(err)
	}
	raw := []byte(`{"schema_version":"talos.tool_call.v1","phase":"pre",
	  "tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","trace_id":"4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
	  "correlation_id":"q3V2bH7pR9sT1uW4xY6zAb","session_id":"s1","ep_id":"gw-1","server_id":"files",
	  "tool_name":"write_file","transport":"mcp","actor":{"kind":"agent"},
	  "request":{"name":"write_file","arguments":{"path":"/tmp/x","content":"hello\n"}},
	  "issued_at":"2025-01-15T10:20:30.123Z"}`)
	pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
	if err != nil {
		out := InvalidOutcome(err)
		fmt.Println(out.Decision, out.ReasonCodes)
		return
	}
	out := eng.DecidePre(pc)
	fmt.Println(out.Decision, out.ReasonCodes, out.ToolClass)
	for _, h := range out.DocumentHashes {
		fmt.Println(h.Pointer, h.SizeBytes, h.Hash)
	}
	// Output:
	// deny [IDEMPOTENCY_KEY_REQUIRED] write
	// /content 6 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03
}

func BenchmarkDecidePre(b *testing.B) {
	raw, err := os.ReadFile("../schemas/testdata/envelope_pre.json")
	if err != nil {
		b.Fatal(err)
	}
	pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	e := testEngine(b, ModeProd)
	if out := e.DecidePre(pc); out.Decision != "allow" {
		b.Fatalf("benchmark envelope not allowed: %v %v", out.ReasonCodes, out.Details)
	}
	b.ReportAllocs()
	for b.Loop() {
		e.DecidePre(pc)
	}
}
