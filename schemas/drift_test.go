package schemas

import (
	"encoding/json"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// schemaNode returns the sub-schema at a JSON pointer ("#/..." fragment)
// inside one embedded schema file.
func schemaNode(t *testing.T, file, ptr string) map[string]any {
	t.Helper()
	cs, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	var v any = cs.docs[file]
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		if tok == "" {
			continue
		}
		v = v.(map[string]any)[tok]
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s#%s is not a schema object", file, ptr)
	}
	return m
}

type jsonField struct {
	name      string
	omitempty bool
}

func structFields(typ reflect.Type) []jsonField {
	var out []jsonField
	for i := 0; i < typ.NumField(); i++ {
		if f := typ.Field(i); f.Anonymous && f.Tag.Get("json") == "" {
			out = append(out, structFields(f.Type)...) // encoding/json inlines it
			continue
		}
		tag := typ.Field(i).Tag.Get("json")
		if tag == "" || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		out = append(out, jsonField{name: name, omitempty: strings.Contains(opts, "omitempty")})
	}
	return out
}

// TestStructsMatchSchemas: every Go wire struct has exactly the schema's
// properties, and a field is required in the schema iff it has no omitempty
// (listed exceptions are deliberate).
func TestStructsMatchSchemas(t *testing.T) {
	// Fields the schema requires although the struct says omitempty (or the
	// reverse), with the reason.
	exceptions := map[string]string{
		"Request.arguments":       "MCP allows it absent; Talos requires it on the wire",
		"Receipt.signature":       "omitted only while signing; the wire event is always signed",
		"Capability.signature":    "omitted only while signing; a capability on the wire is always signed",
		"Delegation.signature":    "omitted only while signing; a delegation on the wire is always signed",
		"ToolCallEvent.signature": "omitted only while signing; the wire event is always signed",
		"Checkpoint.signature":    "omitted only while signing; the wire event is always signed",
	}
	cases := []struct {
		typ  reflect.Type
		file string
		ptr  string
	}{
		{reflect.TypeFor[ToolCall](), FileToolCallSchema, ""},
		{reflect.TypeFor[Actor](), FileToolCallSchema, "/properties/actor"},
		{reflect.TypeFor[Request](), FileToolCallSchema, "/properties/request"},
		{reflect.TypeFor[ExpectedHash](), FileToolCallSchema, "/properties/expected_document_hashes/items"},
		{reflect.TypeFor[CallError](), FileToolCallSchema, "/properties/error"},
		{reflect.TypeFor[Timing](), FileToolCallSchema, "/properties/timing"},
		{reflect.TypeFor[TokenHandling](), FileToolCallSchema, "/properties/token_handling"},
		{reflect.TypeFor[TokenHandling](), FileReceiptSchema, "/$defs/token_handling"},
		{reflect.TypeFor[UpstreamSandbox](), FileToolCallSchema, "/properties/upstream_sandbox"},
		{reflect.TypeFor[UpstreamSandbox](), FileReceiptSchema, "/$defs/upstream_sandbox"},
		{reflect.TypeFor[Manifest](), FileToolRegistrySchema, ""},
		{reflect.TypeFor[Tool](), FileToolRegistrySchema, "/$defs/tool"},
		{reflect.TypeFor[Prompt](), FileToolRegistrySchema, "/$defs/prompt"},
		{reflect.TypeFor[Resource](), FileToolRegistrySchema, "/$defs/resource"},
		{reflect.TypeFor[DocumentSpec](), FileToolRegistrySchema, "/$defs/document_spec"},
		{reflect.TypeFor[Action](), FileToolRegistrySchema, "/$defs/action"},
		{reflect.TypeFor[ToolEffect](), FileToolEffectSchema, ""},
		{reflect.TypeFor[DocumentHash](), FileToolEffectSchema, "/$defs/document_hash"},
		{reflect.TypeFor[Receipt](), FileReceiptSchema, "/$defs/receipt"},
		{reflect.TypeFor[Chain](), FileReceiptSchema, "/$defs/chain"},
		{reflect.TypeFor[IdempotentOf](), FileReceiptSchema, "/$defs/receipt/properties/idempotent_of"},
		{reflect.TypeFor[Signature](), FileReceiptSchema, "/$defs/signature"},
		{reflect.TypeFor[ControlRecord](), FileReceiptSchema, "/$defs/control"},
		{reflect.TypeFor[Decision](), FileDecisionSchema, ""},
		{reflect.TypeFor[CapabilityChain](), FileCapabilitySchema, ""},
		{reflect.TypeFor[Capability](), FileCapabilitySchema, "/$defs/capability"},
		{reflect.TypeFor[Delegation](), FileCapabilitySchema, "/$defs/delegation"},
		{reflect.TypeFor[Constraints](), FileCapabilitySchema, "/$defs/constraints"},
		{reflect.TypeFor[Signature](), FileCapabilitySchema, "/$defs/signature"},
		{reflect.TypeFor[ToolCallEvent](), FileToolCallEventSchema, "/$defs/event"},
		{reflect.TypeFor[EventTiming](), FileToolCallEventSchema, "/$defs/timing"},
		{reflect.TypeFor[ResourcesTouched](), FileToolCallEventSchema, "/$defs/resources_touched"},
		{reflect.TypeFor[Redaction](), FileToolCallEventSchema, "/$defs/redaction"},
		{reflect.TypeFor[Payloads](), FileToolCallEventSchema, "/$defs/payloads"},
		{reflect.TypeFor[Actor](), FileToolCallEventSchema, "/$defs/actor"},
		{reflect.TypeFor[CallError](), FileToolCallEventSchema, "/$defs/error"},
		{reflect.TypeFor[Checkpoint](), FileCheckpointSchema, ""},
	}
	for _, tc := range cases {
		t.Run(tc.typ.Name(), func(t *testing.T) {
			node := schemaNode(t, tc.file, tc.ptr)
			if node["additionalProperties"] != false {
				t.Errorf("%s#%s: additionalProperties must be false", tc.file, tc.ptr)
			}
			props, _ := node["properties"].(map[string]any)
			required := map[string]bool{}
			if rs, ok := node["required"].([]any); ok {
				for _, r := range rs {
					required[r.(string)] = true
				}
			}
			var schemaNames, goNames []string
			for k := range props {
				schemaNames = append(schemaNames, k)
			}
			for _, f := range structFields(tc.typ) {
				goNames = append(goNames, f.name)
				key := tc.typ.Name() + "." + f.name
				if required[f.name] == f.omitempty {
					if _, ok := exceptions[key]; !ok {
						t.Errorf("%s: schema required=%v but struct omitempty=%v", key, required[f.name], f.omitempty)
					}
				}
			}
			sort.Strings(schemaNames)
			sort.Strings(goNames)
			if strings.Join(schemaNames, ",") != strings.Join(goNames, ",") {
				t.Errorf("properties drift:\n schema %v\n struct %v", schemaNames, goNames)
			}
			for r := range required {
				if _, ok := props[r]; !ok {
					t.Errorf("required %q is not a property", r)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func fullToolCall() ToolCall {
	return ToolCall{
		SchemaVersion: ToolCallSchemaVersion, Phase: PhasePost,
		ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
		CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb", SessionID: "s", EPID: "gw", ServerID: "files", ToolName: "read_file",
		Transport: "local", Actor: Actor{Kind: "agent", AgentID: "a", ModelID: "m"},
		Request:  Request{Name: "read_file", Arguments: json.RawMessage(`{"path":"/x"}`), Meta: json.RawMessage(`{"k":1}`)},
		IssuedAt: "2025-01-15T10:20:30.123Z", ToolClass: ClassRead, IdempotencyKey: "k",
		RegistryDigest: "sha256:" + strings.Repeat("1", 64), Capability: json.RawMessage(`{"c":1}`),
		RequestHash:            strings.Repeat("2", 64),
		ExpectedDocumentHashes: []ExpectedHash{{Pointer: "/p", Hash: strings.Repeat("3", 64)}},
		ContentHashAlg:         ContentHashAlg, SenderSignature: json.RawMessage(`{"sig":"x"}`), ParentSpanID: "p",
		TokenHandling:   &TokenHandling{Mode: TokenModeTokenExchange, Audience: "files", PassthroughDetected: true, Error: TokenErrExchangeRefused},
		UpstreamSandbox: &UpstreamSandbox{Sandboxed: true, Network: SandboxNetworkAllowlist, AllowlistSHA256: "sha256:" + strings.Repeat("5", 64)},
		Result:          json.RawMessage(`{"content":[]}`), OK: ptr(true),
		WorkspaceRoot: "/srv/ws", ToolDefinitionSHA256: strings.Repeat("4", 64), MCPMethod: MethodSamplingCreateMessage,
		ParentToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f",
		Error:            &CallError{Code: "c", Kind: "k", Message: "m", Retryable: ptr(false)},
		Timing:           &Timing{StartedAt: "2025-01-15T10:20:30.123Z", EndedAt: "2025-01-15T10:20:30.200Z"},
	}
}

func fullEffect() ToolEffect {
	return ToolEffect{EffectID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f",
		DocumentHashes:  []DocumentHash{{Pointer: "/content/0/text", Hash: strings.Repeat("a", 64), SizeBytes: 3}},
		BatchTotalBytes: 3, ContentHashAlg: ContentHashAlg}
}

func fullReceiptEvent() map[string]any {
	eff := fullEffect()
	r := Receipt{
		EventType: KindEffect, Tool: "read_file", CapabilityHash: strings.Repeat("b", 64), RequestHash: strings.Repeat("c", 64),
		ResponseHash: strings.Repeat("d", 64), AgentID: "a", ToolID: "files/read_file", Timestamp: "2025-01-15T10:20:30.123Z",
		ResultCode: "allow", EnvelopeHash: strings.Repeat("e", 64), ToolCallID: eff.ToolCallID,
		TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb", SessionID: "s",
		EPID: "gw", ServerID: "files", ToolName: "read_file", MCPMethod: MethodResourcesRead, ParentToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6d", Phase: PhasePost, Mode: "prod", Decision: DecisionAllow,
		ReasonCodes: []string{CodeToolUnclassifiedAllowedDev}, ToolClass: ClassRead, RegistryDigest: "sha256:" + strings.Repeat("f", 64),
		DocumentHashes: eff.DocumentHashes, BatchTotalBytes: 3, ContentHashAlg: ContentHashAlg, Effect: &eff,
		ControlSeq: 7, Control: fullControlRecord(), CapabilityIDs: []string{"cap-1"},
		TokenHandling:   &TokenHandling{Mode: TokenModeSecret, Audience: "files", PassthroughDetected: false, Error: TokenErrNoSubjectToken},
		UpstreamSandbox: &UpstreamSandbox{Sandboxed: true, Network: SandboxNetworkAllowlist, AllowlistSHA256: "sha256:" + strings.Repeat("6", 64)},
		IdempotentOf:    &IdempotentOf{ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d71", ReceiptID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d72"},
		Chain:           Chain{ChainID: "worker-1", Seq: 1, PrevHash: GenesisHash},
		Signature:       &Signature{Alg: SignatureAlg, KID: "k1", Sig: strings.Repeat("A", 86)},
	}
	return map[string]any{
		"specversion": "1.0", "id": "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d70", "source": "talos://enforce/worker-1",
		"type": TypeReceiptEffect, "subject": eff.ToolCallID, "time": "2025-01-15T10:20:30.123Z",
		"datacontenttype": "application/json", "data": r,
	}
}

func fullControlRecord() *ControlRecord {
	return &ControlRecord{CommandID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d71", Verb: VerbKillSwitchSet, Actor: "alice",
		Reason: "incident 42", Target: "tool:files/write_file", Accepted: true, Code: "", Seq: 7,
		CommandHash: strings.Repeat("a", 64), ResponderKID: "0123456789abcdef", SuppressedBefore: 3,
		Command: &ControlCommand{SchemaVersion: ControlCommandVersion, CommandID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d71",
			Verb: VerbKillSwitchSet, Actor: "alice", Reason: "incident 42", IssuedAt: "2025-01-15T10:20:30.123Z",
			Scope: "tool:files/write_file", SessionID: "s", Target: "cap-1", Digest: "sha256:" + strings.Repeat("f", 64),
			CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb", Manifests: []json.RawMessage{json.RawMessage(`{"server_id":"x"}`)},
			Signature: &Signature{Alg: SignatureAlg, KID: "0123456789abcdef", Sig: strings.Repeat("A", 86)}}}
}

// assertAllKeys fails if the JSON object b lacks a json key of typ, so that
// "fully populated" cannot silently become partial.
func assertAllKeys(t *testing.T, typ reflect.Type, b []byte) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range structFields(typ) {
		if _, ok := m[f.name]; !ok {
			t.Errorf("%s: fully populated value lacks %q", typ.Name(), f.name)
		}
	}
}

func TestFullyPopulatedStructsValidate(t *testing.T) {
	tc := fullToolCall()
	b := mustJSON(t, tc)
	assertAllKeys(t, reflect.TypeFor[ToolCall](), b)
	if _, err := ParseToolCall(b, Limits{}); err != nil {
		t.Errorf("ToolCall: %v", err)
	}

	m := Manifest{SchemaID: RegistrySchemaID, SchemaVersion: RegistrySchemaVersion, ServerID: "gh", ServerVersion: "1",
		Tools: []Tool{{ToolName: "github", ToolClass: ClassWrite, IsDocumentOp: true,
			DocumentSpec: &DocumentSpec{ContentEncoding: EncodingBase64, WriteContentPointers: []string{"/body"},
				ReadContentPointers: []string{"/content/0/text"}, MaxReadBytes: ptr(int64(1)), MaxWriteBytes: ptr(int64(2)), MaxBatchBytes: ptr(int64(3))},
			TrustLevel: "internal", RiskCategory: "CRITICAL", NetworkOutbound: ptr(true), BuiltIn: ptr(false), SubagentAccess: "denied", RequiresApproval: ptr(false),
			ActionPointer: "/action", Actions: []Action{{Name: "list_prs", ReadOnly: true}}, InputSchema: json.RawMessage(`{"type":"object"}`),
			ToolVersion: "1.2.3", SideEffect: SideEffectExecute, Idempotency: IdempotencyNonIdempotent, ResourcePointer: "/repo",
			PathPointers: []string{"/path"}, WorkspaceRoot: "/work", MaxArgsBytes: ptr(int64(4)),
			DefinitionSHA256: strings.Repeat("5", 64)}},
		Prompts: []Prompt{{Name: "review", Exposure: Exposure{TrustLevel: "verified", RiskCategory: "LOW", SubagentAccess: "read_only",
			RequiresApproval: ptr(true)}, MaxArgsBytes: ptr(int64(5))}},
		Resources: []Resource{{Name: "repo-files", URI: "repo://{owner}/{name}/files{/path*}", Exposure: Exposure{TrustLevel: "community",
			RiskCategory: "HIGH", SubagentAccess: "denied", RequiresApproval: ptr(false)}, NetworkOutbound: ptr(true)}}}
	b = mustJSON(t, m)
	assertAllKeys(t, reflect.TypeFor[Manifest](), b)
	assertAllKeys(t, reflect.TypeFor[Tool](), mustJSON(t, m.Tools[0]))
	assertAllKeys(t, reflect.TypeFor[Prompt](), mustJSON(t, m.Prompts[0]))
	assertAllKeys(t, reflect.TypeFor[Resource](), mustJSON(t, m.Resources[0]))
	assertAllKeys(t, reflect.TypeFor[DocumentSpec](), mustJSON(t, m.Tools[0].DocumentSpec))
	if _, err := ParseManifest(b); err != nil {
		t.Errorf("Manifest: %v", err)
	}

	eff := fullEffect()
	b = mustJSON(t, eff)
	assertAllKeys(t, reflect.TypeFor[ToolEffect](), b)
	if err := ValidateToolEffect(b); err != nil {
		t.Errorf("ToolEffect: %v", err)
	}

	ev := fullReceiptEvent()
	b = mustJSON(t, ev)
	assertAllKeys(t, reflect.TypeFor[Receipt](), mustJSON(t, ev["data"]))
	assertAllKeys(t, reflect.TypeFor[ControlRecord](), mustJSON(t, fullControlRecord()))
	assertAllKeys(t, reflect.TypeFor[ControlCommand](), mustJSON(t, fullControlRecord().Command))
	if err := ValidateReceiptEvent(b); err != nil {
		t.Errorf("receipt event: %v", err)
	}

	d := Decision{ToolCallID: eff.ToolCallID, Phase: PhasePost, Decision: DecisionAllow, ReasonCodes: []string{},
		ReceiptID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d70", RegistryDigest: "sha256:" + strings.Repeat("f", 64),
		Receipt: b, Details: []string{"x"}}
	b = mustJSON(t, d)
	assertAllKeys(t, reflect.TypeFor[Decision](), b)
	if err := ValidateDecision(b); err != nil {
		t.Errorf("Decision: %v", err)
	}
}

func TestEventSchemasReject(t *testing.T) {
	mutations := []struct {
		name   string
		mutate func(ev map[string]any, data map[string]any)
		detail string
	}{
		{"specversion", func(ev, _ map[string]any) { ev["specversion"] = "0.3" }, "/specversion: const"},
		{"id not v7", func(ev, _ map[string]any) { ev["id"] = "0190f5b2-7c1e-4a3b-8d4e-1f2a3b4c5d70" }, "/id: pattern"},
		{"id bad variant", func(ev, _ map[string]any) { ev["id"] = "0190f5b2-7c1e-7a3b-cd4e-1f2a3b4c5d70" }, "/id: pattern"},
		{"source", func(ev, _ map[string]any) { ev["source"] = "https://x" }, "/source: pattern"},
		{"type", func(ev, _ map[string]any) { ev["type"] = TypeToolCall }, "/type: enum"},
		{"unknown attr", func(ev, _ map[string]any) { ev["traceparent"] = "x" }, "additionalProperties"},
		{"alg", func(_, d map[string]any) { d["signature"].(map[string]any)["alg"] = "RS256" }, "/data/signature/alg: const"},
		{"sig not b64url", func(_, d map[string]any) { d["signature"].(map[string]any)["sig"] = strings.Repeat("+", 86) }, "/data/signature/sig: pattern"},
		{"unsigned", func(_, d map[string]any) { delete(d, "signature") }, "required: missing signature"},
		{"seq 0", func(_, d map[string]any) { d["chain"].(map[string]any)["seq"] = 0 }, "/data/chain/seq: minimum"},
		{"content_hash_alg", func(_, d map[string]any) { d["content_hash_alg"] = "sha1" }, "/data/content_hash_alg: const"},
		{"effect id not v7", func(_, d map[string]any) {
			d["effect"].(map[string]any)["effect_id"] = "0190f5b2-7c1e-1a3b-8d4e-1f2a3b4c5d6e"
		}, "/data/effect/effect_id: pattern"},
		{"decision receipt without decision", func(_, d map[string]any) { d["decision"] = "" }, "/data/decision: enum"},
		{"document hash size negative", func(_, d map[string]any) {
			d["document_hashes"].([]any)[0].(map[string]any)["size_bytes"] = -1
		}, "/data/document_hashes/0/size_bytes: minimum"},
	}
	for _, tc := range mutations {
		t.Run(tc.name, func(t *testing.T) {
			var ev map[string]any
			if err := json.Unmarshal(mustJSON(t, fullReceiptEvent()), &ev); err != nil {
				t.Fatal(err)
			}
			tc.mutate(ev, ev["data"].(map[string]any))
			err := ValidateReceiptEvent(mustJSON(t, ev))
			if err == nil || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("want %q, got %v", tc.detail, err)
			}
		})
	}
	// A control receipt may leave call fields empty.
	var ev map[string]any
	_ = json.Unmarshal(mustJSON(t, fullReceiptEvent()), &ev)
	d := ev["data"].(map[string]any)
	ev["type"] = TypeReceiptControl
	for _, k := range []string{"tool_call_id", "trace_id", "correlation_id", "session_id", "ep_id", "server_id", "tool_name",
		"phase", "mode", "decision", "tool_class", "registry_digest", "request_hash", "response_hash", "capability_hash", "envelope_hash"} {
		d[k] = ""
	}
	d["event_type"] = KindControl
	delete(d, "effect")
	if err := ValidateReceiptEvent(mustJSON(t, ev)); err != nil {
		t.Fatalf("control receipt: %v", err)
	}
	// Effects: nil document_hashes marshal as null and are rejected.
	eff := fullEffect()
	eff.DocumentHashes = nil
	if err := ValidateToolEffect(mustJSON(t, eff)); err == nil {
		t.Fatal("null document_hashes accepted")
	}
	if err := ValidateDecision([]byte(`{"tool_call_id":"","phase":"pre","decision":"maybe"}`)); err == nil {
		t.Fatal("bad decision accepted")
	}
}

// TestSchemasStrict walks every embedded schema: each object schema with
// properties forbids additional properties, and each one that also uses
// composition forbids unevaluated properties (REG 9.2.0).
func TestSchemasStrict(t *testing.T) {
	cs, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	for file, doc := range cs.docs {
		if doc.(map[string]any)["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: not draft 2020-12", file)
		}
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case map[string]any:
				_, hasProps := v["properties"]
				composed := v["allOf"] != nil || v["if"] != nil || v["anyOf"] != nil || v["oneOf"] != nil
				// Property schemas inside if/then/else only narrow their parent.
				narrowing := strings.Contains(path, "/if") || strings.Contains(path, "/then") || strings.Contains(path, "/else")
				if hasProps && !narrowing && v["additionalProperties"] != false {
					t.Errorf("%s#%s: additionalProperties is not false", file, path)
				}
				if hasProps && composed && !narrowing && v["unevaluatedProperties"] != false {
					t.Errorf("%s#%s: composed without unevaluatedProperties false", file, path)
				}
				for k, x := range v {
					if k == "properties" || k == "$defs" {
						for name, sub := range x.(map[string]any) {
							walk(path+"/"+k+"/"+name, sub)
						}
						continue
					}
					walk(path+"/"+k, x)
				}
			case []any:
				for i, x := range v {
					walk(path+"/"+strconv.Itoa(i), x)
				}
			}
		}
		walk("", doc)
	}
}
