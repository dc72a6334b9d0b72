package enforce

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

// trustManifests are servers of every trust level next to testdata's
// (files: internal built_in read_file/write_file; github: verified;
// assistant: internal built_in github and memory_search).
//
//   - community/search: community, network_outbound
//   - community/post: community write tool
//   - community/vetted: community, requires_approval false
//   - community/read_file: verified, named like files' built_in read_file
//   - community/memory_search: community, named like assistant's built_in
//   - strays/lookup: unknown trust
//   - strays/forced: verified, requires_approval true
//   - strays/plain: no trust metadata at all
//   - strays/search: community, named like community/search (not protected)
const trustManifests = `[
{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "community",
 "tools": [
  {"tool_name": "search", "tool_class": "read", "is_document_op": false, "trust_level": "community", "network_outbound": true},
  {"tool_name": "post", "tool_class": "write", "is_document_op": false, "trust_level": "community"},
  {"tool_name": "vetted", "tool_class": "read", "is_document_op": false, "trust_level": "community", "requires_approval": false},
  {"tool_name": "read_file", "tool_class": "read", "is_document_op": false, "trust_level": "verified"},
  {"tool_name": "memory_search", "tool_class": "read", "is_document_op": false, "trust_level": "community"}
 ]},
{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "strays",
 "tools": [
  {"tool_name": "lookup", "tool_class": "read", "is_document_op": false, "trust_level": "unknown"},
  {"tool_name": "forced", "tool_class": "read", "is_document_op": false, "trust_level": "verified", "requires_approval": true},
  {"tool_name": "plain", "tool_class": "read", "is_document_op": false},
  {"tool_name": "search", "tool_class": "read", "is_document_op": false, "trust_level": "community"}
 ]}
]`

// trustRegistry is testdata's registry plus trustManifests.
func trustRegistry(t testing.TB) *Registry {
	t.Helper()
	var ms [][]byte
	for _, n := range []string{"assistant.json", "files.json", "github.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/registry", n))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, b)
	}
	var extra []json.RawMessage
	if err := json.Unmarshal([]byte(trustManifests), &extra); err != nil {
		t.Fatal(err)
	}
	for _, m := range extra {
		ms = append(ms, m)
	}
	r, err := NewRegistry(ms...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func trustEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := New(Config{Mode: ModeProd, Registry: trustRegistry(t), NewEffectID: func() string { return fixedID }})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestTrustDecidePre: trust levels and requires_approval decide whether a
// call needs a human approval; approval alone is require_approval with
// APPROVAL_REQUIRED only, a deny code beside it makes a deny listing both;
// a tool named like another server's built_in or internal tool is
// TOOL_SHADOWED.
func TestTrustDecidePre(t *testing.T) {
	e := trustEngine(t)
	approval := []string{schemas.CodeApprovalRequired}
	cases := []struct {
		name     string
		env      map[string]any
		decision string
		codes    []string
		detail   string // some detail contains this
	}{
		{"community", envelope("pre", "community", "search", map[string]any{"q": "x"}),
			schemas.DecisionRequireApproval, approval, "trust_level community"},
		{"unknown", envelope("pre", "strays", "lookup", map[string]any{}),
			schemas.DecisionRequireApproval, approval, "trust_level unknown"},
		{"community with requires_approval false", envelope("pre", "community", "vetted", map[string]any{}),
			schemas.DecisionAllow, []string{}, ""},
		{"verified with requires_approval true", envelope("pre", "strays", "forced", map[string]any{}),
			schemas.DecisionRequireApproval, approval, "requires_approval"},
		{"verified", envelope("pre", "github", "list-prs", map[string]any{}),
			schemas.DecisionAllow, []string{}, ""},
		{"internal", envelope("pre", "files", "read_file", map[string]any{"path": "/x"}),
			schemas.DecisionAllow, []string{}, ""},
		{"no trust level", envelope("pre", "strays", "plain", map[string]any{}),
			schemas.DecisionAllow, []string{}, ""},
		{"approval and a deny code", envelope("pre", "community", "post", map[string]any{}),
			schemas.DecisionDeny, []string{schemas.CodeApprovalRequired, schemas.CodeIdempotencyKeyRequired}, "idempotency_key"},
		{"approval with a write key", with(envelope("pre", "community", "post", map[string]any{}), "idempotency_key", "k-1"),
			schemas.DecisionRequireApproval, approval, "talosctl approve " + testCallID},
		{"shadows a built_in of an internal server", envelope("pre", "community", "read_file", map[string]any{"path": "/x"}),
			schemas.DecisionDeny, []string{schemas.CodeToolShadowed}, "server files"},
		{"shadows a built_in and needs approval", envelope("pre", "community", "memory_search", map[string]any{}),
			schemas.DecisionDeny, []string{schemas.CodeToolShadowed, schemas.CodeApprovalRequired}, "server assistant"},
		{"same name as an unprotected tool", envelope("pre", "strays", "search", map[string]any{}),
			schemas.DecisionRequireApproval, approval, ""},
		{"the built_in itself", envelope("pre", "assistant", "memory_search", map[string]any{}),
			schemas.DecisionAllow, []string{}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := e.DecidePre(parse(t, tc.env))
			if out.Decision != tc.decision || !slices.Equal(out.ReasonCodes, tc.codes) {
				t.Fatalf("got %s %v, want %s %v (details %v)", out.Decision, out.ReasonCodes, tc.decision, tc.codes, out.Details)
			}
			if tc.detail != "" && !slices.ContainsFunc(out.Details, func(d string) bool { return strings.Contains(d, tc.detail) }) {
				t.Fatalf("no detail names %q: %v", tc.detail, out.Details)
			}
		})
	}
}

// TestTrustPostPhase: approval and shadowing are decided in phase pre; a
// post event of a community tool carries neither code.
func TestTrustPostPhase(t *testing.T) {
	e := trustEngine(t)
	for _, tool := range []string{"search", "read_file"} {
		env := envelope("post", "community", tool, map[string]any{"q": "x"})
		env["result"] = text("done")
		if out := e.DecidePost(parse(t, env)); out.Decision != schemas.DecisionAllow || len(out.ReasonCodes) != 0 {
			t.Errorf("post of community/%s: %s %v", tool, out.Decision, out.ReasonCodes)
		}
	}
}

// TestTrustThroughDecider: the Decider keeps the engine's
// require_approval, and puts the incident codes in front: a kill switch
// turns it into a deny listing both.
func TestTrustThroughDecider(t *testing.T) {
	d, err := NewDecider(trustEngine(t), DeciderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env := envelope("pre", "community", "search", map[string]any{"q": "x"})
	if r, _ := mustDecide(t, d, env); r.Decision != schemas.DecisionRequireApproval ||
		!slices.Equal(r.ReasonCodes, []string{schemas.CodeApprovalRequired}) || r.ResultCode != schemas.CodeApprovalRequired {
		t.Fatalf("community call: %s %v result %s", r.Decision, r.ReasonCodes, r.ResultCode)
	}
	if err := d.Apply(1, ctl(schemas.VerbKillSwitchSet, scope("server:community")), t0); err != nil {
		t.Fatal(err)
	}
	if r, _ := mustDecide(t, d, env); r.Decision != schemas.DecisionDeny ||
		!slices.Equal(r.ReasonCodes, []string{schemas.CodeKillSwitch, schemas.CodeApprovalRequired}) {
		t.Fatalf("community call under a kill switch: %s %v", r.Decision, r.ReasonCodes)
	}
}

// subagentEnvelope is a phase-pre call of server/tool with args, made
// under a capability chain of depth delegations whose every link covers
// tool:*, sender-signed by the chain's holder at capNow.
func subagentEnvelope(t *testing.T, depth int, server, tool string, args map[string]any) map[string]any {
	t.Helper()
	every := []string{"tool:*"}
	chain := capBuild{depth: depth,
		root:  func(c *schemas.Capability) { c.Scopes = every },
		deleg: func(_ int, d *schemas.Delegation) { d.ChildScope = every },
	}.build(t)
	env := envelope("pre", server, tool, args)
	env["issued_at"] = capNow.Format(schemas.TimeFormat)
	env["actor"] = map[string]any{"kind": "agent", "agent_id": capAgent(depth)}
	env["capability"] = capTree(t, chain)
	reqJSON, err := json.Marshal(env["request"])
	if err != nil {
		t.Fatal(err)
	}
	reqHash, err := canonicalHash(reqJSON)
	if err != nil {
		t.Fatal(err)
	}
	chainHash, err := ChainHash(chain)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := SignEnvelope(capKey(t, depth+1), schemas.EnvelopeSignedFields{
		Type: schemas.EnvelopeSignatureV1, CorrelationID: env["correlation_id"].(string), CapabilityHash: chainHash,
		RequestHash: reqHash, Tool: server + ":" + tool, Method: schemas.MethodToolsCall,
		Timestamp: env["issued_at"].(string), SessionID: env["session_id"].(string),
	})
	if err != nil {
		t.Fatal(err)
	}
	env["sender_signature"] = capTree(t, sig)
	return env
}

// TestSubagentAccess: a caller whose verified chain has a delegation is a
// subagent: subagent_access denied is SUBAGENT_ACCESS_DENIED, read_only
// refuses write actions of an action-based tool (TOOL_CLASS_MISMATCH) and
// keeps its read actions; the root holder is unaffected. Without an
// Authorizer, the envelope's own delegations narrow the same way.
func TestSubagentAccess(t *testing.T) {
	withAuth, err := NewDecider(trustEngine(t), DeciderOptions{Capabilities: capAuthorizer(t), RequireCapability: true})
	if err != nil {
		t.Fatal(err)
	}
	noAuth, err := NewDecider(trustEngine(t), DeciderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keyed := func(env map[string]any) map[string]any { return with(env, "idempotency_key", "k-1") }
	cases := []struct {
		name     string
		depth    int
		server   string
		tool     string
		args     map[string]any
		decision string
		codes    []string
	}{
		{"subagent: denied tool", 1, "assistant", "memory_search", map[string]any{}, schemas.DecisionDeny, []string{schemas.CodeSubagentDenied}},
		{"subagent: read_only tool, write action", 1, "assistant", "github", map[string]any{"action": "create_issue"}, schemas.DecisionDeny, []string{schemas.CodeToolClassMismatch}},
		{"subagent: read_only tool, read action", 1, "assistant", "github", map[string]any{"action": "list_prs"}, schemas.DecisionAllow, []string{}},
		{"subagent: full tool", 2, "files", "read_file", map[string]any{"path": "/x"}, schemas.DecisionAllow, []string{}},
		{"subagent: no subagent_access means full", 1, "github", "create-pr", map[string]any{"title": "t", "body": "b", "files": []any{map[string]any{"content": "c"}}}, schemas.DecisionAllow, []string{}},
		{"root holder: denied tool", 0, "assistant", "memory_search", map[string]any{}, schemas.DecisionAllow, []string{}},
		{"root holder: write action", 0, "assistant", "github", map[string]any{"action": "create_issue"}, schemas.DecisionAllow, []string{}},
	}
	for _, tc := range cases {
		for _, d := range []struct {
			name string
			dec  *Decider
		}{{"authorizer", withAuth}, {"no authorizer", noAuth}} {
			t.Run(tc.name+"/"+d.name, func(t *testing.T) {
				raw, err := json.Marshal(keyed(subagentEnvelope(t, tc.depth, tc.server, tc.tool, tc.args)))
				if err != nil {
					t.Fatal(err)
				}
				// Decided at capNow, inside the chain's validity.
				r, details, err := d.dec.Decide("talos.call.pre.gw-1."+tc.server, raw, capNow)
				if err != nil {
					t.Fatal(err)
				}
				if r.Decision != tc.decision || !slices.Equal(r.ReasonCodes, tc.codes) {
					t.Fatalf("got %s %v, want %s %v (details %v)", r.Decision, r.ReasonCodes, tc.decision, tc.codes, details)
				}
				if len(tc.codes) > 0 && !slices.ContainsFunc(details, func(s string) bool { return strings.Contains(s, "subagent_access") }) {
					t.Fatalf("no detail names subagent_access: %v", details)
				}
			})
		}
	}
}

// TestEgressKillSwitch: an egress scope denies network_outbound tools of
// the calls it covers (NETWORK_OUTBOUND_BLOCKED, not KILL_SWITCH) and
// leaves other tools, other sessions and agents, and post events alone.
func TestEgressKillSwitch(t *testing.T) {
	blocked := []string{schemas.CodeNetworkOutboundBlocked}
	net := func(agent, sess string) map[string]any { // github/list-prs is network_outbound
		env := envelope("pre", "github", "list-prs", map[string]any{})
		env["actor"] = map[string]any{"kind": "agent", "agent_id": agent}
		env["session_id"] = sess
		return env
	}
	local := func(agent, sess string) map[string]any { // files/read_file is not
		env := envelope("pre", "files", "read_file", map[string]any{"path": "/x"})
		env["actor"] = map[string]any{"kind": "agent", "agent_id": agent}
		env["session_id"] = sess
		return env
	}
	cases := []struct {
		name   string
		scopes []string
		env    map[string]any
		codes  []string
	}{
		{"global blocks a network tool", []string{"egress:global"}, net("a1", "s1"), blocked},
		{"global spares a local tool", []string{"egress:global"}, local("a1", "s1"), []string{}},
		{"session blocks its session", []string{"egress:session:s1"}, net("a1", "s1"), blocked},
		{"session spares another session", []string{"egress:session:s1"}, net("a1", "s2"), []string{}},
		{"session spares a local tool", []string{"egress:session:s1"}, local("a1", "s1"), []string{}},
		{"agent blocks its agent", []string{"egress:agent:a1"}, net("a1", "s9"), blocked},
		{"agent spares another agent", []string{"egress:agent:a1"}, net("a2", "s1"), []string{}},
		{"three scopes: one code", []string{"egress:global", "egress:agent:a1", "egress:session:s1"}, net("a1", "s1"), blocked},
		{"session scope is not an egress scope", []string{"session:s2"}, net("a1", "s1"), []string{}},
		{"action-based network tool", []string{"egress:global"}, with(envelope("pre", "assistant", "github", map[string]any{"action": "list_prs"}), "idempotency_key", "k"), blocked},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := deciderWith(t, nil)
			for i, s := range tc.scopes {
				if err := d.Apply(uint64(i+1), ctl(schemas.VerbKillSwitchSet, scope(s)), t0); err != nil {
					t.Fatal(err)
				}
			}
			r, details := mustDecide(t, d, tc.env)
			want := schemas.DecisionAllow
			if len(tc.codes) > 0 {
				want = schemas.DecisionDeny
			}
			if r.Decision != want || !slices.Equal(r.ReasonCodes, tc.codes) {
				t.Fatalf("got %s %v, want %s %v (details %v)", r.Decision, r.ReasonCodes, want, tc.codes, details)
			}
			if len(tc.codes) > 0 && len(details) != len(tc.scopes) {
				t.Fatalf("%d details for %d scopes: %v", len(details), len(tc.scopes), details)
			}
		})
	}

	// Cleared, the tool works again; post events are never blocked.
	d := deciderWith(t, nil)
	if err := d.Apply(1, ctl(schemas.VerbKillSwitchSet, scope("egress:session:s1")), t0); err != nil {
		t.Fatal(err)
	}
	post := net("a1", "s1")
	post["phase"] = "post"
	post["result"] = text("ok")
	if r, _ := mustDecide(t, d, post); r.Decision != schemas.DecisionAllow {
		t.Fatalf("post event under egress: %s %v", r.Decision, r.ReasonCodes)
	}
	if v := d.State().View(); len(v.KillSwitches) != 1 || v.KillSwitches[0].Target != "egress:session:s1" {
		t.Fatalf("kill switch list: %+v", v.KillSwitches)
	}
	if err := d.Apply(2, ctl(schemas.VerbKillSwitchClear, scope("egress:session:s1")), t0); err != nil {
		t.Fatal(err)
	}
	if r, _ := mustDecide(t, d, net("a1", "s1")); r.Decision != schemas.DecisionAllow {
		t.Fatalf("after clear: %s %v", r.Decision, r.ReasonCodes)
	}
	if code, _ := d.State().Precheck(ctl(schemas.VerbKillSwitchSet, scope("egress:tool:files/read_file")).Command); code != schemas.CtlInvalid {
		t.Fatalf("egress:tool precheck: %q, want %s", code, schemas.CtlInvalid)
	}
}
