package enforce

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

func readManifests(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, n := range []string{"assistant.json", "files.json", "github.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/registry", n))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	return out
}

// reformat re-encodes a manifest with other whitespace and key order.
func reformat(t *testing.T, b []byte) []byte {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(v) // sorted keys, compact
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRegistryDigestStable(t *testing.T) {
	ms := readManifests(t)
	r1, err := LoadRegistry("testdata/registry")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(r1.Digest()) {
		t.Fatalf("digest %q", r1.Digest())
	}
	r2, err := NewRegistry(ms["github.json"], ms["files.json"], ms["assistant.json"])
	if err != nil {
		t.Fatal(err)
	}
	r3, err := NewRegistry(reformat(t, ms["files.json"]), reformat(t, ms["assistant.json"]), reformat(t, ms["github.json"]))
	if err != nil {
		t.Fatal(err)
	}
	if r1.Digest() != r2.Digest() || r1.Digest() != r3.Digest() {
		t.Fatalf("digest depends on order or formatting: %s %s %s", r1.Digest(), r2.Digest(), r3.Digest())
	}
	// Defaults are not filled in: adding an explicit default changes the digest.
	changed := bytes.Replace(ms["files.json"], []byte(`"max_write_bytes": 1048576`), []byte(`"max_write_bytes": 1048577`), 1)
	r4, err := NewRegistry(changed, ms["assistant.json"], ms["github.json"])
	if err != nil {
		t.Fatal(err)
	}
	if r4.Digest() == r1.Digest() {
		t.Fatal("digest ignores content")
	}
	// A subset differs too.
	r5, _ := NewRegistry(ms["files.json"])
	if r5.Digest() == r1.Digest() {
		t.Fatal("digest ignores manifests")
	}
	var ids []string
	for _, m := range r1.Manifests() {
		ids = append(ids, m.ServerID)
	}
	if !slices.Equal(ids, []string{"assistant", "files", "github"}) {
		t.Fatalf("manifests not sorted: %v", ids)
	}
	if tool, ok := r1.Lookup("github", "create-pr"); !ok || tool.ToolClass != "write" || tool.DocumentSpec == nil {
		t.Fatalf("lookup: %+v %v", tool, ok)
	}
	if _, ok := r1.Lookup("github", "Create-PR"); ok {
		t.Fatal("lookup is not exact")
	}
	if _, ok := r1.Lookup("files", "create-pr"); ok {
		t.Fatal("lookup crosses servers")
	}
	// A single file works too.
	if r6, err := LoadRegistry("testdata/registry/files.json"); err != nil || r6.Digest() != r5.Digest() {
		t.Fatalf("single file: %v", err)
	}
}

func TestRegistryErrors(t *testing.T) {
	ms := readManifests(t)
	dir := t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadRegistry(dir); err == nil || !strings.Contains(err.Error(), "no *.json") {
		t.Fatalf("empty dir: %v", err)
	}
	write("a.json", ms["files.json"])
	write("b.json", ms["files.json"])
	_, err := LoadRegistry(dir)
	if err == nil || !strings.Contains(err.Error(), "b.json") || !strings.Contains(err.Error(), "a.json") || !strings.Contains(err.Error(), `"files"`) {
		t.Fatalf("duplicate server_id: %v", err)
	}
	write("b.json", []byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"x","tools":[{"tool_name":"t"}]}`))
	_, err = LoadRegistry(dir)
	if err == nil || !strings.Contains(err.Error(), "b.json") || !strings.Contains(err.Error(), "tool_class") {
		t.Fatalf("invalid manifest: %v", err)
	}
	if _, err := LoadRegistry(filepath.Join(dir, "missing.json")); err == nil {
		t.Fatal("missing file accepted")
	}
	if _, err := NewRegistry(ms["files.json"], ms["files.json"]); err == nil || !strings.Contains(err.Error(), "manifest #1") {
		t.Fatalf("NewRegistry duplicate: %v", err)
	}
	if r, err := NewRegistry(); err != nil || len(r.Manifests()) != 0 {
		t.Fatalf("empty registry: %v", err)
	}
}

// TestClassify: one lookup gives every check the same answer: the tool,
// the effective class (an action's for an action-based tool; none for an
// action that is missing, not a string or not declared), the resource,
// shadowing of a protected tool and the version a ToolCallEvent names.
func TestClassify(t *testing.T) {
	r := trustRegistry(t)
	cases := []struct {
		name, server, tool string
		args               any
		class, action      string
		known              bool
		shadowedBy         string
		version            string
	}{
		{"plain read tool", "files", "read_file", map[string]any{"path": "/a"}, "read", "", true, "", "1.2.0"},
		{"read-only action", "assistant", "github", map[string]any{"action": "get_issue"}, "read", "get_issue", true, "", "0.9.0"},
		{"write action", "assistant", "github", map[string]any{"action": "create_issue"}, "write", "create_issue", true, "", "0.9.0"},
		{"undeclared action", "assistant", "github", map[string]any{"action": "delete_repo"}, "", "delete_repo", true, "", "0.9.0"},
		{"action not a string", "assistant", "github", map[string]any{"action": 7}, "", "", true, "", "0.9.0"},
		{"no action", "assistant", "github", map[string]any{}, "", "", true, "", "0.9.0"},
		{"shadows a built_in", "community", "read_file", map[string]any{}, "read", "", true, "files", schemas.UnregisteredToolVersion},
		{"the built_in itself", "assistant", "memory_search", nil, "read", "", true, "", "0.9.0"},
		{"unknown tool", "files", "nope", nil, "", "", false, "", schemas.UnregisteredToolVersion},
	}
	for _, tc := range cases {
		c := r.Classify(tc.server, tc.tool, tc.args)
		if c.Known() != tc.known || c.Class != tc.class || c.Action != tc.action || c.ShadowedBy != tc.shadowedBy || c.Version != tc.version {
			t.Errorf("%s: %+v", tc.name, c)
		}
		if holder, shadowed := r.ShadowedBy(tc.server, tc.tool); holder != tc.shadowedBy || shadowed != (tc.shadowedBy != "") {
			t.Errorf("%s: ShadowedBy = %q %v", tc.name, holder, shadowed)
		}
		if v := r.ToolVersion(tc.server, tc.tool); v != tc.version {
			t.Errorf("%s: ToolVersion = %q", tc.name, v)
		}
	}
}
