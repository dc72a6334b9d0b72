package main

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

// TestAccessPolicy covers discovery's rules one by one: unclassified,
// shadowing a built-in, the exfiltration guard and its exemption,
// subagent access, read-only narrowing of actions and capability scopes.
func TestAccessPolicy(t *testing.T) {
	reg := testRegistry(t)
	open := &principal{name: "open"}
	sub := &principal{name: "sub", subagent: true, scopes: scopes(t, "tool:*")}
	ro := &principal{name: "ro", readOnly: true, scopes: scopes(t, "tool:core:*")}
	narrow := &principal{name: "narrow", scopes: scopes(t, "tool:core:github/method:create_issue", "tool:community:notes")}
	cases := []struct {
		name         string
		a            accessPolicy
		p            *principal
		server, tool string
		hiddenCode   string   // "" → visible
		actions      []string // for visible action-based tools
	}{
		{"unclassified", accessPolicy{}, open, "core", "nope", schemas.CodeUnknownTool, nil},
		{"built-in itself", accessPolicy{}, open, "core", "read_file", "", nil},
		{"shadowing a built-in", accessPolicy{}, open, "community", "read_file", schemas.CodeToolShadowed, nil},
		{"community tool listed (approval is the worker's)", accessPolicy{}, open, "community", "notes", "", nil},
		{"network tool, guard off", accessPolicy{}, open, "core", "fetch", "", nil},
		{"network tool, guard on", accessPolicy{blockNetwork: true}, open, "core", "fetch", schemas.CodeNetworkOutboundBlocked, nil},
		{"network tool, exempted", accessPolicy{blockNetwork: true, allowNetwork: []string{"core/fetch"}}, open, "core", "fetch", "", nil},
		{"subagent, denied tool", accessPolicy{}, sub, "core", "deploy", schemas.CodeSubagentDenied, nil},
		{"subagent, read_only tool", accessPolicy{}, sub, "core", "github", "", []string{"list_prs", "get_issue"}},
		{"top agent, every action", accessPolicy{}, open, "core", "github", "", []string{"list_prs", "get_issue", "create_issue"}},
		{"read-only capability, write tool", accessPolicy{}, ro, "core", "deploy", schemas.CodeToolClassMismatch, nil},
		{"read-only capability, actions", accessPolicy{}, ro, "core", "github", "", []string{"list_prs", "get_issue"}},
		{"scope names one action", accessPolicy{}, narrow, "core", "github", "", []string{"create_issue"}},
		{"scope misses the tool", accessPolicy{}, narrow, "core", "fetch", schemas.CodeScopeMismatch, nil},
		{"scope covers another server", accessPolicy{}, narrow, "community", "notes", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.a.reg = reg
			v := c.a.see(c.p, c.server, c.tool)
			if c.hiddenCode != "" {
				if !v.hidden || !slices.Contains(v.codes, c.hiddenCode) || !slices.Contains(v.codes, schemas.CodeToolHidden) {
					t.Fatalf("want hidden with %s, got %+v", c.hiddenCode, v)
				}
				return
			}
			if v.hidden {
				t.Fatalf("want visible, hidden: %v %s", v.codes, v.detail)
			}
			if !slices.Equal(v.actions, c.actions) {
				t.Fatalf("actions %v, want %v", v.actions, c.actions)
			}
		})
	}
}

// TestCheckCall refuses a visible tool's hidden action and passes its
// open ones (the gateway's half of seed 004's dual enforcement).
func TestCheckCall(t *testing.T) {
	a := accessPolicy{reg: testRegistry(t)}
	sub := &principal{name: "sub", subagent: true}
	for action, refused := range map[string]bool{"list_prs": false, "get_issue": false, "create_issue": true, "": true} {
		args, _ := json.Marshal(map[string]any{"action": action})
		codes, _ := a.checkCall(sub, "core", "github", args)
		if got := len(codes) > 0; got != refused {
			t.Errorf("action %q: codes %v, want refused=%v", action, codes, refused)
		}
	}
	if codes, _ := a.checkCall(sub, "core", "deploy", json.RawMessage(`{}`)); !slices.Contains(codes, schemas.CodeSubagentDenied) {
		t.Errorf("deploy by a subagent: %v", codes)
	}
}
