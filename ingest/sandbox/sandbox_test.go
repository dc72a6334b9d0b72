package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// TestArgs: the bwrap command line, in order: namespaces and lifetime
// first, the system paths read-only, /proc, /dev and a private /tmp, the
// extra read-only paths, the workspace read-write, the init and the proxy
// socket when there is an allowlist, then the root made read-only, the
// working directory, and the command.
func TestArgs(t *testing.T) {
	head := []string{"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"}
	var sys []string
	for _, p := range systemPaths {
		sys = append(sys, "--ro-bind-try", p, p)
	}
	cases := []struct {
		name string
		l    Layout
		want []string // after head and sys
	}{
		{
			name: "workspace only",
			l:    Layout{Workspace: "/srv/ws"},
			want: []string{"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
				"--bind", "/srv/ws", "/srv/ws", "--remount-ro", "/", "--chdir", "/srv/ws", "--", "/usr/bin/node", "server.js"},
		},
		{
			name: "read-only installation",
			l:    Layout{Workspace: "/srv/ws", ReadOnly: []string{"/opt/mcp", "/opt/node"}},
			want: []string{"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
				"--ro-bind", "/opt/mcp", "/opt/mcp", "--ro-bind", "/opt/node", "/opt/node",
				"--bind", "/srv/ws", "/srv/ws", "--remount-ro", "/", "--chdir", "/srv/ws", "--", "/usr/bin/node", "server.js"},
		},
		{
			name: "egress allowlist: the init relays to the proxy",
			l:    Layout{Workspace: "/srv/ws", Init: "/usr/local/bin/talos-mcp-gateway", Socket: "/tmp/talos-sandbox-1/egress.sock"},
			want: []string{"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
				"--bind", "/srv/ws", "/srv/ws",
				"--ro-bind", "/usr/local/bin/talos-mcp-gateway", initPath, "--bind", "/tmp/talos-sandbox-1/egress.sock", socketPath,
				"--remount-ro", "/", "--chdir", "/srv/ws", "--",
				initPath, InitCommand, ProxyAddr, socketPath, "--", "/usr/bin/node", "server.js"},
		},
		{
			name: "egress allowlist with the Node preload",
			l: Layout{Workspace: "/srv/ws", Init: "/usr/local/bin/talos-mcp-gateway", Socket: "/tmp/talos-sandbox-1/egress.sock",
				Preload: "/tmp/talos-sandbox-1/node-preload.cjs"},
			want: []string{"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
				"--bind", "/srv/ws", "/srv/ws",
				"--ro-bind", "/usr/local/bin/talos-mcp-gateway", initPath, "--bind", "/tmp/talos-sandbox-1/egress.sock", socketPath,
				"--ro-bind", "/tmp/talos-sandbox-1/node-preload.cjs", preloadPath,
				"--remount-ro", "/", "--chdir", "/srv/ws", "--",
				initPath, InitCommand, ProxyAddr, socketPath, "--", "/usr/bin/node", "server.js"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Args(c.l, []string{"/usr/bin/node", "server.js"})
			want := slices.Concat(head, sys, c.want)
			if !slices.Equal(got, want) {
				t.Fatalf("Args:\n got %q\nwant %q", got, want)
			}
		})
	}
	for _, p := range systemPaths {
		for _, bad := range []string{"/home", "/root", "/var", "/srv", "/mnt", "/run", "/etc/shadow"} {
			if p == bad || strings.HasPrefix(bad, p+"/") {
				t.Fatalf("system path %s exposes %s", p, bad)
			}
		}
	}
}

// TestWrapEnv: the server gets PATH, HOME, TMPDIR and what is declared,
// nothing else of the gateway's environment, and no value on bwrap's
// command line.
func TestWrapEnv(t *testing.T) {
	t.Setenv("TALOS_TEST_GATEWAY_ONLY", "must-not-pass")
	s := &Sandbox{cfg: Config{ServerID: "fs", Workspace: "/srv/ws"}, bwrap: "/usr/bin/bwrap"}
	argv, env, err := s.Wrap([]string{"/usr/bin/node", "server.js"}, []string{"API_TOKEN=s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	if argv[0] != "/usr/bin/bwrap" || slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(a, "s3cret") }) {
		t.Fatalf("argv %q", argv)
	}
	want := []string{"PATH=" + sandboxPATH, "HOME=/tmp", "TMPDIR=/tmp", "API_TOKEN=s3cret"}
	if !slices.Equal(env, want) {
		t.Fatalf("env %q, want %q", env, want)
	}
	s.proxy = &egressProxy{path: "/tmp/x/egress.sock"}
	s.cfg.Init, s.preload = "/usr/local/bin/talos-mcp-gateway", "/tmp/x/node-preload.cjs"
	argv, env, _ = s.Wrap([]string{"/usr/bin/node"}, nil)
	if !slices.Contains(env, "HTTPS_PROXY=http://"+ProxyAddr) || !slices.Contains(env, "NO_PROXY=") || !slices.Contains(argv, InitCommand) {
		t.Fatalf("with a proxy: argv %q env %q", argv, env)
	}
	if !slices.Contains(env, "NODE_OPTIONS=--require "+preloadPath) || !slices.Contains(argv, preloadPath) {
		t.Fatalf("with a proxy, Node is not given the preload: argv %q env %q", argv, env)
	}
	// A declared NODE_OPTIONS keeps its options after the preload's.
	_, env, _ = s.Wrap([]string{"/usr/bin/node"}, []string{"NODE_OPTIONS=--max-old-space-size=256", "A=b"})
	if want := []string{"A=b", "NODE_OPTIONS=--require " + preloadPath + " --max-old-space-size=256"}; !slices.Equal(env[len(env)-2:], want) ||
		slices.Contains(env, "NODE_OPTIONS=--max-old-space-size=256") {
		t.Fatalf("declared NODE_OPTIONS: env %q, want it to end %q", env, want)
	}
}

func TestNewErrors(t *testing.T) {
	ws := t.TempDir()
	file := filepath.Join(ws, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    Config
		want string
	}{
		{"no workspace", Config{ServerID: "fs"}, "no workspace"},
		{"relative workspace", Config{ServerID: "fs", Workspace: "ws"}, "not an absolute path"},
		{"missing workspace", Config{ServerID: "fs", Workspace: filepath.Join(ws, "nope")}, "no such file"},
		{"workspace is a file", Config{ServerID: "fs", Workspace: file}, "not a directory"},
		{"root as workspace", Config{ServerID: "fs", Workspace: "/"}, "may not be /"},
		{"missing read-only path", Config{ServerID: "fs", Workspace: ws, ReadOnly: []string{"/nonexistent"}}, "read-only path"},
		{"egress without network_outbound", Config{ServerID: "fs", Workspace: ws, Egress: []string{"a.example:443"}}, "network_outbound"},
		{"egress without a port", Config{ServerID: "fs", Workspace: ws, Network: true, Egress: []string{"a.example"}, Init: file}, "want host:port"},
		{"egress port zero", Config{ServerID: "fs", Workspace: ws, Network: true, Egress: []string{"a.example:0"}, Init: file}, "port from 1"},
		{"egress pinned to a name", Config{ServerID: "fs", Workspace: ws, Network: true, Egress: []string{"a.example:443@b.example:443"}, Init: file}, "must be an IP address"},
		{"egress pinned without a port", Config{ServerID: "fs", Workspace: ws, Network: true, Egress: []string{"a.example:443@192.0.2.1"}, Init: file}, "must be an IP address"},
		{"egress without init", Config{ServerID: "fs", Workspace: ws, Network: true, Egress: []string{"a.example:443"}}, "init program"},
		{"bwrap missing", Config{ServerID: "fs", Workspace: ws, Bwrap: "/nonexistent/bwrap"}, "bubblewrap not found"},
		{"bwrap fails", Config{ServerID: "fs", Workspace: ws, Bwrap: "false"}, "bwrap could not start"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(context.Background(), c.c)
			if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `server "fs"`) {
				t.Fatalf("New: %v; want ErrSetup naming the server and %q", err, c.want)
			}
		})
	}
}

// needBwrap fails (never skips) without bubblewrap: scripts/test.sh
// installs it.
func needBwrap(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bwrap is not installed: run scripts/test.sh (it installs bubblewrap)")
	}
}

// TestSandboxBoundaries runs a shell under a real bwrap with the
// boundaries Args draws (CSP MUST 8): the workspace is writable and the
// write reaches the host; the system, the root and the read-only paths are
// not writable; the host's home, the repository and the gateway's
// environment are not visible; only loopback exists.
func TestSandboxBoundaries(t *testing.T) {
	needBwrap(t)
	t.Setenv("TALOS_TEST_GATEWAY_ONLY", "must-not-pass")
	ws, ro := t.TempDir(), t.TempDir()
	repo, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := New(context.Background(), Config{ServerID: "fs", Workspace: ws, ReadOnly: []string{ro}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	script := fmt.Sprintf(`
echo in > %[1]s/in.txt && echo ws-write=ok
for p in /etc/x /usr/x /x %[2]s/x; do (echo x > $p) 2>/dev/null && echo "wrote $p"; done
for p in /root /home %[3]q /var/lib; do [ -e "$p" ] && echo "sees $p"; done
[ -n "$TALOS_TEST_GATEWAY_ONLY" ] && echo leaked-env
echo "declared=$DECLARED pwd=$(pwd)"
echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
`, ws, ro, repo)
	argv, env, err := sb.Wrap([]string{"/bin/sh", "-c", script}, []string{"DECLARED=yes"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sandboxed shell: %v\n%s", err, out)
	}
	want := fmt.Sprintf("ws-write=ok\ndeclared=yes pwd=%s\nifaces=lo \n", ws)
	if string(out) != want {
		t.Fatalf("inside the sandbox:\n%s\nwant:\n%s", out, want)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "in.txt")); err != nil || string(b) != "in\n" {
		t.Fatalf("the workspace write did not reach the host: %q %v", b, err)
	}
}

// TestEgressProxy: the proxy tunnels (CONNECT) and forwards (absolute-form
// GET) to allowlisted destinations only, a pinned one at its address (its
// name resolves nowhere); anything else, the pinned host on another port
// included, gets 403 and never reaches the destination.
func TestEgressProxy(t *testing.T) {
	var mu sync.Mutex
	hits := map[string]int{}
	hs := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits[name]++
			mu.Unlock()
			fmt.Fprint(w, "hello from "+name)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	allowed, other, pinned := hs("allowed"), hs("other"), hs("pinned")
	// docs.talos.test resolves nowhere: only its pinned address reaches it.
	egress := []string{strings.TrimPrefix(allowed.URL, "http://"), "Docs.talos.test:80@" + strings.TrimPrefix(pinned.URL, "http://")}
	s := &Sandbox{cfg: Config{ServerID: "web", Egress: egress, Logger: slog.New(slog.DiscardHandler)}}
	if err := s.startProxy(); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", s.proxy.path)
		},
		Proxy: http.ProxyURL(mustURL(t, "http://proxy.invalid")),
	}}
	get := func(u string) (int, string) {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		return resp.StatusCode, b.String()
	}
	if code, body := get(allowed.URL); code != 200 || body != "hello from allowed" {
		t.Fatalf("allowlisted GET: %d %q", code, body)
	}
	if code, body := get(other.URL); code != 403 || !strings.Contains(body, "not on the allowlist") {
		t.Fatalf("GET off the allowlist: %d %q", code, body)
	}
	if code, body := get("http://docs.talos.test/page"); code != 200 || body != "hello from pinned" {
		t.Fatalf("GET of the pinned destination: %d %q", code, body)
	}
	if code, _ := get("http://docs.talos.test:8080/page"); code != 403 {
		t.Fatalf("GET of the pinned host on another port: %d, want 403", code)
	}
	for dest, want := range map[string]string{strings.TrimPrefix(allowed.URL, "http://"): "200", strings.TrimPrefix(other.URL, "http://"): "403",
		"docs.talos.test:80": "200", "docs.talos.test:443": "403"} {
		c, err := net.Dial("unix", s.proxy.path)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if !strings.Contains(line, " "+want+" ") {
			t.Fatalf("CONNECT %s: %q, want %s", dest, line, want)
		}
	}
	// A tunnel left open does not keep Close waiting.
	c, err := net.Dial("unix", s.proxy.path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dest := strings.TrimPrefix(allowed.URL, "http://")
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.Contains(line, " 200 ") {
		t.Fatalf("CONNECT: %q", line)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs on an open tunnel")
	}
	mu.Lock()
	defer mu.Unlock()
	if hits["other"] != 0 || hits["allowed"] != 1 || hits["pinned"] != 1 {
		t.Fatalf("destinations reached: %v", hits)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestRecord: what receipts say of a sandbox (upstream_sandbox): no
// network without an allowlist; with one, its digest over the normalised,
// sorted, deduplicated entries, so that the order and case an operator
// wrote them in do not change it, and any other allowlist does.
func TestRecord(t *testing.T) {
	s := &Sandbox{cfg: Config{ServerID: "web", Network: true}}
	if got := s.Record(); got != (schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkNone}) {
		t.Fatalf("no allowlist: %+v", got)
	}
	sum := sha256.Sum256([]byte("a.example:80@127.0.0.1:8080\nb.example:443\n"))
	want := "sha256:" + hex.EncodeToString(sum[:])
	s.cfg.Egress = []string{"B.example:443", "a.example:80@127.0.0.1:8080", "b.example:443"}
	if got := s.Record(); got != (schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkAllowlist, AllowlistSHA256: want}) {
		t.Fatalf("allowlist: %+v, want digest %s", got, want)
	}
	for _, other := range [][]string{{"b.example:443"}, {"a.example:80", "b.example:443"}, {"a.example:80@127.0.0.1:8081", "b.example:443"}} {
		if AllowlistSHA256(other) == want {
			t.Fatalf("allowlist %q has the digest of another", other)
		}
	}
	set := Set{s, &Sandbox{cfg: Config{ServerID: "fs"}}}
	if r := set.Records(); len(r) != 2 || r["web"].AllowlistSHA256 != want || r["fs"].Network != schemas.SandboxNetworkNone {
		t.Fatalf("Records: %+v", r)
	}
}
