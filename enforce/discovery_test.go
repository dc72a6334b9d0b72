package enforce_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

func testRegistry(t *testing.T) *enforce.Registry {
	t.Helper()
	core := `{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"core","tools":[
	 {"tool_name":"read_file","tool_class":"read","is_document_op":false,"built_in":true},
	 {"tool_name":"fetch","tool_class":"read","is_document_op":false,"network_outbound":true},
	 {"tool_name":"deploy","tool_class":"write","is_document_op":false,"subagent_access":"denied"},
	 {"tool_name":"github","tool_class":"write","is_document_op":false,"subagent_access":"read_only","action_pointer":"/action",
	  "actions":[{"name":"list_prs","read_only":true},{"name":"get_issue","read_only":true},{"name":"create_issue","read_only":false}]}]}`
	community := `{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"community","tools":[
	 {"tool_name":"read_file","tool_class":"read","is_document_op":false,"trust_level":"community"},
	 {"tool_name":"notes","tool_class":"read","is_document_op":false,"trust_level":"community"}]}`
	reg, err := enforce.NewRegistry([]byte(core), []byte(community))
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func scopes(t *testing.T, ss ...string) []enforce.Scope {
	var out []enforce.Scope
	for _, s := range ss {
		sc, err := enforce.ParseScope(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sc)
	}
	return out
}

// TestDiscoverySee covers discovery's rules one by one: unclassified,
// shadowing a built-in, the exfiltration guard and its exemption,
// subagent access, read-only narrowing of actions and capability scopes.
func TestDiscoverySee(t *testing.T) {
	reg := testRegistry(t)
	open := enforce.Viewer{}
	sub := enforce.Viewer{Subagent: true, Scopes: scopes(t, "tool:*")}
	ro := enforce.Viewer{ReadOnly: true, Scopes: scopes(t, "tool:core:*")}
	narrow := enforce.Viewer{Scopes: scopes(t, "tool:core:github/method:create_issue", "tool:community:notes")}
	cases := []struct {
		name         string
		d            enforce.Discovery
		v            enforce.Viewer
		server, tool string
		hiddenCode   string   // "" → visible
		actions      []string // for visible action-based tools
	}{
		{"unclassified", enforce.Discovery{}, open, "core", "nope", schemas.CodeUnknownTool, nil},
		{"built-in itself", enforce.Discovery{}, open, "core", "read_file", "", nil},
		{"shadowing a built-in", enforce.Discovery{}, open, "community", "read_file", schemas.CodeToolShadowed, nil},
		{"community tool listed (approval is the worker's)", enforce.Discovery{}, open, "community", "notes", "", nil},
		{"network tool, guard off", enforce.Discovery{}, open, "core", "fetch", "", nil},
		{"network tool, guard on", enforce.Discovery{BlockNetwork: true}, open, "core", "fetch", schemas.CodeNetworkOutboundBlocked, nil},
		{"network tool, exempted", enforce.Discovery{BlockNetwork: true, AllowNetwork: []string{"core/fetch"}}, open, "core", "fetch", "", nil},
		{"subagent, denied tool", enforce.Discovery{}, sub, "core", "deploy", schemas.CodeSubagentDenied, nil},
		{"subagent, read_only tool", enforce.Discovery{}, sub, "core", "github", "", []string{"list_prs", "get_issue"}},
		{"top agent, every action", enforce.Discovery{}, open, "core", "github", "", []string{"list_prs", "get_issue", "create_issue"}},
		{"read-only capability, write tool", enforce.Discovery{}, ro, "core", "deploy", schemas.CodeToolClassMismatch, nil},
		{"read-only capability, actions", enforce.Discovery{}, ro, "core", "github", "", []string{"list_prs", "get_issue"}},
		{"scope names one action", enforce.Discovery{}, narrow, "core", "github", "", []string{"create_issue"}},
		{"scope misses the tool", enforce.Discovery{}, narrow, "core", "fetch", schemas.CodeScopeMismatch, nil},
		{"scope covers another server", enforce.Discovery{}, narrow, "community", "notes", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.d.Registry = reg
			v := c.d.See(c.v, c.server, c.tool)
			if c.hiddenCode != "" {
				if !v.Hidden || !slices.Contains(v.Codes, c.hiddenCode) || !slices.Contains(v.Codes, schemas.CodeToolHidden) {
					t.Fatalf("want hidden with %s, got %+v", c.hiddenCode, v)
				}
				return
			}
			if v.Hidden {
				t.Fatalf("want visible, hidden: %v %s", v.Codes, v.Detail)
			}
			if !slices.Equal(v.Actions, c.actions) {
				t.Fatalf("actions %v, want %v", v.Actions, c.actions)
			}
		})
	}
}

// TestDiscoveryCheckCall refuses a visible tool's hidden action and passes its
// open ones (the gateway's half of CM-WRAPPER's dual enforcement).
func TestDiscoveryCheckCall(t *testing.T) {
	d := enforce.Discovery{Registry: testRegistry(t)}
	sub := enforce.Viewer{Subagent: true}
	for action, refused := range map[string]bool{"list_prs": false, "get_issue": false, "create_issue": true, "": true} {
		args, _ := json.Marshal(map[string]any{"action": action})
		codes, _ := d.CheckCall(sub, "core", "github", args)
		if got := len(codes) > 0; got != refused {
			t.Errorf("action %q: codes %v, want refused=%v", action, codes, refused)
		}
	}
	if codes, _ := d.CheckCall(sub, "core", "deploy", json.RawMessage(`{}`)); !slices.Contains(codes, schemas.CodeSubagentDenied) {
		t.Errorf("deploy by a subagent: %v", codes)
	}
}

// TestViewerOf: the holder's scopes are the last delegation's, read_only
// on any link narrows, and a delegation makes a subagent; a scope that
// does not parse is an error, not an open view.
func TestViewerOf(t *testing.T) {
	root := schemas.Capability{Scopes: []string{"tool:*"}}
	v, err := enforce.ViewerOf(&schemas.CapabilityChain{Capability: root})
	if err != nil || v.Subagent || v.ReadOnly || len(v.Scopes) != 1 || !v.Covers("core", "deploy", "") {
		t.Fatalf("root only: %+v %v", v, err)
	}
	chain := &schemas.CapabilityChain{Capability: root, Delegations: []schemas.Delegation{
		{ChildScope: []string{"tool:core:*"}, Constraints: &schemas.Constraints{ReadOnly: true}},
		{ChildScope: []string{"tool:core:github/method:list_prs"}},
	}}
	v, err = enforce.ViewerOf(chain)
	if err != nil || !v.Subagent || !v.ReadOnly {
		t.Fatalf("delegated: %+v %v", v, err)
	}
	if !v.Covers("core", "github", "list_prs") || v.Covers("core", "github", "create_issue") || v.Covers("core", "deploy", "") {
		t.Fatalf("delegated scopes are not the last delegation's: %+v", v.Scopes)
	}
	if !(enforce.Viewer{}).Covers("any", "tool", "") {
		t.Fatal("no capability: discovery must be limited by the registry only")
	}
	if _, err := enforce.ViewerOf(&schemas.CapabilityChain{Capability: schemas.Capability{Scopes: []string{"nonsense"}}}); err == nil {
		t.Fatal("an unparsable scope gave a view")
	}
}
