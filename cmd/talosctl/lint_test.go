package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce/registrylint"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

func ptr[T any](v T) *T { return &v }

// TestLintTools covers every finding kind on a hand-made manifest and tool
// list, and their order.
func TestLintTools(t *testing.T) {
	schema := func(s string) any {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := &schemas.Manifest{ServerID: "svc", Tools: []schemas.Tool{
		{ToolName: "read_doc", ToolClass: "read"},
		{ToolName: "mail", ToolClass: "write", ActionPointer: "/op/name", Actions: []schemas.Action{
			{Name: "search", ReadOnly: true}, {Name: "send"}, {Name: "recall"},
		}},
		{ToolName: "free_text", ToolClass: "read", ActionPointer: "/action", Actions: []schemas.Action{{Name: "x", ReadOnly: true}}},
		{ToolName: "fetch", ToolClass: "read", NetworkOutbound: ptr(false)},
		{ToolName: "peek", ToolClass: "write"},
		{ToolName: "cron", ToolClass: "write"},
		{ToolName: "gone", ToolClass: "read"},
	}}
	live := []*mcp.Tool{
		{Name: "read_doc", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		{Name: "mail", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
			InputSchema: schema(`{"properties":{"op":{"properties":{"name":{"enum":["search","send","label"]}}}}}`)},
		{Name: "free_text", InputSchema: schema(`{"properties":{"action":{"type":"string"}}}`)},
		{Name: "fetch", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(true)}},
		{Name: "peek", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		{Name: "cron", InputSchema: schema(`{"properties":{"action":{"enum":["list","add"]}}}`)},
		{Name: "delete_all", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}},
		{Name: "list_all", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		{Name: "list_all"}, // listed twice: reported once
	}
	got := registrylint.Compare(m, live, mcpup.ActionEnum)
	type key struct{ kind, tool, action string }
	var keys []key
	for _, f := range got {
		keys = append(keys, key{f.Kind, f.Tool, f.Action})
		if f.Severity != registrylint.Severity(f.Kind) || f.Detail == "" {
			t.Errorf("finding %+v: severity or detail wrong", f)
		}
	}
	want := []key{
		{registrylint.Missing, "delete_all", ""},
		{registrylint.Missing, "list_all", ""},
		{registrylint.MissingAction, "mail", "label"},
		{registrylint.Stale, "gone", ""},
		{registrylint.StaleAction, "mail", "recall"},
		{registrylint.NoActionEnum, "free_text", ""},
		{registrylint.Advisory, "cron", ""},  // enum at /action without action_pointer
		{registrylint.Advisory, "fetch", ""}, // openWorldHint vs network_outbound
		{registrylint.Advisory, "mail", ""},  // readOnlyHint vs write actions
		{registrylint.Advisory, "peek", ""},  // readOnlyHint vs tool_class write
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("findings:\n%v\nwant:\n%v", keys, want)
	}
	for _, f := range got {
		switch {
		case f.Kind == registrylint.Missing && f.Tool == "delete_all" && f.Suggested != "write",
			f.Kind == registrylint.Missing && f.Tool == "list_all" && f.Suggested != "read":
			t.Errorf("%s: suggested tool_class %q", f.Tool, f.Suggested)
		case f.Tool == "mail" && f.Kind == registrylint.Advisory && !strings.Contains(f.Detail, "send, recall"):
			t.Errorf("mail advisory does not name the write actions: %s", f.Detail)
		}
	}

	// A read tool the server does not call read-only is the dangerous
	// direction; annotations absent say nothing, so no advisory.
	m2 := &schemas.Manifest{ServerID: "svc", Tools: []schemas.Tool{{ToolName: "a", ToolClass: "read"}, {ToolName: "b", ToolClass: "read"}}}
	got = registrylint.Compare(m2, []*mcp.Tool{{Name: "a", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}}, {Name: "b"}}, mcpup.ActionEnum)
	if len(got) != 1 || got[0].Kind != registrylint.Advisory || got[0].Tool != "a" || !strings.Contains(got[0].Detail, "destructiveHint=true") {
		t.Fatalf("read tool with destructive hints: %+v", got)
	}
}

// inspectorTools lists a stdio server's tools with the MCP Inspector's CLI:
// an oracle independent of the Go SDK that talosctl uses.
func inspectorTools(t *testing.T, server ...string) []string {
	t.Helper()
	inspector := testenv.MCPBin(t, testenv.MCPInspector)
	args := append(append([]string{"--cli"}, server...), "--method", "tools/list")
	out, errOut, code := runSplit(t, inspector, args...)
	if code != 0 {
		t.Fatalf("mcp-inspector --cli: exit %d\n%s", code, errOut)
	}
	var res struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("mcp-inspector output: %v\n%.500s", err, out)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	sort.Strings(names)
	return names
}

// everythingTools are the tools of mcp-server-everything the gateway sees:
// those the inspector lists, and those the server lists only to a client
// that declares sampling and elicitation, as the gateway does and the
// inspector's CLI does not. registry lint must see them all.
func everythingTools(t *testing.T, everything string) []string {
	t.Helper()
	live := inspectorTools(t, everything)
	for _, gated := range []string{"trigger-elicitation-request", "trigger-sampling-request", "trigger-url-elicitation"} {
		if slices.Contains(live, gated) {
			t.Fatalf("the inspector lists %q, which the server should list only to a client declaring sampling and elicitation", gated)
		}
		live = append(live, gated)
	}
	sort.Strings(live)
	return live
}

// writeManifest writes a manifest for serverID to dir/name.json.
func writeManifest(t *testing.T, dir, name, serverID string, tools []schemas.Tool) string {
	t.Helper()
	if tools == nil {
		tools = []schemas.Tool{}
	}
	b, err := json.Marshal(schemas.Manifest{SchemaID: "talos.mcp.tool_registry", SchemaVersion: "v1", ServerID: serverID, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := schemas.ParseManifest(b); err != nil {
		t.Fatalf("test manifest is invalid: %v", err)
	}
	p := filepath.Join(dir, name+".json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// shippedFeatures gives the manifest file path the prompts and resources
// of the shipped manifest of its server (deploy/mcp/registry).
func shippedFeatures(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := schemas.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join("../../deploy/mcp/registry", m.ServerID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := schemas.ParseManifest(shipped)
	if err != nil {
		t.Fatal(err)
	}
	m.Prompts, m.Resources = s.Prompts, s.Resources
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// findingLines returns the report lines that start with kind.
func findingLines(out, kind string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == kind {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestRegistryLintEverything runs `talosctl registry lint` against the npm
// reference server over stdio: a manifest lacking one live tool and listing
// one the server lacks fails with exactly those MISSING and STALE lines; a
// complete one passes; an action_pointer on get-annotated-message's
// messageType enum with one action left out fails with MISSING_ACTION.
// lint sees what the gateway sees, the sampling and elicitation tools
// included (everythingTools).
func TestRegistryLintEverything(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	everything := testenv.MCPBin(t, testenv.MCPServerEverything)
	live := everythingTools(t, everything)
	for _, want := range []string{"echo", "get-annotated-message", "get-sum"} {
		if !slices.Contains(live, want) {
			t.Fatalf("the inspector lists %q, without %q", live, want)
		}
	}
	dir := t.TempDir()
	server := "everything=" + everything
	classified := func(skip string) []schemas.Tool {
		var tools []schemas.Tool
		for _, n := range live {
			if n != skip {
				tools = append(tools, schemas.Tool{ToolName: n, ToolClass: "write"})
			}
		}
		return tools
	}

	t.Run("missing and stale", func(t *testing.T) {
		tools := append(classified("get-sum"), schemas.Tool{ToolName: "no-such-tool", ToolClass: "read"})
		reg := writeManifest(t, dir, "partial", "everything", tools)
		skel := filepath.Join(dir, "skeleton.json")
		out, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", server, "--registry", reg, "--write-skeleton", skel)
		if code != 1 {
			t.Fatalf("exit %d, want 1\n%s\n%s", code, out, errOut)
		}
		missing, stale := findingLines(out, registrylint.Missing), findingLines(out, registrylint.Stale)
		if len(missing) != 1 || !strings.Contains(missing[0], "everything/get-sum ") {
			t.Fatalf("MISSING lines %q, want one for get-sum\n%s", missing, out)
		}
		if len(stale) != 1 || !strings.Contains(stale[0], "everything/no-such-tool ") {
			t.Fatalf("STALE lines %q, want one for no-such-tool\n%s", stale, out)
		}
		if !strings.Contains(out, "1 missing") || !strings.Contains(out, ": FAIL") || !strings.Contains(errOut, "missing from the registry") {
			t.Fatalf("summary or error line wrong:\n%s\n%s", out, errOut)
		}
		// The skeleton is a valid manifest holding exactly the missing tool,
		// classed from the server's readOnlyHint (true for get-sum).
		b, err := os.ReadFile(skel)
		if err != nil {
			t.Fatal(err)
		}
		m, err := schemas.ParseManifest(b)
		if err != nil {
			t.Fatalf("skeleton: %v\n%s", err, b)
		}
		if m.ServerID != "everything" || len(m.Tools) != 1 || m.Tools[0].ToolName != "get-sum" || m.Tools[0].ToolClass != "read" || m.Tools[0].TrustLevel != "unknown" {
			t.Fatalf("skeleton: %s", b)
		}
		// An existing file is never overwritten.
		if _, _, code := runSplit(t, talosctl, "registry", "lint", "--server", server, "--registry", reg, "--write-skeleton", skel); code != 2 {
			t.Fatalf("--write-skeleton onto an existing file: exit %d, want 2", code)
		}
	})

	t.Run("complete", func(t *testing.T) {
		reg := writeManifest(t, dir, "complete", "everything", classified(""))
		shippedFeatures(t, reg)
		out, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", server, "--registry", reg, "--json")
		if code != 0 {
			t.Fatalf("exit %d, want 0\n%s\n%s", code, out, errOut)
		}
		var rep registrylint.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("--json: %v\n%s", err, out)
		}
		if !rep.OK || !rep.ManifestFound || rep.LiveTools != len(live) || rep.RegistryTools != len(live) ||
			rep.Counts[registrylint.Missing] != 0 || rep.Counts[registrylint.Stale] != 0 || !strings.HasPrefix(rep.RegistryDigest, "sha256:") ||
			rep.LivePrompts != 4 || rep.RegistryPrompts != 4 || rep.LiveResources < 3 || rep.Counts[registrylint.MissingResource] != 0 {
			t.Fatalf("report: %+v", rep)
		}
		// Every tool is class write while the server says readOnlyHint for
		// most: advisories, which never fail the lint.
		if rep.Counts[registrylint.Advisory] == 0 {
			t.Fatalf("no advisories for write-classed read-only tools: %+v", rep)
		}
	})

	t.Run("missing action", func(t *testing.T) {
		tools := classified("get-annotated-message")
		tools = append(tools, schemas.Tool{ToolName: "get-annotated-message", ToolClass: "read", ActionPointer: "/messageType",
			Actions: []schemas.Action{{Name: "error", ReadOnly: true}, {Name: "success", ReadOnly: true}, {Name: "retired", ReadOnly: true}}})
		reg := writeManifest(t, dir, "actions", "everything", tools)
		out, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", server, "--registry", reg)
		if code != 1 {
			t.Fatalf("exit %d, want 1\n%s\n%s", code, out, errOut)
		}
		ma, sa := findingLines(out, registrylint.MissingAction), findingLines(out, registrylint.StaleAction)
		if len(ma) != 1 || !strings.Contains(ma[0], "everything/get-annotated-message") || !strings.Contains(ma[0], " debug ") {
			t.Fatalf("MISSING_ACTION lines %q, want one for debug\n%s", ma, out)
		}
		if len(sa) != 1 || !strings.Contains(sa[0], " retired ") {
			t.Fatalf("STALE_ACTION lines %q, want one for retired\n%s", sa, out)
		}
		if len(findingLines(out, registrylint.Missing)) != 0 {
			t.Fatalf("unexpected MISSING lines:\n%s", out)
		}
	})

	t.Run("no manifest for the server", func(t *testing.T) {
		reg := writeManifest(t, dir, "other", "other", nil)
		out, _, code := runSplit(t, talosctl, "registry", "lint", "--server", everything, "--server-id", "everything", "--registry", reg)
		if code != 1 || len(findingLines(out, registrylint.Missing)) != len(live) || !strings.Contains(out, "no manifest for server_id everything") {
			t.Fatalf("exit %d, want 1 with every tool MISSING\n%s", code, out)
		}
	})
}

// TestRegistryLintStreamableHTTP: the same reference server, now over
// streamable HTTP, with "echo" left out of the manifest: exactly one
// MISSING line, and the URL's token never printed.
func TestRegistryLintStreamableHTTP(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	everything := testenv.MCPBin(t, testenv.MCPServerEverything)
	live := everythingTools(t, everything)

	base := testenv.StartEverythingHTTP(t)

	var tools []schemas.Tool
	for _, n := range live {
		if n != "echo" {
			tools = append(tools, schemas.Tool{ToolName: n, ToolClass: "write"})
		}
	}
	reg := writeManifest(t, t.TempDir(), "http", "everything", tools)
	out, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", "everything="+base+"/mcp?token=s3cret", "--registry", reg)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	if missing := findingLines(out, registrylint.Missing); len(missing) != 1 || !strings.Contains(missing[0], "everything/echo ") {
		t.Fatalf("MISSING lines %q, want one for echo\n%s", missing, out)
	}
	if strings.Contains(out+errOut, "s3cret") {
		t.Fatalf("the URL's token was printed:\n%s\n%s", out, errOut)
	}
}

// TestRegistryLintFilesystem: the npm filesystem server (stdio, one
// allowed directory) passes with a manifest built from the inspector's
// tools/list, and a write tool classed read gets an ADVISORY that does not
// fail the lint.
func TestRegistryLintFilesystem(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	fsBin := testenv.MCPBin(t, testenv.MCPServerFilesystem)
	root := t.TempDir()
	live := inspectorTools(t, fsBin, root)
	if !slices.Contains(live, "write_file") || !slices.Contains(live, "read_file") {
		t.Fatalf("filesystem tools %q", live)
	}
	var tools []schemas.Tool
	for _, n := range live {
		class := "write"
		if n == "write_file" { // classed read: the advisory case
			class = "read"
		}
		tools = append(tools, schemas.Tool{ToolName: n, ToolClass: class})
	}
	reg := writeManifest(t, t.TempDir(), "fs", "fs", tools)
	out, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", `fs=`+fsBin+` "`+root+`"`, "--registry", reg)
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s\n%s", code, out, errOut)
	}
	adv := findingLines(out, registrylint.Advisory)
	found := false
	for _, l := range adv {
		if strings.Contains(l, "fs/write_file ") && strings.Contains(l, "registry tool_class read") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no ADVISORY for write_file classed read:\n%s", out)
	}
	if !strings.Contains(out, ": ok") {
		t.Fatalf("summary does not say ok:\n%s", out)
	}
}

// TestRegistryLintUsage: a bad spec is a usage error (2); a server that
// cannot start fails the command (1) and says so.
func TestRegistryLintUsage(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	if _, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", "Bad Id=prog"); code != 2 || !strings.Contains(errOut, "server_id") {
		t.Fatalf("bad spec: exit %d, want 2\n%s", code, errOut)
	}
	if _, _, code := runSplit(t, talosctl, "registry", "lint", "--server", "x=prog", "--timeout", "-1s"); code != 2 {
		t.Fatalf("negative timeout: exit %d, want 2", code)
	}
	_, errOut, code := runSplit(t, talosctl, "registry", "lint", "--server", "ghost=/nonexistent/talos-mcp-server --token s3cret")
	if code != 1 || !strings.Contains(errOut, `server "ghost"`) || !strings.Contains(errOut, "failed to start") || strings.Contains(errOut, "s3cret") {
		t.Fatalf("unstartable server: exit %d, want 1 naming the server, without its arguments\n%s", code, errOut)
	}
}
