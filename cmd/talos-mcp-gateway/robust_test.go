package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/testenv"
)

// badManifest classifies testenv/mcp/badtools.mjs's tools, the broken ones
// too (a registry entry does not make a definition servable).
const badManifest = `{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "bad",
  "tools": [
    {"tool_name": "hello", "tool_class": "read", "is_document_op": false, "trust_level": "internal"},
    {"tool_name": "spoil", "tool_class": "read", "is_document_op": false, "trust_level": "internal"},
    {"tool_name": "no_type", "tool_class": "read", "is_document_op": false, "trust_level": "internal"},
    {"tool_name": "late_good", "tool_class": "read", "is_document_op": false, "trust_level": "internal"},
    {"tool_name": "late_bad", "tool_class": "read", "is_document_op": false, "trust_level": "internal"}],
  "prompts": [{"name": "greeting", "trust_level": "internal"}],
  "resources": [{"name": "good", "uri": "test://good", "trust_level": "internal"}, {"name": "items", "uri": "test://item/{id}", "trust_level": "internal"}]}`

// hiddenLine is the gateway's log line for a definition it hides.
func hiddenLine(kind, name string) string {
	return `msg="upstream ` + kind + ` hidden: its definition cannot be served" server_id=bad name=` + name + ` `
}

// TestUpstreamDefinitionsRobust (issue 21): a real stdio server lists,
// beside good tools, one whose input schema has no "type": "object", one
// whose schema does not compile and one that is not a tool at all, and a
// broken prompt, resource and resource template. The gateway starts,
// lists and serves the good ones, and logs one line for each broken one,
// naming it and why; a broken tool that arrives later
// through notifications/tools/list_changed is hidden the same way while
// the good one that came with it is served. talosctl registry lint
// reports the broken tools INVALID (not STALE) and still passes. The good
// prompt and resources, which the registry lists, are offered without
// --relay-ungoverned: Talos decides them.
func TestUpstreamDefinitionsRobust(t *testing.T) {
	script, _ := testenv.MCPScript(t, "badtools.mjs")
	reg := t.TempDir()
	manifest := filepath.Join(reg, "bad.json")
	if err := os.WriteFile(manifest, []byte(badManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	server := "bad=node " + script
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	out, err := testenv.Command(talosctl, "registry", "lint", "--server", server, "--registry", manifest).CombinedOutput()
	if err != nil {
		t.Fatalf("registry lint: %v\n%s", err, out)
	}
	for _, want := range []string{"INVALID  bad/no_type", "INVALID  bad/bad_schema", "INVALID  bad/7 ", "3 invalid"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("registry lint lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "STALE    bad/no_type") {
		t.Fatalf("registry lint calls the invalid tool stale:\n%s", out)
	}

	s := startStackRegistry(t, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gw := s.gatewaySession(ctx, "--ep-id", "gw-bad", "--upstream", server)
	listed := func() []string { return slices.Sorted(slices.Values(gw.toolNames(ctx, t))) }
	if names := listed(); !slices.Equal(names, []string{"hello", "spoil"}) {
		t.Fatalf("tools/list: %v, want [hello spoil]", names)
	}
	if res := gw.call(ctx, "hello", map[string]any{"name": "Ada"}).mustAllow(t, "hello"); text(res) != "Hello, Ada!" {
		t.Fatalf("hello: %q", text(res))
	}
	gw.call(ctx, "spoil", map[string]any{}).mustAllow(t, "spoil")
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(listed(), "late_good") {
		if time.Now().After(deadline) {
			t.Fatalf("late_good never listed: %v", listed())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if names := listed(); slices.Contains(names, "late_bad") {
		t.Fatalf("the broken tool of the new list is listed: %v", names)
	}
	if res := gw.call(ctx, "late_good", map[string]any{"name": "Bo"}).mustAllow(t, "late_good"); text(res) != "Hello, Bo!" {
		t.Fatalf("late_good: %q", text(res))
	}
	prompts, err := gw.cs.ListPrompts(ctx, nil)
	if err != nil || len(prompts.Prompts) != 1 || prompts.Prompts[0].Name != "greeting" {
		t.Fatalf("prompts/list: %v %+v, want only greeting", err, prompts)
	}
	resources, err := gw.cs.ListResources(ctx, nil)
	if err != nil || len(resources.Resources) != 1 || resources.Resources[0].URI != "test://good" {
		t.Fatalf("resources/list: %v %+v, want only test://good", err, resources)
	}
	templates, err := gw.cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(templates.ResourceTemplates) != 1 || templates.ResourceTemplates[0].URITemplate != "test://item/{id}" {
		t.Fatalf("resources/templates/list: %v %+v, want only test://item/{id}", err, templates)
	}
	if read, err := gw.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://item/3"}); err != nil || read.Contents[0].Text != "content of test://item/3" {
		t.Fatalf("resources/read test://item/3: %v %+v", err, read)
	}
	logb, _ := os.ReadFile(gw.log)
	log := string(logb)
	for _, h := range [][2]string{{"tool", "no_type"}, {"tool", "bad_schema"}, {"tool", "7"}, {"tool", "late_bad"},
		{"prompt", `""`}, {"resource", "relative/path"}, {"resource template", "test://item/{id"}} {
		if n := strings.Count(log, hiddenLine(h[0], h[1])); n != 1 {
			t.Fatalf("the gateway logged the hidden %s %s %d times, want once:\n%s", h[0], h[1], n, tail(log, 3000))
		}
	}
	if !strings.Contains(log, hiddenLine("tool", "no_type")+`why="inputSchema: \"type\" must be \"object\" (got none)"`) {
		t.Fatalf("the log line of no_type does not say why:\n%s", tail(log, 3000))
	}

	// A read of a URI no upstream serves is refused (Talos decides it and
	// denies it), never answered.
	if read, err := gw.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://item/3/more"}); err == nil {
		t.Fatalf("resources/read of a URI no upstream serves answered: %+v", read)
	}
}
