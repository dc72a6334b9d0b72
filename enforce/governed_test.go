package enforce

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// docsManifest has a tool, prompts and resources (a template and a URI).
const docsManifest = `{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"docs","server_version":"2.1.0",
 "tools":[{"tool_name":"search","tool_class":"read","is_document_op":false}],
 "prompts":[{"name":"summarize","trust_level":"verified"},{"name":"risky","trust_level":"community"}],
 "resources":[{"name":"pages","uri":"docs://pages/{id}","trust_level":"verified"},{"name":"index","uri":"docs://index"}]}`

func governedDecider(t *testing.T, mode Mode) *Decider {
	t.Helper()
	reg, err := NewRegistry([]byte(docsManifest))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Mode: mode, Registry: reg, NewEffectID: func() string { return fixedID }})
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDecider(e, DeciderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestGovernedPromptsAndResources (issue 21): a prompts/get and a
// resources/read are decided by the registry's prompts and resources like
// tools: listed ones allowed (or parked by their trust level), unlisted
// ones unclassified (denied in prod, a warning in dev), a URI outside the
// entry it claims unclassified, their arguments held to their shapes;
// names do not cross methods; the receipt and the event name the method.
func TestGovernedPromptsAndResources(t *testing.T) {
	unclassified := []string{schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}
	for _, tc := range []struct {
		name, method, tool string
		args               map[string]any
		mode               Mode
		decision           string
		codes              []string
	}{
		{"listed prompt", schemas.MethodPromptsGet, "summarize", map[string]any{"topic": "x"}, ModeProd, schemas.DecisionAllow, nil},
		{"community prompt", schemas.MethodPromptsGet, "risky", map[string]any{}, ModeProd, schemas.DecisionRequireApproval, []string{schemas.CodeApprovalRequired}},
		{"unlisted prompt", schemas.MethodPromptsGet, "other", map[string]any{}, ModeProd, schemas.DecisionDeny, unclassified},
		{"unlisted prompt in dev", schemas.MethodPromptsGet, "other", map[string]any{}, ModeDev, schemas.DecisionAllow, []string{schemas.CodeToolUnclassifiedAllowedDev}},
		{"a tool got as a prompt", schemas.MethodPromptsGet, "search", map[string]any{}, ModeProd, schemas.DecisionDeny, unclassified},
		{"a prompt called as a tool", "", "summarize", map[string]any{}, ModeProd, schemas.DecisionDeny, unclassified},
		{"prompt argument not a string", schemas.MethodPromptsGet, "summarize", map[string]any{"n": 1}, ModeProd, schemas.DecisionDeny, []string{schemas.CodeDenySchemaViolation}},
		{"templated resource", schemas.MethodResourcesRead, "pages", map[string]any{"uri": "docs://pages/7"}, ModeProd, schemas.DecisionAllow, nil},
		{"literal resource", schemas.MethodResourcesRead, "index", map[string]any{"uri": "docs://index"}, ModeProd, schemas.DecisionAllow, nil},
		{"URI outside its entry", schemas.MethodResourcesRead, "index", map[string]any{"uri": "docs://pages/7"}, ModeProd, schemas.DecisionDeny, unclassified},
		{"URI outside the template", schemas.MethodResourcesRead, "pages", map[string]any{"uri": "docs://pages/7/secret"}, ModeProd, schemas.DecisionDeny, unclassified},
		{"unlisted resource", schemas.MethodResourcesRead, "elsewhere", map[string]any{"uri": "docs://elsewhere"}, ModeProd, schemas.DecisionDeny, unclassified},
		{"a sampling request", schemas.MethodSamplingCreateMessage, schemas.MethodSamplingCreateMessage, map[string]any{"messages": []any{}, "maxTokens": 10}, ModeProd, schemas.DecisionAllow, nil},
		{"an elicitation request", schemas.MethodElicitationCreate, schemas.MethodElicitationCreate, map[string]any{"message": "name?"}, ModeProd, schemas.DecisionAllow, nil},
		{"a server request named otherwise", schemas.MethodElicitationCreate, "summarize", map[string]any{}, ModeProd, schemas.DecisionDeny, unclassified},
		{"resource read with more than its uri", schemas.MethodResourcesRead, "index", map[string]any{"uri": "docs://index", "x": "y"}, ModeProd, schemas.DecisionDeny, []string{schemas.CodeDenyUnknownFields}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := envelope("pre", "docs", tc.tool, tc.args)
			if tc.method != "" {
				env["mcp_method"] = tc.method
			}
			raw, _ := json.Marshal(env)
			out, err := governedDecider(t, tc.mode).DecideCall("talos.call.pre.gw-1.docs", raw, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			r := out.Receipt
			if r.Decision != tc.decision || !slices.Equal(r.ReasonCodes, append([]string{}, tc.codes...)) {
				t.Fatalf("%s %v (%v), want %s %v", r.Decision, r.ReasonCodes, out.Details, tc.decision, tc.codes)
			}
			if r.MCPMethod != tc.method || r.ToolName != tc.tool || r.ToolID != "docs/"+tc.tool {
				t.Fatalf("receipt names %q %q %q", r.MCPMethod, r.ToolName, r.ToolID)
			}
			if ev := out.ToolCall; ev != nil && ev.MCPMethod != tc.method {
				t.Fatalf("event mcp_method %q", ev.MCPMethod)
			}
		})
	}
}

// TestRegistryMatchResource: a URI is named by the first resource whose
// uri matches it; a bad template is refused with the registry.
func TestRegistryMatchResource(t *testing.T) {
	reg, err := NewRegistry([]byte(docsManifest))
	if err != nil {
		t.Fatal(err)
	}
	for uri, want := range map[string]string{"docs://pages/7": "pages", "docs://index": "index", "docs://pages/7/x": "", "docs://other": ""} {
		name, _, ok := reg.MatchResource("docs", uri)
		if name != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", uri, name, ok, want)
		}
	}
	if _, _, ok := reg.MatchResource("elsewhere", "docs://index"); ok {
		t.Error("a URI matched on another server")
	}
	if tl, ok := reg.LookupMethod("docs", schemas.MethodPromptsGet, "summarize"); !ok || tl.ToolClass != schemas.ClassRead {
		t.Errorf("LookupMethod summarize: %+v %v", tl, ok)
	}
	if _, ok := reg.LookupMethod("docs", "", "summarize"); ok {
		t.Error("a prompt was found as a tool")
	}
	bad := `{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"x","tools":[],"resources":[{"name":"r","uri":"x://{unclosed"}]}`
	if _, err := NewRegistry([]byte(bad)); err == nil {
		t.Error("a resource uri that is no URI template was accepted")
	}
}

// TestSenderSignatureNamesTheMethod: the sender signature covers the
// envelope's mcp_method, so a signature made for a tools/call does not
// verify as a prompts/get of the same name, and one made for the
// prompts/get does.
func TestSenderSignatureNamesTheMethod(t *testing.T) {
	a := capAuthorizer(t)
	r := capRequest(t, capChain(t, 0)) // signed as a tools/call
	r.MCPMethod = schemas.MethodPromptsGet
	res := a.Authorize(r)
	if !slices.Contains(res.Codes, schemas.CodeSignatureInvalid) {
		t.Fatalf("a tools/call's signature verified as a prompts/get: %v", res.Codes)
	}
	capSignSender(t, r, capKey(t, 1))
	capWantCodes(t, a.Authorize(r))
}

// TestServerRequestRecorded: a server's request of its client is recorded
// without a capability even where every call needs one (it is made during
// a call that had one), names the call it happened in, and is still
// subject to the incident state.
func TestServerRequestRecorded(t *testing.T) {
	reg, err := NewRegistry([]byte(docsManifest))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Mode: ModeProd, Registry: reg, NewEffectID: func() string { return fixedID }})
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDecider(e, DeciderOptions{Capabilities: capAuthorizer(t), RequireCapability: true})
	if err != nil {
		t.Fatal(err)
	}
	env := envelope("pre", "docs", schemas.MethodSamplingCreateMessage, map[string]any{"messages": []any{}})
	env["mcp_method"] = schemas.MethodSamplingCreateMessage
	env["parent_tool_call_id"] = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f"
	raw, _ := json.Marshal(env)
	out, err := d.DecideCall("talos.call.pre.gw-1.docs", raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r := out.Receipt; r.Decision != schemas.DecisionAllow || r.ParentToolCallID != "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f" {
		t.Fatalf("%s %v (%v), parent %q", r.Decision, r.ReasonCodes, out.Details, r.ParentToolCallID)
	}
	// roots/list likewise, also when a server asks outside any call.
	roots := envelope("pre", "docs", schemas.MethodRootsList, map[string]any{})
	roots["mcp_method"] = schemas.MethodRootsList
	raw, _ = json.Marshal(roots)
	if out, err = d.DecideCall("talos.call.pre.gw-1.docs", raw, time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := out.Receipt; r.Decision != schemas.DecisionAllow || r.MCPMethod != schemas.MethodRootsList || r.ParentToolCallID != "" {
		t.Fatalf("roots/list: %s %v (%v), method %q, parent %q", r.Decision, r.ReasonCodes, out.Details, r.MCPMethod, r.ParentToolCallID)
	}
	if err := d.Apply(1, ctl(schemas.VerbKillSwitchSet, scope("server:docs")), t0); err != nil {
		t.Fatal(err)
	}
	env["correlation_id"] = "r3V2bH7pR9sT1uW4xY6zAc"
	raw, _ = json.Marshal(env)
	out, err = d.DecideCall("talos.call.pre.gw-1.docs", raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r := out.Receipt; r.Decision != schemas.DecisionDeny || !slices.Contains(r.ReasonCodes, schemas.CodeKillSwitch) {
		t.Fatalf("under a kill switch of its server: %s %v", r.Decision, r.ReasonCodes)
	}
}
