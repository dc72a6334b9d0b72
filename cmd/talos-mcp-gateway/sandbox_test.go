package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/ingest/sandbox"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// mcpReadOnly are the --sandbox-ro flags for the read-only paths the npm filesystem server needs
// inside a sandbox: testenv/mcp (its .bin link) and the node_modules tree
// it resolves to.
func mcpReadOnly(t *testing.T, bin string) []string {
	mcp := filepath.Dir(filepath.Dir(filepath.Dir(bin))) // …/testenv/mcp/node_modules/.bin/x
	real, err := filepath.EvalSymlinks(filepath.Join(mcp, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--sandbox-ro", mcp, "--sandbox-ro", real}
}

// TestSandboxFilesystem (CSP MUST 8, SAND-01 and SAND-02): the npm
// filesystem server is given a root broader than its workspace, so the
// server itself permits paths outside the workspace and Talos allows the
// calls (receipted, forwarded). Unsandboxed, a write and a read outside the
// workspace succeed on the host; under --sandbox the same calls, and a read
// through a symlink planted in the workspace, fail, and the host's files
// are untouched; inside the workspace, reads and writes work.
func TestSandboxFilesystem(t *testing.T) {
	s := startStackRegistry(t, withoutPathChecks(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := t.TempDir()
	ws, outside := filepath.Join(root, "ws"), filepath.Join(root, "outside")
	for _, d := range []string{ws, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const hostSecret = "host secret outside the workspace"
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte(hostSecret), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(ws, "link.txt")); err != nil {
		t.Fatal(err)
	}
	bin := testenv.MCPBin(t, testenv.MCPServerFilesystem)
	upstream := []string{"--upstream", "fs=" + bin + " " + root}

	// Without the sandbox the server and Talos allow both: the test's calls
	// really reach outside the workspace.
	plain := s.gatewaySession(ctx, append(upstream, "--ep-id", "gw-plain")...)
	res := plain.call(ctx, "write_file", map[string]any{"path": filepath.Join(outside, "plain.txt"), "content": "x"}).mustAllow(t, "unsandboxed write")
	if _, err := os.Stat(filepath.Join(outside, "plain.txt")); res.IsError || err != nil {
		t.Fatalf("unsandboxed write outside the workspace did not happen (%s, %v): the test would prove nothing", text(res), err)
	}
	res = plain.call(ctx, "read_text_file", map[string]any{"path": filepath.Join(ws, "link.txt")}).mustAllow(t, "unsandboxed read")
	if !strings.Contains(text(res), hostSecret) {
		t.Fatalf("unsandboxed read through the symlink: %q", text(res))
	}

	args := append(append(upstream, "--ep-id", "gw-sandbox", "--sandbox", "--workspace", "fs="+ws), mcpReadOnly(t, bin)...)
	gw := s.gatewaySession(ctx, args...)
	// SAND-01: a write outside the workspace fails and changes nothing.
	pwned := filepath.Join(outside, "pwned.txt")
	res = gw.call(ctx, "write_file", map[string]any{"path": pwned, "content": "escaped"}).mustAllow(t, "write outside")
	if !res.IsError {
		t.Fatalf("sandboxed write outside the workspace succeeded: %q", text(res))
	}
	if _, err := os.Stat(pwned); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the host file %s exists after a sandboxed write (%v)", pwned, err)
	}
	// The workspace's parent exists inside the sandbox only as a directory
	// bwrap made to mount the workspace on; here it lies in the sandbox's
	// private /tmp (t.TempDir), so the write may succeed there, but never
	// on the host.
	gw.call(ctx, "write_file", map[string]any{"path": filepath.Join(root, "beside.txt"), "content": "escaped"}).mustAllow(t, "write beside")
	if _, err := os.Stat(filepath.Join(root, "beside.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a sandboxed write to the workspace's parent reached the host (%v)", err)
	}
	// SAND-02: reads outside the workspace fail, directly and through the
	// planted symlink.
	for _, p := range []string{secret, filepath.Join(ws, "link.txt")} {
		res = gw.call(ctx, "read_text_file", map[string]any{"path": p}).mustAllow(t, "read "+p)
		if !res.IsError || strings.Contains(text(res), hostSecret) {
			t.Fatalf("sandboxed read of %s: error=%v %q", p, res.IsError, text(res))
		}
	}
	// Inside the workspace the server works.
	res = gw.call(ctx, "read_text_file", map[string]any{"path": filepath.Join(ws, "notes.txt")}).mustAllow(t, "read inside")
	if res.IsError || !strings.Contains(text(res), "inside") {
		t.Fatalf("sandboxed read inside the workspace: %q", text(res))
	}
	gw.call(ctx, "write_file", map[string]any{"path": filepath.Join(ws, "out.txt"), "content": "written in the sandbox"}).mustAllow(t, "write inside")
	if b, err := os.ReadFile(filepath.Join(ws, "out.txt")); err != nil || string(b) != "written in the sandbox" {
		t.Fatalf("sandboxed write inside the workspace: %q %v", b, err)
	}
}

// copyRegistry copies the shipped manifests of server-everything and
// server-filesystem into a new directory, each as edit returns it, and
// returns the directory.
func copyRegistry(t *testing.T, edit func(manifest []byte) []byte) string {
	t.Helper()
	reg := t.TempDir()
	for _, f := range []string{"everything.json", "filesystem.json"} {
		b, err := os.ReadFile(filepath.Join(registryDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(reg, f), edit(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return reg
}

// withoutPathChecks is a copy of the shipped registry without the path
// checks of the filesystem server's tools, so that a test sees what the
// sandbox alone confines (CSP MUST 8), not Talos's own check (MUST 7).
func withoutPathChecks(t *testing.T) string {
	t.Helper()
	return copyRegistry(t, func(b []byte) []byte {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, tl := range m["tools"].([]any) {
			delete(tl.(map[string]any), "path_pointers")
			delete(tl.(map[string]any), "workspace_root")
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// registryWith is a copy of the shipped registry with manifests added
// (server_id → manifest).
func registryWith(t *testing.T, manifests map[string]string) string {
	t.Helper()
	reg := copyRegistry(t, func(b []byte) []byte { return b })
	for id, m := range manifests {
		if err := os.WriteFile(filepath.Join(reg, id+".json"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return reg
}

// probeManifest is a registry manifest for testenv/mcp/netprobe.mjs.
func probeManifest(serverID string, network bool) string {
	return fmt.Sprintf(`{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": %q,
  "tools": [{"tool_name": "connect", "tool_class": "read", "is_document_op": false,
    "trust_level": "internal", "risk_category": "LOW", "network_outbound": %v}]}`, serverID, network)
}

// listener counts the TCP connections that reach it and the lines they send.
type listener struct {
	ln    net.Listener
	port  int
	lines atomic.Int64
}

func listen(t *testing.T) *listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &listener{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if line, err := bufio.NewReader(c).ReadString('\n'); err == nil && strings.HasPrefix(line, "ping") {
					l.lines.Add(1)
				}
			}()
		}
	}()
	return l
}

// TestSandboxEgress (CSP MUST 8, NET-01): a tiny MCP server tries to reach
// a listener on the host, directly and through HTTPS_PROXY. Unsandboxed it
// gets there; sandboxed without network_outbound nothing gets out; a
// network_outbound server reaches the allowlisted destination through the
// egress proxy only, and a destination off the allowlist is refused. The
// listeners count what really arrived.
func TestSandboxEgress(t *testing.T) {
	s := startStackRegistry(t, registryWith(t, map[string]string{
		"probe": probeManifest("probe", false), "probenet": probeManifest("probenet", true)}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script, dir := testenv.MCPScript(t, "netprobe.mjs")
	allowed, other := listen(t), listen(t)
	ws := t.TempDir()
	connect := func(g *gatewaySession, l *listener, via string) string {
		t.Helper()
		res := g.call(ctx, "connect", map[string]any{"host": "127.0.0.1", "port": l.port, "via": via}).mustAllow(t, "connect "+via)
		return text(res)
	}
	expect := func(l *listener, n int64, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for l.lines.Load() != n && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if got := l.lines.Load(); got != n {
			t.Fatalf("%s: the listener on port %d got %d connections, want %d", what, l.port, got, n)
		}
	}

	plain := s.gatewaySession(ctx, "--ep-id", "gw-net-plain", "--upstream", "probe=node "+script)
	if got := connect(plain, allowed, "direct"); got != "connected" {
		t.Fatalf("unsandboxed direct connect: %q: the test would prove nothing", got)
	}
	expect(allowed, 1, "unsandboxed")

	sb := []string{"--sandbox", "--sandbox-ro", dir}
	closed := s.gatewaySession(ctx, append(sb, "--ep-id", "gw-net-none", "--upstream", "probe=node "+script, "--workspace", "probe="+ws)...)
	for _, via := range []string{"direct", "proxy"} {
		if got := connect(closed, allowed, via); got == "connected" {
			t.Fatalf("sandboxed server without network_outbound: %s connect got out", via)
		}
	}
	expect(allowed, 1, "without network_outbound")

	open := s.gatewaySession(ctx, append(sb, "--ep-id", "gw-net-allow", "--upstream", "probenet=node "+script,
		"--workspace", "probenet="+ws, "--sandbox-egress", "probenet=127.0.0.1:"+strconv.Itoa(allowed.port))...)
	if got := connect(open, allowed, "proxy"); got != "connected" {
		t.Fatalf("allowlisted destination through the egress proxy: %q", got)
	}
	expect(allowed, 2, "allowlisted through the proxy")
	if got := connect(open, allowed, "direct"); got == "connected" {
		t.Fatal("a network_outbound server connected directly, around the egress proxy")
	}
	if got := connect(open, other, "proxy"); got == "connected" || !strings.Contains(got, "403") {
		t.Fatalf("destination off the allowlist: %q, want the proxy's 403", got)
	}
	expect(allowed, 2, "after the refused calls")
	expect(other, 0, "off the allowlist")
	b, _ := os.ReadFile(open.log)
	if !strings.Contains(string(b), "sandbox egress refused") {
		t.Fatal("the gateway did not log the refused egress")
	}
}

// fetchManifest is a registry manifest for the npm mcp-fetch-server's
// fetch_html tool.
func fetchManifest(serverID string, network bool) string {
	return fmt.Sprintf(`{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": %q,
  "tools": [{"tool_name": "fetch_html", "tool_class": "read", "is_document_op": false,
    "trust_level": "internal", "risk_category": "LOW", "network_outbound": %v}]}`, serverID, network)
}

// tunnelProxy is an HTTP proxy on the host's loopback that tunnels every
// CONNECT, whatever it names, to target, and counts the tunnels.
func tunnelProxy(t *testing.T, target string) (url string, tunnels *atomic.Int64) {
	tunnels = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusBadRequest)
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		down, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			up.Close()
			return
		}
		tunnels.Add(1)
		_, _ = down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		go func() { _, _ = io.Copy(up, buf); up.Close() }()
		_, _ = io.Copy(down, up)
		down.Close()
	}))
	t.Cleanup(srv.Close)
	return srv.URL, tunnels
}

// TestSandboxEgressFetch (CSP MUST 8, NET-01) with a real npm MCP server:
// mcp-fetch-server fetches with Node's built-in fetch(), which on Node 20
// ignores HTTP(S)_PROXY unless the sandbox's Node preload installs undici's
// proxy agent. The page is served on the host's loopback under a name that
// resolves nowhere (docs.talos.test), so it is reachable only through a
// proxy that knows where it is. Unsandboxed, with the preload and a host
// proxy in its environment, the server fetches it: the configuration
// works. Sandboxed without network_outbound, with that same environment,
// nothing arrives. With network_outbound and the allowlist pinning
// docs.talos.test:80 to the page's address, the page's content arrives
// through the gateway's tools/call, and a host off the allowlist is
// refused by the egress proxy: the call returns the server's error and the
// page's server sees no request. Each call's decision receipt records how
// its upstream ran (upstream_sandbox), and the receipts verify.
func TestSandboxEgressFetch(t *testing.T) {
	s := startStackRegistry(t, registryWith(t, map[string]string{
		"fetchnone": fetchManifest("fetchnone", false), "fetch": fetchManifest("fetch", true)}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const page = "talos egress page: fetched through the proxy"
	var hits atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<html><body><p>%s</p></body></html>", page)
	}))
	t.Cleanup(origin.Close)
	originAddr := strings.TrimPrefix(origin.URL, "http://")
	proxyURL, tunnels := tunnelProxy(t, originAddr)
	preloadDir := t.TempDir()
	preload := filepath.Join(preloadDir, "node-preload.cjs")
	if err := os.WriteFile(preload, []byte(sandbox.NodePreload()), 0o444); err != nil {
		t.Fatal(err)
	}
	bin := testenv.MCPBin(t, testenv.MCPServerFetch)
	fetch := func(g *gatewaySession, url string) *mcp.CallToolResult {
		t.Helper()
		return g.call(ctx, "fetch_html", map[string]any{"url": url}).mustAllow(t, "fetch "+url)
	}
	hostEnv := []string{"HTTP_PROXY=" + proxyURL, "HTTPS_PROXY=" + proxyURL, "NODE_OPTIONS=--require " + preload}

	cmd := testenv.Command(s.gateway, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", s.registry,
		"--log-level", "debug", "--ep-id", "gw-fetch-plain", "--upstream", "fetchnone="+bin)
	cmd.Env = append(os.Environ(), hostEnv...)
	plain := s.connectGateway(ctx, cmd)
	res := fetch(plain, "http://docs.talos.test/page")
	if res.IsError || !strings.Contains(text(res), page) {
		t.Fatalf("unsandboxed fetch through the host proxy: %q: the test would prove nothing", text(res))
	}
	egress := []string{"docs.talos.test:80@" + originAddr}
	want := map[string]schemas.UpstreamSandbox{ // tool_call_id → what its receipt records
		toolCallID(res): {Network: schemas.SandboxNetworkUnconfined},
	}
	if hits.Load() != 1 || tunnels.Load() != 1 {
		t.Fatalf("unsandboxed fetch: %d requests at the page, %d tunnels, want 1 and 1", hits.Load(), tunnels.Load())
	}

	ws := t.TempDir()
	sb := append([]string{"--sandbox", "--sandbox-ro", preloadDir}, mcpReadOnly(t, bin)...)
	cmd = testenv.Command(s.gateway, append(sb, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", s.registry,
		"--log-level", "debug", "--ep-id", "gw-fetch-none", "--upstream", "fetchnone="+bin, "--workspace", "fetchnone="+ws,
		"--sandbox-env", "fetchnone=HTTP_PROXY", "--sandbox-env", "fetchnone=HTTPS_PROXY", "--sandbox-env", "fetchnone=NODE_OPTIONS")...)
	cmd.Env = append(os.Environ(), hostEnv...)
	closed := s.connectGateway(ctx, cmd)
	if res = fetch(closed, "http://docs.talos.test/page"); !res.IsError || strings.Contains(text(res), page) {
		t.Fatalf("sandboxed without network_outbound, the fetch got out: %q", text(res))
	}
	want[toolCallID(res)] = schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkNone}
	if hits.Load() != 1 || tunnels.Load() != 1 {
		t.Fatalf("without network_outbound: %d requests at the page, %d tunnels, want 1 and 1", hits.Load(), tunnels.Load())
	}

	open := s.gatewaySession(ctx, append(sb, "--ep-id", "gw-fetch-allow", "--upstream", "fetch="+bin, "--workspace", "fetch="+ws,
		"--sandbox-egress", "fetch="+egress[0])...)
	if res = fetch(open, "http://docs.talos.test/page"); res.IsError || !strings.Contains(text(res), page) {
		t.Fatalf("allowlisted fetch through the egress proxy: %q", text(res))
	}
	allowlisted := schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkAllowlist, AllowlistSHA256: sandbox.AllowlistSHA256(egress)}
	want[toolCallID(res)] = allowlisted
	if hits.Load() != 2 {
		t.Fatalf("allowlisted fetch: %d requests at the page, want 2", hits.Load())
	}
	for _, u := range []string{"http://other.talos.test/page", "http://docs.talos.test:8080/page"} {
		if res = fetch(open, u); !res.IsError || strings.Contains(text(res), page) {
			t.Fatalf("fetch of %s, off the allowlist: %q", u, text(res))
		}
		want[toolCallID(res)] = allowlisted
	}
	if hits.Load() != 2 || tunnels.Load() != 1 {
		t.Fatalf("after the refused fetches: %d requests at the page, %d host tunnels, want 2 and 1", hits.Load(), tunnels.Load())
	}
	b, _ := os.ReadFile(open.log)
	for _, dest := range []string{"other.talos.test:80", "docs.talos.test:8080"} {
		if !regexp.MustCompile(`sandbox egress refused.*destination=` + regexp.QuoteMeta(dest)).Match(b) {
			t.Fatalf("the gateway did not log the refused egress to %s", dest)
		}
	}

	// The decision receipts say how each call's upstream ran, and verify.
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for id, us := range want {
		if r := decisionReceipt(t, ctx, conn, id); r.UpstreamSandbox == nil || *r.UpstreamSandbox != us {
			t.Fatalf("%s's receipt has upstream_sandbox %+v, want %+v", id, r.UpstreamSandbox, us)
		}
	}
	if out, code := s.ctlCode("verify", "--trusted-keys", filepath.Join(s.dir, "worker.pub")); code != 0 {
		t.Fatalf("talosctl verify: exit %d\n%s", code, out)
	}
}

// toolCallID is the tool_call_id a forwarded result names.
func toolCallID(res *mcp.CallToolResult) string {
	id, _ := res.Meta[gateway.MetaToolCallID].(string)
	return id
}

// TestSandboxSetupErrors: a sandbox that cannot be set up stops the
// gateway at startup with a message saying why; it never runs the upstream
// unconfined.
func TestSandboxSetupErrors(t *testing.T) {
	gw := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talos-mcp-gateway")
	script, _ := testenv.MCPScript(t, "netprobe.mjs")
	ws := t.TempDir()
	base := []string{"--ep-id", "gw-broken", "--registry", registryDir, "--nats-auth", "none", "--list-tools",
		"--upstream", "fs=node " + script}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bwrap missing", []string{"--sandbox", "--workspace", "fs=" + ws, "--sandbox-bwrap", "/nonexistent/bwrap"}, 1, "bubblewrap not found"},
		{"bwrap fails", []string{"--sandbox", "--workspace", "fs=" + ws, "--sandbox-bwrap", "false"}, 1, "bwrap could not start a sandboxed process"},
		{"workspace missing", []string{"--sandbox", "--workspace", "fs=" + filepath.Join(ws, "nope")}, 1, "workspace"},
		{"workspace relative", []string{"--sandbox", "--workspace", "fs=ws"}, 2, "not an absolute path"},
		{"no workspace", []string{"--sandbox"}, 2, "no workspace for server"},
		{"read-only path missing", []string{"--sandbox", "--workspace", "fs=" + ws, "--sandbox-ro", "/nonexistent"}, 1, "read-only path"},
		{"egress without network_outbound", []string{"--sandbox", "--workspace", "fs=" + ws, "--sandbox-egress", "fs=127.0.0.1:80"}, 1, "network_outbound"},
		{"sandbox flags without --sandbox", []string{"--sandbox-ro", ws}, 2, "need --sandbox"},
		{"unknown server", []string{"--sandbox", "--workspace", "nope=" + ws}, 2, "is not an --upstream"},
		{"old flag name", []string{"--sandbox", "--sandbox-workspace", "fs=" + ws, "--sandbox-bwrap", "/nonexistent/bwrap"}, 1, "bubblewrap not found"},
		{"two workspaces", []string{"--workspace", "fs=" + ws, "--workspace", "fs=" + ws}, 2, "more than one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := testenv.Command(gw, append(append([]string{}, base...), c.args...)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != c.code {
				t.Fatalf("exit %v, want %d\n%s", err, c.code, out)
			}
			if !strings.Contains(string(out), c.want) || strings.Contains(string(out), "upstream connected") {
				t.Fatalf("output lacks %q (or the upstream started):\n%s", c.want, out)
			}
		})
	}
}
