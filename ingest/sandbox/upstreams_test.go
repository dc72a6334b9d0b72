package sandbox

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
)

// upstreamsRegistry: fs roots its paths at root, two roots them in two
// places, bare says nothing of workspaces.
func upstreamsRegistry(t *testing.T, root string) *enforce.Registry {
	t.Helper()
	m := func(server, tools string) []byte {
		return []byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"` + server + `","tools":[` + tools + `]}`)
	}
	tool := func(name, extra string) string {
		return `{"tool_name":"` + name + `","tool_class":"read","is_document_op":false` + extra + `}`
	}
	paths := func(r string) string { return `,"path_pointers":["/path"],"workspace_root":"` + r + `"` }
	reg, err := enforce.NewRegistry(
		m("fs", tool("read", paths(root))),
		m("two", tool("a", paths("/srv/a"))+","+tool("b", paths("/srv/b"))),
		m("bare", tool("echo", "")),
	)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestForUpstreamsConfigErrors: what the operator must fix is ErrConfig,
// found before any sandbox is tried; a sandbox that cannot be set up is
// ErrSetup.
func TestForUpstreamsConfigErrors(t *testing.T) {
	ws := t.TempDir()
	reg := upstreamsRegistry(t, ws)
	stdio := func(id string) mcpup.Spec { return mcpup.Spec{ServerID: id, Command: []string{"/bin/true"}} }
	noEnv := func(string) (string, bool) { return "", false }
	cases := []struct {
		name   string
		specs  []mcpup.Spec
		o      Upstreams
		config bool
		want   string
	}{
		{"no workspace", []mcpup.Spec{stdio("bare")}, Upstreams{}, true, `no workspace for server "bare"`},
		{"several registry roots", []mcpup.Spec{stdio("two")}, Upstreams{}, true, "several workspace_root values"},
		{"variable not set", []mcpup.Spec{stdio("fs")}, Upstreams{Env: map[string][]string{"fs": {"NOPE"}}, LookupEnv: noEnv}, true,
			"--sandbox-env fs=NOPE: NOPE is not set"},
		{"bwrap missing", []mcpup.Spec{stdio("fs")}, Upstreams{Bwrap: "/nonexistent/bwrap"}, false, "bubblewrap not found"},
		{"egress without network_outbound", []mcpup.Spec{stdio("fs")}, Upstreams{Egress: map[string][]string{"fs": {"a.example:443"}}}, false, "network_outbound"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set, err := ForUpstreams(context.Background(), c.specs, reg, c.o)
			if err == nil || set != nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ForUpstreams: %v, %v; want an error naming %q", set, err, c.want)
			}
			if errors.Is(err, ErrConfig) != c.config || errors.Is(err, ErrSetup) == c.config {
				t.Fatalf("%v: ErrConfig %v, ErrSetup %v; want ErrConfig %v", err, errors.Is(err, ErrConfig), errors.Is(err, ErrSetup), c.config)
			}
		})
	}
}

// TestForUpstreams: every stdio upstream is wrapped in a real sandbox with
// its workspace (given, or the registry's) and its declared variables; an
// HTTP upstream is left alone.
func TestForUpstreams(t *testing.T) {
	needBwrap(t)
	regRoot, given := t.TempDir(), t.TempDir()
	reg := upstreamsRegistry(t, regRoot)
	specs := []mcpup.Spec{
		{ServerID: "fs", Command: []string{"/bin/sh", "-c", "pwd; echo $TOKEN"}},
		{ServerID: "bare", Command: []string{"/bin/sh", "-c", "pwd"}},
		{ServerID: "docs", URL: "https://docs.example/mcp"},
	}
	env := func(k string) (string, bool) { return "tok-1", k == "TOKEN" }
	set, err := ForUpstreams(context.Background(), specs, reg, Upstreams{
		Workspaces: map[string]string{"bare": given},
		Env:        map[string][]string{"fs": {"TOKEN"}},
		LookupEnv:  env,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	if len(set) != 2 || specs[2].Wrap != nil || specs[0].Wrap == nil || specs[1].Wrap == nil {
		t.Fatalf("%d sandboxes; wraps %v %v %v", len(set), specs[0].Wrap != nil, specs[1].Wrap != nil, specs[2].Wrap != nil)
	}
	if !slices.Equal(specs[0].Env, []string{"TOKEN=tok-1"}) || specs[1].Env != nil {
		t.Fatalf("env %q %q", specs[0].Env, specs[1].Env)
	}
	for i, want := range []string{regRoot + "\ntok-1\n", given + "\n"} {
		if out := runWrapped(t, specs[i]); out != want {
			t.Fatalf("%s inside its sandbox: %q, want %q", specs[i].ServerID, out, want)
		}
	}
}

// runWrapped runs a spec's command through its Wrap.
func runWrapped(t *testing.T, s mcpup.Spec) string {
	t.Helper()
	argv, env, err := s.Wrap(s.Command, s.Env)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", s.ServerID, err, out)
	}
	return string(out)
}
