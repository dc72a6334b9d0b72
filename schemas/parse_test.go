package schemas

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// baseEnvelope is a minimal valid pre-phase envelope, fresh on every call.
func baseEnvelope() map[string]any {
	return map[string]any{
		"schema_version": "talos.tool_call.v1",
		"phase":          "pre",
		"tool_call_id":   "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e",
		"trace_id":       "4BF92F35-77B3-4DA6-A3CE-929D0E0E4736",
		"correlation_id": "q3V2bH7pR9sT1uW4xY6zAb",
		"session_id":     "sess-1",
		"ep_id":          "gw-1",
		"server_id":      "files",
		"tool_name":      "write_file",
		"transport":      "mcp",
		"actor":          map[string]any{"kind": "agent"},
		"request":        map[string]any{"name": "write_file", "arguments": map[string]any{"path": "/tmp/x", "content": "hi"}},
		"issued_at":      "2025-01-15T10:20:30.123Z",
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseToolCallTable(t *testing.T) {
	const secret = "sk-live-SECRETVALUE123"
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		ok     bool
		detail string // substring expected in the details when !ok
	}{
		{name: "minimal pre", mutate: func(map[string]any) {}, ok: true},
		{name: "all optional pre fields", ok: true, mutate: func(m map[string]any) {
			m["tool_class"] = "write"
			m["idempotency_key"] = "k1"
			m["registry_digest"] = "sha256:" + strings.Repeat("ab", 32)
			m["capability"] = map[string]any{"chain": []any{}}
			m["request_hash"] = strings.Repeat("0f", 32)
			m["expected_document_hashes"] = []any{map[string]any{"pointer": "/content", "hash": strings.Repeat("a", 64)}}
			m["content_hash_alg"] = "sha256"
			m["sender_signature"] = "sig"
			m["parent_span_id"] = "00f067aa0ba902b7"
			m["actor"] = map[string]any{"kind": "human", "agent_id": "a", "model_id": "m"}
			m["request"].(map[string]any)["_meta"] = map[string]any{"progressToken": 1}
		}},
		{name: "post with result", ok: true, mutate: func(m map[string]any) {
			m["phase"] = "post"
			m["result"] = map[string]any{"content": []any{map[string]any{"type": "text", "text": "ok"}}}
			m["ok"] = true
			m["error"] = map[string]any{"code": "E1", "kind": "tool", "message": "m", "retryable": false}
			m["timing"] = map[string]any{"started_at": "2025-01-15T10:20:30.123Z", "ended_at": "2025-01-15T10:20:31.123Z"}
		}},
		{name: "pre with result", detail: "/result: not allowed here", mutate: func(m map[string]any) { m["result"] = map[string]any{} }},
		{name: "pre with ok", detail: "/ok: not allowed here", mutate: func(m map[string]any) { m["ok"] = false }},
		{name: "pre with timing", detail: "/timing: not allowed here", mutate: func(m map[string]any) {
			m["timing"] = map[string]any{"started_at": "2025-01-15T10:20:30Z", "ended_at": "2025-01-15T10:20:30Z"}
		}},
		{name: "missing tool_call_id", detail: "required: missing tool_call_id", mutate: func(m map[string]any) { delete(m, "tool_call_id") }},
		{name: "missing request", detail: "required: missing request", mutate: func(m map[string]any) { delete(m, "request") }},
		{name: "missing arguments", detail: "/request: required: missing arguments", mutate: func(m map[string]any) {
			delete(m["request"].(map[string]any), "arguments")
		}},
		{name: "arguments not object", detail: "/request/arguments: type", mutate: func(m map[string]any) {
			m["request"].(map[string]any)["arguments"] = []any{secret}
		}},
		{name: "unknown top-level field", detail: "additionalProperties: 1 unknown", mutate: func(m map[string]any) { m[secret] = 1 }},
		{name: "unknown actor field", detail: "/actor: additionalProperties", mutate: func(m map[string]any) {
			m["actor"].(map[string]any)["x"] = 1
		}},
		{name: "bad schema_version", detail: "/schema_version: const", mutate: func(m map[string]any) { m["schema_version"] = "talos.tool_call.v2" }},
		{name: "bad phase", detail: "/phase: enum", mutate: func(m map[string]any) { m["phase"] = "during" }},
		{name: "tool_call_id not uuid", detail: "/tool_call_id: pattern", mutate: func(m map[string]any) { m["tool_call_id"] = secret }},
		{name: "correlation_id short", detail: "/correlation_id: pattern", mutate: func(m map[string]any) { m["correlation_id"] = "abc" }},
		{name: "correlation_id not base64url", detail: "/correlation_id: pattern", mutate: func(m map[string]any) { m["correlation_id"] = strings.Repeat("+", 22) }},
		{name: "server_id upper", detail: "/server_id: pattern", mutate: func(m map[string]any) { m["server_id"] = "Files" }},
		{name: "ep_id too long", detail: "/ep_id: pattern", mutate: func(m map[string]any) { m["ep_id"] = strings.Repeat("a", 65) }},
		{name: "bad transport", detail: "/transport: enum", mutate: func(m map[string]any) { m["transport"] = "smtp" }},
		{name: "bad actor kind", detail: "/actor/kind: enum", mutate: func(m map[string]any) { m["actor"] = map[string]any{"kind": "robot"} }},
		{name: "issued_at not rfc3339", detail: "/issued_at: format date-time", mutate: func(m map[string]any) { m["issued_at"] = "15/01/2025" }},
		{name: "bad content_hash_alg", detail: "/content_hash_alg: const", mutate: func(m map[string]any) { m["content_hash_alg"] = "md5" }},
		{name: "bad registry_digest", detail: "/registry_digest: pattern", mutate: func(m map[string]any) { m["registry_digest"] = strings.Repeat("a", 64) }},
		{name: "expected hash upper hex", detail: "/expected_document_hashes/0/hash: pattern", mutate: func(m map[string]any) {
			m["expected_document_hashes"] = []any{map[string]any{"pointer": "/content", "hash": strings.Repeat("A", 64)}}
		}},
		{name: "expected hash bad pointer", detail: "/expected_document_hashes/0/pointer: pattern", mutate: func(m map[string]any) {
			m["expected_document_hashes"] = []any{map[string]any{"pointer": "content", "hash": strings.Repeat("a", 64)}}
		}},
		{name: "tool_class invalid", detail: "/tool_class: enum", mutate: func(m map[string]any) { m["tool_class"] = "admin" }},
		{name: "request.name differs", detail: "/request/name: must equal /tool_name", mutate: func(m map[string]any) {
			m["request"].(map[string]any)["name"] = "other"
		}},
		{name: "not an object", detail: "/: type", mutate: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var raw []byte
			if tc.mutate == nil {
				raw = []byte(`["` + secret + `"]`)
			} else {
				m := baseEnvelope()
				tc.mutate(m)
				raw = mustJSON(t, m)
			}
			pc, err := ParseToolCall(raw, Limits{})
			if tc.ok {
				if err != nil {
					t.Fatalf("want ok, got %v", err)
				}
				if pc.Call.ToolCallID != "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e" || pc.Call.Request.Name != "write_file" {
					t.Fatalf("struct not filled: %+v", pc.Call)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Code != CodeEnvelopeInvalid || !errors.Is(err, ErrInvalid) {
				t.Fatalf("want VAL-HTC-001 ValidationError, got %v", err)
			}
			all := strings.Join(ve.Details, "\n")
			if !strings.Contains(all, tc.detail) {
				t.Fatalf("details %q do not contain %q", ve.Details, tc.detail)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("error echoes an input value: %v", err)
			}
		})
	}
}

func TestParseToolCallRawRejections(t *testing.T) {
	good := mustJSON(t, baseEnvelope())
	nested := `{"a":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `}`
	cases := []struct {
		name   string
		raw    []byte
		lim    Limits
		detail string
	}{
		{"oversize", good, Limits{MaxBytes: len(good) - 1}, "limit"},
		{"invalid utf8", append([]byte(`{"x":"`), 0xff, '"', '}'), Limits{}, "UTF-8"},
		{"not json", []byte(`{"x":`), Limits{}, "not a single JSON value"},
		{"trailing data", append(append([]byte{}, good...), []byte(` {}`)...), Limits{}, "not a single JSON value"},
		{"empty", nil, Limits{}, "not a single JSON value"},
		{"dup top-level key", []byte(`{"phase":"pre","phase":"post"}`), Limits{}, "duplicate object key"},
		{"dup escaped key", []byte(`{"phase":"pre","\u0070hase":"post"}`), Limits{}, "duplicate object key"},
		{"dup nested key", []byte(`{"request":{"arguments":{"a":{"b":1,"b":2}}}}`), Limits{}, "duplicate object key"},
		{"too deep", []byte(nested), Limits{}, "nesting deeper than 64"},
		{"too deep custom", []byte(`{"a":{"b":{"c":1}}}`), Limits{MaxDepth: 2}, "nesting deeper than 2"},
		{"lone high surrogate", []byte(`{"a":"\ud800"}`), Limits{}, "unpaired surrogate"},
		{"lone low surrogate", []byte(`{"a":"x\udc00"}`), Limits{}, "unpaired surrogate"},
		{"high then non-low", []byte(`{"a":"\ud800\u0041"}`), Limits{}, "unpaired surrogate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseToolCall(tc.raw, tc.lim)
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Code != CodeEnvelopeInvalid {
				t.Fatalf("want VAL-HTC-001, got %v", err)
			}
			if !strings.Contains(strings.Join(ve.Details, "\n"), tc.detail) {
				t.Fatalf("details %q lack %q", ve.Details, tc.detail)
			}
		})
	}
	// A paired surrogate is fine.
	m := baseEnvelope()
	raw := strings.Replace(string(mustJSON(t, m)), `"hi"`, `"\ud83d\ude00"`, 1)
	if _, err := ParseToolCall([]byte(raw), Limits{}); err != nil {
		t.Fatalf("paired surrogate rejected: %v", err)
	}
}

func TestParsedCallHelpers(t *testing.T) {
	raw, err := os.ReadFile("testdata/envelope_pre.json")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := ParseToolCall(raw, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var want ToolCall
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	// The fast fill must agree with encoding/json (raw fields compared compacted).
	got := pc.Call
	for _, p := range []*json.RawMessage{&got.Request.Arguments, &got.Request.Meta, &want.Request.Arguments, &want.Request.Meta} {
		*p = compactRaw(t, *p)
	}
	if g, w := mustJSON(t, got), mustJSON(t, want); string(g) != string(w) {
		t.Fatalf("fill mismatch:\n got %s\nwant %s", g, w)
	}
	args, ok := pc.Arguments().(map[string]any)
	if !ok || args["repo"] != "talos-audit/talos" {
		t.Fatalf("Arguments() = %v", pc.Arguments())
	}
	if _, isNum := args["reviewers"].(json.Number); !isNum {
		t.Fatalf("numbers must be json.Number, got %T", args["reviewers"])
	}
	if pc.Result() != nil {
		t.Fatal("pre call has a result")
	}
	rj, err := pc.RequestJSON()
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	_ = json.Unmarshal(rj, &a)
	_ = json.Unmarshal(mustJSON(t, pc.Doc["request"]), &b)
	if string(mustJSON(t, a)) != string(mustJSON(t, b)) || rj[0] != '{' || rj[len(rj)-1] != '}' {
		t.Fatalf("RequestJSON = %s", rj)
	}
	// Without spans (hand-built), RequestJSON falls back to marshalling.
	pc2 := &ParsedCall{Doc: pc.Doc}
	if rj2, err := pc2.RequestJSON(); err != nil || len(rj2) == 0 {
		t.Fatalf("fallback RequestJSON: %v", err)
	}
}

func compactRaw(t *testing.T, r json.RawMessage) json.RawMessage {
	if r == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(r, &v); err != nil {
		t.Fatal(err)
	}
	return mustJSON(t, v)
}

func TestPostFill(t *testing.T) {
	m := baseEnvelope()
	m["phase"] = "post"
	m["result"] = map[string]any{"content": []any{map[string]any{"type": "text", "text": "x"}}, "isError": false}
	m["ok"] = false
	m["error"] = map[string]any{"code": "E", "kind": "timeout", "retryable": true}
	m["timing"] = map[string]any{"started_at": "2025-01-15T10:20:30.1Z", "ended_at": "2025-01-15T10:20:31Z"}
	m["capability"] = []any{"a", "b"}
	pc, err := ParseToolCall(mustJSON(t, m), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c := pc.Call
	if c.OK == nil || *c.OK || c.Error == nil || c.Error.Kind != "timeout" || c.Error.Retryable == nil || !*c.Error.Retryable ||
		c.Timing == nil || c.Timing.EndedAt != "2025-01-15T10:20:31Z" || string(c.Capability) != `["a","b"]` ||
		!strings.HasPrefix(string(c.Result), `{"content":`) {
		t.Fatalf("post fill: %+v", c)
	}
	if _, ok := pc.Result().(map[string]any); !ok {
		t.Fatal("Result() not an object")
	}
}

func TestBestEffortIDs(t *testing.T) {
	cases := []struct {
		name, raw        string
		tcid, ep, server string
	}{
		{"valid", `{"tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","ep_id":"gw-1","server_id":"files","x":1}`,
			"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", "gw-1", "files"},
		{"broken json", `{"tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", "ep_id" : "gw-1", "server_id":"files", oops`,
			"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", "gw-1", "files"},
		{"bad values", `{"tool_call_id":"secret","ep_id":"GW 1","server_id":"../x"}`, "", "", ""},
		{"wrong types", `{"tool_call_id":1,"ep_id":["gw"],"server_id":null}`, "", "", ""},
		{"not json", `garbage`, "", "", ""},
		{"empty", ``, "", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := BestEffortIDs([]byte(tc.raw))
			if a != tc.tcid || b != tc.ep || c != tc.server {
				t.Fatalf("got %q %q %q", a, b, c)
			}
		})
	}
}

// slowDupOrDeep is the reference for the scanner: a recursive decoder over
// json.Decoder tokens (slow, obviously correct).
func slowDupOrDeep(raw []byte, maxDepth int) (dup, deep bool) {
	d := json.NewDecoder(strings.NewReader(string(raw)))
	var walk func(depth int) bool
	walk = func(depth int) bool {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		delim, ok := tok.(json.Delim)
		if !ok {
			return true
		}
		if depth+1 > maxDepth {
			deep = true
			return false
		}
		switch delim {
		case '{':
			seen := map[string]bool{}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return false
				}
				ks := k.(string)
				if seen[ks] {
					dup = true
					return false
				}
				seen[ks] = true
				if !walk(depth + 1) {
					return false
				}
			}
		case '[':
			for d.More() {
				if !walk(depth + 1) {
					return false
				}
			}
		}
		_, err = d.Token()
		return err == nil
	}
	walk(0)
	return dup, deep
}

func TestScannerAgreesWithReference(t *testing.T) {
	inputs := []string{
		`{}`, `[]`, `1`, `"x"`, `{"a":1,"b":2}`, `{"a":1,"a":2}`, `{"a":{"a":{"a":1}}}`,
		`[{"a":1},{"a":1}]`, `{"a":[{"b":1,"c":2,"b":3}]}`, `{"\u0061":1,"a":2}`, `{"a\"b":1,"a\"b":2}`,
		`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":0,"k11":1,"k12":2,"k13":3,"k14":4,"k15":5,"k16":6,"k17":7,"k3":1}`,
		`[[[[[]]]]]`, `{"a":[[[[1]]]]}`,
	}
	for _, in := range inputs {
		for _, depth := range []int{1, 2, 3, 5, 64} {
			dup, deep := slowDupOrDeep([]byte(in), depth)
			err := scanStructure([]byte(in), depth, nil)
			var se *scanError
			gotDup := errors.As(err, &se) && se.what == "duplicate object key"
			gotDeep := errors.As(err, &se) && strings.HasPrefix(se.what, "nesting")
			if gotDup != dup || gotDeep != deep {
				t.Errorf("%s depth %d: scanner dup=%v deep=%v, reference dup=%v deep=%v", in, depth, gotDup, gotDeep, dup, deep)
			}
		}
	}
}

func TestParseManifestTable(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "mcp-github", "server_version": "1.0.0",
			"tools": []any{
				map[string]any{"tool_name": "create-pr", "tool_class": "write", "is_document_op": true,
					"document_spec": map[string]any{"content_encoding": "utf8", "write_content_pointers": []any{"/body", "/files/0/content"},
						"read_content_pointers": []any{}, "max_read_bytes": 10485760, "max_write_bytes": 5242880, "max_batch_bytes": 52428800}},
				map[string]any{"tool_name": "list-prs", "tool_class": "read", "is_document_op": false},
			},
		}
	}
	tool := func(m map[string]any, i int) map[string]any { return m["tools"].([]any)[i].(map[string]any) }
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		detail string // "" means valid
	}{
		{"seed example", func(map[string]any) {}, ""},
		{"no tools", func(m map[string]any) { m["tools"] = []any{} }, ""},
		{"all metadata", func(m map[string]any) {
			t1 := tool(m, 1)
			t1["trust_level"], t1["risk_category"], t1["network_outbound"], t1["built_in"], t1["subagent_access"] = "verified", "LOW", true, false, "read_only"
			t1["input_schema"] = map[string]any{"type": "object"}
			t1["action_pointer"] = "/action"
			t1["actions"] = []any{map[string]any{"name": "list", "read_only": true}, map[string]any{"name": "merge", "read_only": false}}
		}, ""},
		{"sizes absent", func(m map[string]any) {
			ds := tool(m, 0)["document_spec"].(map[string]any)
			delete(ds, "max_read_bytes")
			delete(ds, "max_write_bytes")
			delete(ds, "max_batch_bytes")
		}, ""},
		{"workspace from the enforcement point", func(m map[string]any) {
			tool(m, 1)["path_pointers"], tool(m, 1)["workspace_root"] = []any{"/path"}, "enforcement_point"
		}, ""},
		{"relative workspace_root", func(m map[string]any) {
			tool(m, 1)["path_pointers"], tool(m, 1)["workspace_root"] = []any{"/path"}, "srv/ws"
		}, "/tools/1/workspace_root: pattern"},
		{"path_pointers without workspace_root", func(m map[string]any) { tool(m, 1)["path_pointers"] = []any{"/path"} }, "/tools/1: dependentRequired"},
		{"prompts and resources", func(m map[string]any) {
			m["prompts"] = []any{map[string]any{"name": "review-pr", "trust_level": "verified", "risk_category": "LOW", "max_args_bytes": 512}}
			m["resources"] = []any{map[string]any{"name": "pr-diff", "uri": "github://{owner}/{repo}/pulls/{n}/diff", "network_outbound": true}}
		}, ""},
		{"prompt named like a tool", func(m map[string]any) { m["prompts"] = []any{map[string]any{"name": "list-prs"}} },
			"/prompts/0/name: duplicate of /tools/1/tool_name"},
		{"resource named like a prompt", func(m map[string]any) {
			m["prompts"] = []any{map[string]any{"name": "diff"}}
			m["resources"] = []any{map[string]any{"name": "diff", "uri": "github://diff"}}
		}, "/resources/0/name: duplicate of /prompts/0/name"},
		{"resource without uri", func(m map[string]any) { m["resources"] = []any{map[string]any{"name": "x"}} }, "/resources/0: required: missing uri"},
		{"resource name with a slash", func(m map[string]any) {
			m["resources"] = []any{map[string]any{"name": "a/b", "uri": "x://y"}}
		}, "/resources/0/name: pattern"},
		{"definition pin", func(m map[string]any) { tool(m, 1)["definition_sha256"] = strings.Repeat("0a", 32) }, ""},
		{"definition pin not hex", func(m map[string]any) { tool(m, 1)["definition_sha256"] = "sha256:" + strings.Repeat("0a", 32) }, "/tools/1/definition_sha256: pattern"},
		{"bad schema_id", func(m map[string]any) { m["schema_id"] = "x" }, "/schema_id: const"},
		{"bad schema_version", func(m map[string]any) { m["schema_version"] = "v2" }, "/schema_version: const"},
		{"missing server_id", func(m map[string]any) { delete(m, "server_id") }, "required: missing server_id"},
		{"bad server_id", func(m map[string]any) { m["server_id"] = "MCP GitHub" }, "/server_id: pattern"},
		{"unknown root field", func(m map[string]any) { m["extra"] = 1 }, "additionalProperties"},
		{"unknown tool field", func(m map[string]any) { tool(m, 1)["extra"] = 1 }, "/tools/1: additionalProperties"},
		{"unknown spec field", func(m map[string]any) { tool(m, 0)["document_spec"].(map[string]any)["extra"] = 1 }, "/tools/0/document_spec: additionalProperties"},
		{"missing tool_class", func(m map[string]any) { delete(tool(m, 1), "tool_class") }, "required: missing tool_class"},
		{"bad tool_class", func(m map[string]any) { tool(m, 1)["tool_class"] = "admin" }, "/tools/1/tool_class: enum"},
		{"missing is_document_op", func(m map[string]any) { delete(tool(m, 1), "is_document_op") }, "required: missing is_document_op"},
		{"doc op without spec", func(m map[string]any) { delete(tool(m, 0), "document_spec") }, "/tools/0: required: missing document_spec"},
		{"spec on non-doc op", func(m map[string]any) {
			tool(m, 1)["document_spec"] = map[string]any{"content_encoding": "utf8"}
		}, "/tools/1: not"},
		{"bad encoding", func(m map[string]any) { tool(m, 0)["document_spec"].(map[string]any)["content_encoding"] = "latin1" }, "content_encoding: enum"},
		{"write doc op without write pointers", func(m map[string]any) {
			delete(tool(m, 0)["document_spec"].(map[string]any), "write_content_pointers")
		}, "/tools/0/document_spec: required: missing write_content_pointers"},
		{"write doc op with empty write pointers", func(m map[string]any) {
			tool(m, 0)["document_spec"].(map[string]any)["write_content_pointers"] = []any{}
		}, "/tools/0/document_spec/write_content_pointers: minItems"},
		{"read doc op without read pointers", func(m map[string]any) {
			m["tools"] = append(m["tools"].([]any), map[string]any{"tool_name": "get", "tool_class": "read", "is_document_op": true,
				"document_spec": map[string]any{"content_encoding": "base64"}})
		}, "/tools/2/document_spec: required: missing read_content_pointers"},
		{"jsonpath not pointer", func(m map[string]any) {
			tool(m, 0)["document_spec"].(map[string]any)["write_content_pointers"] = []any{"$.body"}
		}, "write_content_pointers/0: pattern"},
		{"bad pointer escape", func(m map[string]any) {
			tool(m, 0)["document_spec"].(map[string]any)["write_content_pointers"] = []any{"/a~2b"}
		}, "write_content_pointers/0: pattern"},
		{"duplicate pointers", func(m map[string]any) {
			tool(m, 0)["document_spec"].(map[string]any)["write_content_pointers"] = []any{"/body", "/body"}
		}, "uniqueItems"},
		{"size not integer", func(m map[string]any) { tool(m, 0)["document_spec"].(map[string]any)["max_write_bytes"] = 1.5 }, "max_write_bytes: type"},
		{"size negative", func(m map[string]any) { tool(m, 0)["document_spec"].(map[string]any)["max_write_bytes"] = -1 }, "max_write_bytes: minimum"},
		{"bad trust_level", func(m map[string]any) { tool(m, 1)["trust_level"] = "trusted" }, "trust_level: enum"},
		{"bad risk_category", func(m map[string]any) { tool(m, 1)["risk_category"] = "low" }, "risk_category: enum"},
		{"bad subagent_access", func(m map[string]any) { tool(m, 1)["subagent_access"] = "some" }, "subagent_access: enum"},
		{"network_outbound not bool", func(m map[string]any) { tool(m, 1)["network_outbound"] = "yes" }, "network_outbound: type"},
		{"action_pointer without actions", func(m map[string]any) { tool(m, 1)["action_pointer"] = "/action" }, "dependentRequired: action_pointer needs actions"},
		{"actions without action_pointer", func(m map[string]any) {
			tool(m, 1)["actions"] = []any{map[string]any{"name": "list", "read_only": true}}
		}, "dependentRequired: actions needs action_pointer"},
		{"empty actions", func(m map[string]any) {
			tool(m, 1)["action_pointer"] = "/action"
			tool(m, 1)["actions"] = []any{}
		}, "actions: minItems"},
		{"action without read_only", func(m map[string]any) {
			tool(m, 1)["action_pointer"] = "/action"
			tool(m, 1)["actions"] = []any{map[string]any{"name": "list"}}
		}, "required: missing read_only"},
		{"duplicate action", func(m map[string]any) {
			tool(m, 1)["action_pointer"] = "/action"
			tool(m, 1)["actions"] = []any{map[string]any{"name": "list", "read_only": true}, map[string]any{"name": "list", "read_only": false}}
		}, "/tools/1/actions/1/name: duplicate"},
		{"input_schema not object", func(m map[string]any) { tool(m, 1)["input_schema"] = "x" }, "input_schema: type"},
		{"duplicate tool names", func(m map[string]any) { tool(m, 1)["tool_name"] = "create-pr" }, "/tools/1/tool_name: duplicate of /tools/0/tool_name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.mutate(m)
			got, err := ParseManifest(mustJSON(t, m))
			if tc.detail == "" {
				if err != nil {
					t.Fatalf("want ok: %v", err)
				}
				if got.ServerID != "mcp-github" {
					t.Fatalf("decoded %+v", got)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("want ValidationError, got %v", err)
			}
			if !strings.Contains(strings.Join(ve.Details, "\n"), tc.detail) {
				t.Fatalf("details %q lack %q", ve.Details, tc.detail)
			}
		})
	}
	if _, err := ParseManifest([]byte(`{"schema_id":"talos.mcp.tool_registry","schema_id":"x"}`)); err == nil {
		t.Fatal("duplicate key accepted in manifest")
	}
}

func TestDocumentSpecLimits(t *testing.T) {
	r, w, b := (*DocumentSpec)(nil).Limits()
	if r != 10485760 || w != 5242880 || b != 52428800 {
		t.Fatalf("defaults %d %d %d", r, w, b)
	}
	one := int64(1)
	r, w, b = (&DocumentSpec{MaxWriteBytes: &one}).Limits()
	if r != 10485760 || w != 1 || b != 52428800 {
		t.Fatalf("partial %d %d %d", r, w, b)
	}
}

func BenchmarkParseToolCall(b *testing.B) {
	raw, err := os.ReadFile("../schemas/testdata/envelope_pre.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseToolCall(raw, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScanStructure(b *testing.B) {
	raw, _ := os.ReadFile("testdata/envelope_pre.json")
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var info scanInfo
		if err := scanStructure(raw, 64, &info); err != nil {
			b.Fatal(err)
		}
	}
}
