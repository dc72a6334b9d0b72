package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestMain gives the gateways this binary starts a state directory of
// their own: those without --spool-dir spool under it (DefaultSpoolDir),
// never under the user's home.
func TestMain(m *testing.M) {
	if os.Getenv(lingerEnv) != "" {
		lingeringUpstream()
	}
	state, err := os.MkdirTemp("", "talos-gateway-test-state-")
	if err == nil {
		err = os.Setenv("XDG_STATE_HOME", state)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := testenv.RunWithClickHouse(m)
	os.RemoveAll(state)
	os.Exit(code)
}

// registryDir holds the manifests of the npm MCP servers the tests run.
const registryDir = "../../deploy/mcp/registry"

// stack is talosd (enforce, sink, control) on an embedded NATS the test
// owns (so it can stop and restart it), a private ClickHouse database and
// the keys the commands need.
type stack struct {
	t        *testing.T
	dir      string
	nats     *testenv.NATS
	natsPort int
	natsDir  string
	natsTLS  *natstls.Server // the NATS server's certificate; every process trusts its CA
	chAddr   string
	db       string
	talosctl string
	gateway  string
	registry string // the manifests talosd and the gateways load
}

func startStack(t *testing.T, extra ...string) *stack {
	t.Helper()
	return startStackRegistry(t, registryDir, extra...)
}

// startStackRegistry is startStack with the registry at registry.
func startStackRegistry(t *testing.T, registry string, extra ...string) *stack {
	t.Helper()
	s := &stack{t: t, dir: t.TempDir(), registry: registry}
	s.talosctl = testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	s.gateway = testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talos-mcp-gateway")
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	s.chAddr, s.db = testenv.NewDatabase(t)
	s.natsPort, s.natsDir = testenv.FreePort(t), filepath.Join(s.dir, "nats")
	// NATS requires TLS: talosd, talosctl and the gateways verify it with
	// the CA of TALOS_NATS_CA (--nats-ca), which they inherit.
	var ca string
	s.natsTLS, ca = testenv.NATSTLSForTest(t)
	t.Setenv("TALOS_NATS_CA", ca)
	s.startNATS()
	t.Cleanup(func() {
		if s.nats != nil {
			s.nats.Shutdown()
		}
	})
	for _, k := range []string{"worker", "responder", "issuer", "alice", "bob"} {
		s.ctl("keys", "gen", "--out", filepath.Join(s.dir, k))
	}
	args := append([]string{"--data-dir", filepath.Join(s.dir, "talos-data"), "--nats-url", s.natsURL(),
		"--clickhouse-addr", s.chAddr, "--clickhouse-database", s.db, "--registry", s.registry,
		"--signing-key", filepath.Join(s.dir, "worker.key"), "--responder-keys", filepath.Join(s.dir, "responder.pub"),
		"--capability-issuers", filepath.Join(s.dir, "issuer.pub"), "--capabilities", "optional",
		"--http-addr", "", "--chains", "1", "--checkpoint-interval", "1s"}, extra...)
	d := testenv.Command(talosd, args...)
	logf, err := os.Create(filepath.Join(s.dir, "talosd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait(); logf.Close() })
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(s.dir, "talosd.log"))
			t.Logf("talosd log (tail):\n%s", tail(string(b), 3000))
		}
	})
	return s
}

// clickhouse opens the stack's database once talosd's sink has brought it
// to the current schema. talosd answers calls before its sink has run
// every migration, and a migration may drop a view to create it again:
// a test that queried then would find no such view.
func (s *stack) clickhouse(t *testing.T, ctx context.Context) driver.Conn {
	t.Helper()
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		version, err := query.AppliedVersion(ctx, conn, s.db)
		if err == nil && version >= query.SchemaVersion() {
			return conn
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			conn.Close()
			t.Fatalf("database %s not migrated to schema version %d: at %d (%v)", s.db, query.SchemaVersion(), version, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rowCounter runs a count query on conn; it fails the test if the query
// does.
func rowCounter(ctx context.Context, t *testing.T, conn driver.Conn) func(q string, args ...any) uint64 {
	return func(q string, args ...any) uint64 {
		t.Helper()
		var n uint64
		if err := conn.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
}

func (s *stack) natsURL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.natsPort) }

func (s *stack) startNATS() {
	n, err := testenv.StartNATS(testenv.NATSOptions{Dir: s.natsDir, Port: s.natsPort, TLS: s.natsTLS})
	if err != nil {
		s.t.Fatal(err)
	}
	s.nats = n
}

func (s *stack) stopNATS() {
	s.nats.Shutdown()
	s.nats = nil
}

// ctl runs talosctl and fails the test on a non-zero exit.
func (s *stack) ctl(args ...string) string {
	s.t.Helper()
	out, code := s.ctlCode(args...)
	if code != 0 {
		s.t.Fatalf("talosctl %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

func (s *stack) ctlCode(args ...string) (string, int) {
	s.t.Helper()
	g := []string{"--nats-url", s.natsURL(), "--nats-auth", "none", "--clickhouse-addr", s.chAddr, "--clickhouse-database", s.db}
	if len(args) > 0 && (args[0] == "keys" || args[0] == "cap") {
		g = nil
	}
	cmd := testenv.Command(s.talosctl, append(g, args...)...)
	cmd.Env = append(os.Environ(), "TALOS_RESPONDER_KEY="+filepath.Join(s.dir, "responder.key"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return string(out), 0
}

// upstreams are the npm servers behind the gateway: server-everything,
// and server-filesystem over root, which is also the gateway's workspace
// for it (the root of its path arguments).
func upstreams(t *testing.T, root string) []string {
	return []string{
		"--upstream", "everything=" + testenv.MCPBin(t, "mcp-server-everything"),
		"--upstream", "fs=" + testenv.MCPBin(t, "mcp-server-filesystem") + " " + root,
		"--workspace", "fs=" + root,
	}
}

// gatewaySession starts the gateway binary as a stdio MCP server and
// connects the Go SDK client to it.
type gatewaySession struct {
	cs  *mcp.ClientSession
	log string // the gateway's stderr file
	// forwarded holds the tool_call_id of every call that returned a
	// result (the gateway forwarded it), with its tool.
	forwarded sync.Map
}

func (s *stack) gatewaySession(ctx context.Context, args ...string) *gatewaySession {
	s.t.Helper()
	return s.gatewayClient(ctx, nil, args...)
}

// gatewayClient is gatewaySession with client (nil: a plain one).
func (s *stack) gatewayClient(ctx context.Context, client *mcp.Client, args ...string) *gatewaySession {
	s.t.Helper()
	return s.connectGatewayWith(ctx, testenv.Command(s.gateway, append([]string{"--nats-url", s.natsURL(), "--nats-auth", "none",
		"--registry", s.registry, "--trusted-keys", filepath.Join(s.dir, "worker.pub"), "--log-level", "debug"}, args...)...), client)
}

// connectGateway starts cmd, a gateway, as a stdio MCP server and connects
// the Go SDK client to it.
func (s *stack) connectGateway(ctx context.Context, cmd *exec.Cmd) *gatewaySession {
	s.t.Helper()
	return s.connectGatewayWith(ctx, cmd, nil)
}

// connectGatewayWith is connectGateway with client (nil: a plain one).
func (s *stack) connectGatewayWith(ctx context.Context, cmd *exec.Cmd, client *mcp.Client) *gatewaySession {
	s.t.Helper()
	g := &gatewaySession{log: filepath.Join(s.dir, fmt.Sprintf("gateway-%d.log", time.Now().UnixNano()))}
	logf, err := os.Create(g.log)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = logf
	if client == nil {
		client = mcp.NewClient(&mcp.Implementation{Name: "talos-gateway-test", Version: "1"}, nil)
	}
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		b, _ := os.ReadFile(g.log)
		s.t.Fatalf("connect to the gateway: %v\n%s", err, b)
	}
	g.cs = cs
	s.t.Cleanup(func() {
		_ = cs.Close()
		logf.Close()
		if s.t.Failed() {
			b, _ := os.ReadFile(g.log)
			s.t.Logf("gateway log (tail):\n%s", tail(string(b), 3000))
		}
	})
	return g
}

// serveGateway starts cmd, a gateway in HTTP mode, with its output in a
// log under the stack's directory, and waits up to 60 s for
// base/healthz to answer 200 over client. The gateway stops with the
// test; if the test failed, the tail of its log is logged.
func (s *stack) serveGateway(t *testing.T, cmd *exec.Cmd, client *http.Client, base string) {
	t.Helper()
	logf, err := os.CreateTemp(s.dir, "gateway-http-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("gateway log (tail):\n%s", tail(string(b), 4000))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not healthy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// result is a tools/call outcome: the result, or the denial the gateway
// answered with.
type result struct {
	res    *mcp.CallToolResult
	denied *gateway.Denial
	err    error
}

func (g *gatewaySession) call(ctx context.Context, tool string, args map[string]any) result {
	res, err := g.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		if id, ok := res.Meta[gateway.MetaToolCallID].(string); ok {
			g.forwarded.Store(id, tool)
		}
		return result{res: res}
	}
	var we *jsonrpc.Error
	if errors.As(err, &we) && we.Code == gateway.CodeDenied {
		var d gateway.Denial
		if jerr := json.Unmarshal(we.Data, &d); jerr == nil {
			return result{denied: &d, err: err}
		}
	}
	return result{err: err}
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func (r result) mustAllow(t *testing.T, what string) *mcp.CallToolResult {
	t.Helper()
	if r.res == nil {
		t.Fatalf("%s: want a result, got %v (denial %+v)", what, r.err, r.denied)
	}
	id, _ := r.res.Meta[gateway.MetaToolCallID].(string)
	rid, _ := r.res.Meta[gateway.MetaReceiptID].(string)
	if id == "" || rid == "" {
		t.Fatalf("%s: the result's _meta names no tool_call_id/receipt_id: %v", what, r.res.Meta)
	}
	return r.res
}

func (r result) mustDeny(t *testing.T, what string, codes ...string) *gateway.Denial {
	t.Helper()
	if r.denied == nil {
		t.Fatalf("%s: want a denial with %v, got result %v / error %v", what, codes, r.res, r.err)
	}
	for _, c := range codes {
		if !slices.Contains(r.denied.ReasonCodes, c) {
			t.Fatalf("%s: denial %v lacks %s", what, r.denied.ReasonCodes, c)
		}
	}
	if r.denied.ToolCallID == "" {
		t.Fatalf("%s: denial names no tool_call_id", what)
	}
	return r.denied
}

var approveLine = regexp.MustCompile(`msg="call awaits approval" tool_call_id=([0-9a-f-]{36})`)

// awaitingApproval waits for the gateway to log a call parked for
// approval that was not returned before, and returns its tool_call_id.
func (g *gatewaySession) awaitingApproval(t *testing.T, seen map[string]bool) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(g.log)
		for _, m := range approveLine.FindAllStringSubmatch(string(b), -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				return m[1]
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the gateway never logged a call awaiting approval")
	return ""
}

// TestGatewayEndToEnd puts server-everything and server-filesystem behind
// the gateway and drives it with the Go SDK client: allowed calls return
// the servers' real results, denied ones MCP errors with reason codes; a
// kill switch takes effect on the next call; one parked call is approved
// and one rejected; with NATS stopped calls are denied and flow again once
// it is back; every call has its receipts and ToolCallEvent in ClickHouse,
// no planted secret reaches ClickHouse, and talosctl verify passes.
func TestGatewayEndToEnd(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("hello from the filesystem server\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	metricsAddr := testenv.FreeAddr(t)
	metrics := "http://" + metricsAddr
	gw := s.gatewaySession(ctx, append(upstreams(t, root), "--ep-id", "gw-e2e", "--approval-timeout", "60s",
		"--decision-timeout", "3s", "--metrics-addr", metricsAddr)...)
	healthz := func() int {
		resp, err := http.Get(metrics + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	names := gw.toolNames(ctx, t)
	for _, want := range []string{"echo", "get-sum", "read_text_file", "write_file", "get-resource-links"} {
		if !slices.Contains(names, want) {
			t.Fatalf("tools/list lacks %s: %v", want, names)
		}
	}

	var ids sync.Map // tool_call_id → what the test expects in ClickHouse
	const secret = "AKIAZ4R7QW2MXT5LPV3N"
	// Allowed calls return the upstream's real results.
	res := gw.call(ctx, "echo", map[string]any{"message": "hi " + secret}).mustAllow(t, "echo")
	if got := text(res); got != "Echo: hi "+secret {
		t.Fatalf("echo: %q", got)
	}
	checkForwardedLog(t, gw.log, res.Meta[gateway.MetaToolCallID].(string))
	res = gw.call(ctx, "get-sum", map[string]any{"a": 2, "b": 40}).mustAllow(t, "get-sum")
	if !strings.Contains(text(res), "42") {
		t.Fatalf("get-sum: %q", text(res))
	}
	res = gw.call(ctx, "read_text_file", map[string]any{"path": filepath.Join(root, "notes.txt")}).mustAllow(t, "read_text_file")
	if !strings.Contains(text(res), "hello from the filesystem server") {
		t.Fatalf("read_text_file: %q", text(res))
	}
	gw.call(ctx, "write_file", map[string]any{"path": filepath.Join(root, "out.txt"), "content": "written via talos"}).mustAllow(t, "write_file")
	if b, err := os.ReadFile(filepath.Join(root, "out.txt")); err != nil || string(b) != "written via talos" {
		t.Fatalf("write_file did not write: %q %v", b, err)
	}
	// --metrics-addr: the stdio gateway's /metrics times the four calls'
	// stages, and /healthz says it is connected.
	checkStageMetric(t, http.DefaultClient, metrics)
	if code := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz while connected: %d", code)
	}

	// Denied: a tool no upstream offers, and a path outside the server's
	// root (the upstream refuses: the call ran, ok=false).
	d := gw.call(ctx, "no-such-tool", map[string]any{}).mustDeny(t, "unknown tool", schemas.CodeUnknownTool, schemas.CodeToolHidden)
	if d.ReceiptID == "" {
		t.Fatal("unknown tool: the denial names no receipt")
	}
	ids.Store(d.ToolCallID, "deny")

	// Kill switch on echo: the very next call is denied.
	s.ctl("killswitch", "set", "tool:everything/echo", "--reason", "gateway test", "--wait")
	gw.call(ctx, "echo", map[string]any{"message": "after kill"}).mustDeny(t, "echo under kill switch", schemas.CodeKillSwitch)
	gw.call(ctx, "get-sum", map[string]any{"a": 1, "b": 1}).mustAllow(t, "get-sum beside the kill switch")
	s.ctl("killswitch", "clear", "tool:everything/echo", "--reason", "gateway test done", "--wait")
	gw.call(ctx, "echo", map[string]any{"message": "after clear"}).mustAllow(t, "echo after clear")

	// Approval: get-resource-links is community trust.
	parked := map[string]bool{}
	approved := make(chan result, 1)
	go func() { approved <- gw.call(ctx, "get-resource-links", map[string]any{"count": 2}) }()
	id := gw.awaitingApproval(t, parked)
	s.ctl("approve", id, "--reason", "looks fine")
	r := <-approved
	res = r.mustAllow(t, "approved call")
	if res.IsError || len(res.Content) == 0 {
		t.Fatalf("approved call: the server did not answer it: %+v", res)
	}
	ids.Store(id, "approved")
	if out, code := s.ctlCode("approve", id); code != 1 || !strings.Contains(out, "CTL_") {
		t.Fatalf("second approve of one call: exit %d\n%s", code, out)
	}

	rejected := make(chan result, 1)
	go func() { rejected <- gw.call(ctx, "get-resource-links", map[string]any{"count": 1}) }()
	id = gw.awaitingApproval(t, parked)
	s.ctl("reject", id, "--reason", "not today")
	r = <-rejected
	r.mustDeny(t, "rejected call", schemas.CodeApprovalRejected)
	ids.Store(id, "rejected")

	// NATS stopped mid-session: denied, not passed through, and /healthz
	// says so.
	s.stopNATS()
	testenv.WaitFor(t, 20*time.Second, func() bool { return healthz() == http.StatusServiceUnavailable })
	r = gw.call(ctx, "get-sum", map[string]any{"a": 3, "b": 4})
	d = r.mustDeny(t, "call with NATS down")
	if !slices.Contains(d.ReasonCodes, schemas.CodeEnforcementUnavailable) && !slices.Contains(d.ReasonCodes, schemas.CodeDecisionTimeout) {
		t.Fatalf("call with NATS down: codes %v", d.ReasonCodes)
	}
	downID := d.ToolCallID
	s.startNATS()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r = gw.call(ctx, "get-sum", map[string]any{"a": 5, "b": 6})
		if r.res != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls did not flow again after NATS returned: %v %+v", r.err, r.denied)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(text(r.res), "11") {
		t.Fatalf("get-sum after NATS returned: %q", text(r.res))
	}
	if code := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz after NATS returned: %d", code)
	}

	// The inspector CLI, a second real MCP client. It starts the gateway
	// with an environment of its own: the CA goes as a flag.
	insp := testenv.CommandContext(ctx, testenv.MCPBin(t, "mcp-inspector"), "--cli", s.gateway,
		"--nats-url", s.natsURL(), "--nats-auth", "none", "--nats-ca", s.natsTLS.CA(), "--registry", registryDir, "--ep-id", "gw-inspector",
		"--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"),
		"--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=from the inspector")
	out, err := insp.Output()
	if err != nil || !strings.Contains(string(out), "Echo: from the inspector") {
		t.Fatalf("inspector tools/call: %v\n%s", err, out)
	}
	// ClickHouse: every call of this session has its receipts and a
	// ToolCallEvent; the call denied with NATS down too (its post event
	// waited in the gateway's outbox).
	conn := s.clickhouse(t, ctx)
	defer conn.Close()
	count := rowCounter(ctx, t, conn)
	testenv.WaitUntil(t, 60*time.Second, 300*time.Millisecond, "the NATS-down call's post event", func() bool {
		return count("SELECT count() FROM tool_calls WHERE tool_call_id = ?", downID) > 0
	})
	var code string
	if err := conn.QueryRow(ctx, "SELECT error_code FROM tool_calls WHERE tool_call_id = ? LIMIT 1", downID).Scan(&code); err != nil {
		t.Fatal(err)
	}
	if code != schemas.CodeEnforcementUnavailable && code != schemas.CodeDecisionTimeout {
		t.Fatalf("NATS-down call recorded with error_code %q", code)
	}
	ids.Range(func(k, v any) bool {
		id := k.(string)
		testenv.WaitUntil(t, 60*time.Second, 300*time.Millisecond, "receipts of "+id, func() bool {
			return count("SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'decision'", id) > 0 &&
				count("SELECT count() FROM tool_calls WHERE tool_call_id = ?", id) > 0
		})
		return true
	})
	// Every forwarded call: its allow (or approval) decision, its effect
	// receipt and its ToolCallEvent.
	nForwarded := 0
	gw.forwarded.Range(func(k, v any) bool {
		id := k.(string)
		nForwarded++
		testenv.WaitUntil(t, 60*time.Second, 300*time.Millisecond, "the records of forwarded call "+v.(string), func() bool {
			return count("SELECT uniqExact(receipt_id) FROM receipts WHERE tool_call_id = ? AND kind = 'decision'", id) == 1 &&
				count("SELECT uniqExact(receipt_id) FROM receipts WHERE tool_call_id = ? AND kind = 'effect'", id) == 1 &&
				count("SELECT count() FROM tool_calls WHERE tool_call_id = ?", id) >= 1
		})
		return true
	})
	if nForwarded < 8 {
		t.Fatalf("only %d forwarded calls were tracked", nForwarded)
	}
	var decision string
	approvedID := ""
	ids.Range(func(k, v any) bool {
		if v == "approved" {
			approvedID = k.(string)
		}
		return true
	})
	if err := conn.QueryRow(ctx, "SELECT decision FROM receipts WHERE tool_call_id = ? AND kind = 'decision' LIMIT 1", approvedID).Scan(&decision); err != nil || decision != schemas.DecisionRequireApproval {
		t.Fatalf("approved call's decision receipt: %q %v", decision, err)
	}
	if n := count("SELECT count() FROM control_events WHERE verb IN ('approve', 'reject')"); n < 2 {
		t.Fatalf("approve/reject control events in ClickHouse: %d", n)
	}
	// No planted secret anywhere in ClickHouse.
	for _, table := range []string{"receipts", "tool_calls", "artifacts", "control_events", "checkpoints"} {
		var n uint64
		q := fmt.Sprintf("SELECT count() FROM %s WHERE positionCaseInsensitive(toString(tuple(*)), ?) > 0", table)
		if err := conn.QueryRow(ctx, q, secret).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if n != 0 {
			t.Fatalf("the planted secret reached %s (%d rows)", table, n)
		}
	}
	if out, code := s.ctlCode("verify", "--trusted-keys", filepath.Join(s.dir, "worker.pub")); code != 0 {
		t.Fatalf("talosctl verify: exit %d\n%s", code, out)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

var forwardedTimes = regexp.MustCompile(` decision=[0-9.]+[µm]?s post=[0-9.]+[µm]?s`)

// checkForwardedLog: the gateway logged the forwarded call id with the
// time its decision and its post event took (a stdio gateway has no
// /metrics).
func checkForwardedLog(t *testing.T, log, id string) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, `msg="call forwarded" tool_call_id=`+id) {
			if !forwardedTimes.MatchString(line) {
				t.Fatalf("the forwarded call's log line has no decision and post times: %s", line)
			}
			return
		}
	}
	t.Fatalf("no log line for the forwarded call %s:\n%s", id, tail(string(b), 3000))
}
