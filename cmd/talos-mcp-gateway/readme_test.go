package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// readmeClientConfig is the client configuration the README tells users to
// copy: the command and arguments of its "talos" MCP server.
func readmeClientConfig(t *testing.T) (string, []string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)Then add this to Claude Desktop's.*?```json\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("README: the client configuration block is gone")
	}
	var cfg struct {
		MCPServers map[string]struct {
			Command string   `json:"command"`
			Args    []string `json:"args"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(m[1], &cfg); err != nil {
		t.Fatalf("README: the client configuration is not JSON: %v", err)
	}
	srv, ok := cfg.MCPServers["talos"]
	if !ok {
		t.Fatal("README: no mcpServers.talos")
	}
	return srv.Command, srv.Args
}

// readmeInstall lays out what the README's setup steps create under abs
// (its /ABS/talos): the registry of step 1, the NATS users file of step 2,
// the agent key and capability of step 3, and the gateway binary.
func readmeInstall(t *testing.T, abs, gateway string) {
	t.Helper()
	reg := filepath.Join(abs, "my-registry")
	keys := filepath.Join(abs, "talos-data", "keys")
	for _, d := range []string{reg, keys, filepath.Join(abs, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, glob := range []string{"../talosd/demo/registry/*.json", registryDir + "/*.json"} {
		files, _ := filepath.Glob(glob)
		if len(files) == 0 {
			t.Fatalf("no manifests at %s", glob)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(reg, filepath.Base(f)), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	if out, err := testenv.Command(talosd, "nats-auth", "--data-dir", filepath.Join(abs, "talos-data"),
		"--nats-eps", "talosctl,demo-ep,claude").CombinedOutput(); err != nil {
		t.Fatalf("talosd nats-auth: %v\n%s", err, out)
	}
	if err := os.Symlink(gateway, filepath.Join(abs, "bin", "talos-mcp-gateway")); err != nil {
		t.Fatal(err)
	}
}

// TestREADMEFilesystemSetup (CSP MUST 7, VAL-03) runs the README's
// copy-paste client configuration as it stands, the gateway in front of the
// real server-filesystem, against a real pipeline (talosd, NATS,
// ClickHouse). Only the placeholders are filled in: /ABS/talos with the
// files the README's steps make, /ABS/Documents with a directory, npx with
// the installed servers, and NATS's address through TALOS_NATS_URL. A read
// inside the workspace is allowed; "../", an absolute path outside, encoded
// dots, and outside paths in read_multiple_files' paths and move_file's
// destination are denied DENY_PATH_TRAVERSAL by Talos, with receipts, and
// never forwarded to the server.
func TestREADMEFilesystemSetup(t *testing.T) {
	abs, base := t.TempDir(), t.TempDir()
	docs := filepath.Join(base, "Documents")
	if err := os.Mkdir(docs, 0o755); err != nil {
		t.Fatal(err)
	}
	const inside, outside = "inside the workspace\n", "outside the workspace\n"
	if err := os.WriteFile(filepath.Join(docs, "notes.txt"), []byte(inside), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "secret.txt"), []byte(outside), 0o644); err != nil {
		t.Fatal(err)
	}
	gwBin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talos-mcp-gateway")
	readmeInstall(t, abs, gwBin)
	s := startStackRegistry(t, filepath.Join(abs, "my-registry"))
	s.ctl("keys", "gen", "--out", filepath.Join(abs, "talos-data/keys/claude"))
	s.ctl("cap", "issue", "--issuer-key", filepath.Join(s.dir, "issuer.key"), "--subject", "claude",
		"--subject-key", filepath.Join(abs, "talos-data/keys/claude.pub"), "--scope", "tool:everything:*", "--scope", "tool:fs:*",
		"--ttl", "720h", "--out", filepath.Join(abs, "talos-data/keys/claude.cap.json"))

	command, args := readmeClientConfig(t)
	fill := strings.NewReplacer("/ABS/talos", abs, "/ABS/Documents", docs,
		"npx -y @modelcontextprotocol/server-filesystem", testenv.MCPBin(t, testenv.MCPServerFilesystem),
		"npx -y @modelcontextprotocol/server-everything", testenv.MCPBin(t, testenv.MCPServerEverything))
	for i := range args {
		args[i] = fill.Replace(args[i])
	}
	if err := testenv.Command("test", "-x", fill.Replace(command)).Run(); err != nil {
		t.Fatalf("README: the command %s is not the gateway the steps build", command)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := testenv.Command(fill.Replace(command), args...)
	cmd.Env = append(os.Environ(), "TALOS_NATS_URL="+s.natsURL())
	gw := s.connectGateway(ctx, cmd)

	res := gw.call(ctx, "read_text_file", map[string]any{"path": filepath.Join(docs, "notes.txt")}).mustAllow(t, "read inside")
	if res.IsError || text(res) != inside {
		t.Fatalf("read inside the workspace: %q", text(res))
	}
	notes := filepath.Join(docs, "notes.txt")
	attacks := []struct {
		name, tool string
		args       map[string]any
	}{
		{"parent", "read_text_file", map[string]any{"path": "../secret.txt"}},
		{"parent after the root", "read_text_file", map[string]any{"path": docs + "/../secret.txt"}},
		{"absolute outside", "read_text_file", map[string]any{"path": filepath.Join(base, "secret.txt")}},
		{"encoded dots", "read_text_file", map[string]any{"path": "%2e%2e/secret.txt"}},
		{"encoded after the root", "get_file_info", map[string]any{"path": docs + "/%2E%2E/secret.txt"}},
		{"one of several paths", "read_multiple_files", map[string]any{"paths": []any{notes, filepath.Join(base, "secret.txt")}}},
		{"move out", "move_file", map[string]any{"source": notes, "destination": filepath.Join(base, "moved.txt")}},
	}
	denied := map[string]string{}
	for _, a := range attacks {
		d := gw.call(ctx, a.tool, a.args).mustDeny(t, a.name, schemas.CodeDenyPathTraversal)
		if d.ReceiptID == "" {
			t.Fatalf("%s: the denial names no receipt", a.name)
		}
		denied[d.ToolCallID] = a.name
	}
	// Nothing reached the server: the gateway forwarded none of them, and
	// the file a forwarded move would have moved is where it was.
	logb, _ := os.ReadFile(gw.log)
	for id, name := range denied {
		if strings.Contains(string(logb), `msg="call forwarded" tool_call_id=`+id) {
			t.Fatalf("%s: the gateway forwarded a denied call", name)
		}
	}
	if _, err := os.Stat(notes); err != nil {
		t.Fatalf("notes.txt moved: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "moved.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the move out of the workspace happened")
	}
	assertPathDenials(ctx, t, s, denied)
}

// assertPathDenials waits for each call's decision receipt in ClickHouse
// and checks it is a DENY_PATH_TRAVERSAL deny without an effect receipt.
func assertPathDenials(ctx context.Context, t *testing.T, s *stack, denied map[string]string) {
	t.Helper()
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for id, name := range denied {
		t.Logf("%s: %s", name, id)
		assertWorkerDenied(ctx, t, s, id, schemas.CodeDenyPathTraversal)
		var effects uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'effect'", id).Scan(&effects); err != nil || effects != 0 {
			t.Fatalf("%s: %d effect receipts (%v): the call ran", name, effects, err)
		}
	}
}
