package main

import (
	"context"
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
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// rugManifest classifies testenv/mcp/rugpull.mjs's tools, unpinned.
const rugManifest = `{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "rug",
  "tools": [
    {"tool_name": "greet", "tool_class": "read", "is_document_op": false, "trust_level": "internal"},
    {"tool_name": "rug", "tool_class": "read", "is_document_op": false, "trust_level": "internal"}]}`

// TestToolDefinitionPinning (OWASP MCP03, the "rug pull"): talosctl
// registry lint --write-pins pins the definitions a real stdio server
// lists, after which the lint is clean and a server that lists another
// definition fails it (DRIFT, exit 1). Behind the gateway, against a real
// pipeline, the pinned tool works until the server rewrites its
// description mid-session and announces a new tool list: the tool then
// disappears from tools/list; before anyone calls it, the gateway has
// reported the drift (one DENY_TOOL_DRIFT receipt in its drift session in
// ClickHouse, and talosctl query denials-by-reason shows it); and a call
// to it is denied DENY_TOOL_DRIFT by the worker, with a receipt, and never
// reaches the server. In HTTP mode, /metrics counts a drift (driftOverHTTP),
// and a rug pull on one client's own upstream session is caught the same
// way (driftOnClientSession).
func TestToolDefinitionPinning(t *testing.T) {
	script, _ := testenv.MCPScript(t, "rugpull.mjs")
	reg := t.TempDir()
	manifest := filepath.Join(reg, "rug.json")
	if err := os.WriteFile(manifest, []byte(rugManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	server := "rug=node " + script
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	lint := func(args ...string) (string, int) {
		t.Helper()
		out, err := testenv.Command(talosctl, append([]string{"registry", "lint"}, args...)...).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	out, code := lint("--server", server, "--registry", manifest, "--write-pins")
	if code != 0 || !strings.Contains(out, "pinned the live definitions of rug in "+manifest+" (2 changed)") {
		t.Fatalf("--write-pins: exit %d\n%s", code, out)
	}
	b, _ := os.ReadFile(manifest)
	if strings.Count(string(b), `"definition_sha256"`) != 2 {
		t.Fatalf("the manifest holds no pins:\n%s", b)
	}
	if out, code := lint("--server", server, "--registry", reg); code != 0 || !strings.Contains(out, "0 drifted") {
		t.Fatalf("lint after pinning: exit %d\n%s", code, out)
	}
	out, code = lint("--server", server+" --drifted", "--registry", reg)
	if code != 1 || !strings.Contains(out, "DRIFT") || !strings.Contains(out, "rug/greet") || strings.Contains(out, "rug/rug ") {
		t.Fatalf("lint of a drifted server: exit %d\n%s", code, out)
	}
	s := startStackRegistry(t, reg) // talosd and the gateway enforce the pinned registry

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gw := s.gatewaySession(ctx, "--ep-id", "gw-rug", "--upstream", server)
	listed := func() []string { return gw.toolNames(ctx, t) }
	if names := listed(); !slices.Contains(names, "greet") || !slices.Contains(names, "rug") {
		t.Fatalf("tools/list before the rug pull: %v", names)
	}
	if res := gw.call(ctx, "greet", map[string]any{"name": "Ada"}).mustAllow(t, "greet"); text(res) != "Hello, Ada!" {
		t.Fatalf("greet: %q", text(res))
	}
	gw.call(ctx, "rug", map[string]any{}).mustAllow(t, "rug")
	deadline := time.Now().Add(30 * time.Second)
	for slices.Contains(listed(), "greet") {
		if time.Now().After(deadline) {
			t.Fatal("greet is still listed after its definition changed")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if names := listed(); !slices.Contains(names, "rug") {
		t.Fatalf("the unchanged tool disappeared too: %v", names)
	}
	// Before anyone calls greet, the gateway has reported the drift: a
	// DENY_TOOL_DRIFT receipt for rug/greet in its drift session, one for
	// the one new definition.
	assertDriftReported(ctx, t, s, "gw-rug", "rug", "greet")
	d := gw.call(ctx, "greet", map[string]any{"name": "Ada"}).mustDeny(t, "greet after the rug pull", schemas.CodeDenyToolDrift)
	if d.ReceiptID == "" {
		t.Fatal("the drift denial names no receipt")
	}
	logb, _ := os.ReadFile(gw.log)
	if !strings.Contains(string(logb), "tool definition drifted from its registry pin") ||
		strings.Contains(string(logb), `msg="call forwarded" tool_call_id=`+d.ToolCallID) {
		t.Fatalf("gateway log: no drift incident, or the denied call was forwarded:\n%s", tail(string(logb), 3000))
	}
	assertWorkerDenied(ctx, t, s, d.ToolCallID, schemas.CodeDenyToolDrift)
	if n := driftReports(ctx, t, s, "gw-rug", "rug", "greet"); n != 1 {
		t.Fatalf("the drift of rug/greet was reported %d times, want once", n)
	}
	if out := s.ctl("query", "denials-by-reason"); !strings.Contains(out, schemas.CodeDenyToolDrift) {
		t.Fatalf("talosctl query denials-by-reason shows no drift:\n%s", out)
	}
	driftOverHTTP(ctx, t, s, reg, server)
	driftOnClientSession(ctx, t, s, reg, server)
	driftOnNewClientSession(ctx, t, s, reg, server)
}

// driftOnNewClientSession: a client's own upstream session that lists a
// drifted definition from its start, made for a call Talos already
// allowed with the pinned one: the gateway does not forward the call (the
// client gets an error, its post event records DENY_TOOL_DRIFT), reports
// the drift, and denies greet from then on.
func driftOnNewClientSession(ctx context.Context, t *testing.T, s *stack, reg, server string) {
	t.Helper()
	flag := filepath.Join(t.TempDir(), "drifted")
	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	s.httpGateway(t, base, "--ep-id", "gw-rug-new", "--upstream", server+" --drifted-if="+flag, "--registry", reg,
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--insecure-plain-http", "--principals", filepath.Join(s.dir, "principals.json"))
	g := httpSession(ctx, t, base, "ops-token")
	// The gateway's own server process started before the flag: greet is
	// listed; the client's own process starts with its first call.
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := g.call(ctx, "greet", map[string]any{"name": "Ada"})
	if r.err == nil || r.denied != nil || !strings.Contains(r.err.Error(), "drifted from its registry pin") {
		t.Fatalf("greet on a session that started drifted: %+v, want the gateway's refusal to forward it", r)
	}
	assertDriftReported(ctx, t, s, "gw-rug-new", "rug", "greet")
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testenv.WaitFor(t, 60*time.Second, func() bool { // the post event of the call not forwarded
		var n uint64
		err := conn.QueryRow(ctx, "SELECT count() FROM tool_calls FINAL WHERE ep_id = 'gw-rug-new' AND tool_name = 'greet' AND phase = 'post' AND error_code = ?",
			schemas.CodeDenyToolDrift).Scan(&n)
		return err == nil && n == 1
	})
	d := g.call(ctx, "greet", map[string]any{"name": "Ada"}).mustDeny(t, "greet after its session listed a drifted definition", schemas.CodeDenyToolDrift)
	assertWorkerDenied(ctx, t, s, d.ToolCallID, schemas.CodeDenyToolDrift)
}

// driftOnClientSession: in HTTP mode each client's calls run on upstream
// sessions of its own (here, a rugpull.mjs process per client). One
// client has greet rewritten on its own session (rug); the gateway, whose
// own session still lists the pinned definition, reads that session's
// list_changed: greet leaves the client's tools/list, the drift is
// reported once before anyone calls greet, and the client's call is
// denied DENY_TOOL_DRIFT by the worker with a receipt and never reaches
// the server. A second client, whose own server process never changed,
// no longer sees greet either and is denied too: a server seen to rug-pull
// is not trusted with that tool again.
func driftOnClientSession(ctx context.Context, t *testing.T, s *stack, reg, server string) {
	t.Helper()
	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	s.httpGateway(t, base, "--ep-id", "gw-rug-client", "--upstream", server, "--registry", reg,
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--insecure-plain-http", "--principals", filepath.Join(s.dir, "principals.json"))
	a := httpSession(ctx, t, base, "ops-token")
	listedA := func() []string { return a.toolNames(ctx, t) }
	if names := listedA(); !slices.Contains(names, "greet") {
		t.Fatalf("HTTP tools/list before the rug pull: %v", names)
	}
	if res := a.call(ctx, "greet", map[string]any{"name": "Ada"}).mustAllow(t, "greet on the client's session"); text(res) != "Hello, Ada!" {
		t.Fatalf("greet: %q", text(res))
	}
	a.call(ctx, "rug", map[string]any{}).mustAllow(t, "rug on the client's session")
	testenv.WaitFor(t, 30*time.Second, func() bool { return !slices.Contains(listedA(), "greet") })
	assertDriftReported(ctx, t, s, "gw-rug-client", "rug", "greet")
	d := a.call(ctx, "greet", map[string]any{"name": "Ada"}).mustDeny(t, "greet after the rug pull on the client's session", schemas.CodeDenyToolDrift)
	assertWorkerDenied(ctx, t, s, d.ToolCallID, schemas.CodeDenyToolDrift)

	b := httpSession(ctx, t, base, "ops-token")
	if names := b.toolNames(ctx, t); slices.Contains(names, "greet") || !slices.Contains(names, "rug") {
		t.Fatalf("a second client's tools/list after the rug pull: %v", names)
	}
	d = b.call(ctx, "greet", map[string]any{"name": "Bob"}).mustDeny(t, "greet from a second client", schemas.CodeDenyToolDrift)
	assertWorkerDenied(ctx, t, s, d.ToolCallID, schemas.CodeDenyToolDrift)
	if n := driftReports(ctx, t, s, "gw-rug-client", "rug", "greet"); n != 1 {
		t.Fatalf("the drift of rug/greet was reported %d times, want once", n)
	}
}

// driftMetric is the drift counter of rug/greet in /metrics.
var driftMetric = regexp.MustCompile(`talos_gateway_tool_drift_total\{server_id="rug",tool="greet"\} (\d+)`)

// driftOverHTTP: behind a gateway in HTTP mode, a server that lists a
// drifted definition from the start (rugpull.mjs --drifted): /metrics
// counts the drift of rug/greet once, greet is missing from a streamable
// HTTP client's tools/list while rug is listed, and a call to greet is
// denied DENY_TOOL_DRIFT without being counted again. (The drift is the
// gateway's own upstream session's: in HTTP mode a client's calls go to
// upstream sessions of its own, whose list_changed the gateway does not
// compare with the pins.)
func driftOverHTTP(ctx context.Context, t *testing.T, s *stack, reg, server string) {
	t.Helper()
	writeJSON(t, filepath.Join(s.dir, "principals.json"), map[string]any{"principals": []map[string]string{
		{"name": "ops", "token_sha256": sha("ops-token"), "agent_id": "ops"}}})
	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	s.httpGateway(t, base, "--ep-id", "gw-rug-http", "--upstream", server+" --drifted", "--registry", reg,
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--insecure-plain-http", "--principals", filepath.Join(s.dir, "principals.json"))
	drifts := func() int {
		t.Helper()
		m := driftMetric.FindSubmatch(readMetrics(t, http.DefaultClient, base))
		if m == nil {
			return 0 // a counter with no drift yet has no series
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	g := httpSession(ctx, t, base, "ops-token")
	if names := g.toolNames(ctx, t); slices.Contains(names, "greet") || !slices.Contains(names, "rug") {
		t.Fatalf("HTTP tools/list with greet drifted: %v", g.toolNames(ctx, t))
	}
	deadline := time.Now().Add(10 * time.Second)
	for drifts() == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := drifts(); n != 1 {
		t.Fatalf("/metrics counts %d drifts of rug/greet, want 1", n)
	}
	g.call(ctx, "greet", map[string]any{"name": "Ada"}).mustDeny(t, "greet over HTTP, drifted", schemas.CodeDenyToolDrift)
	if n := drifts(); n != 1 {
		t.Fatalf("/metrics counts %d drifts of rug/greet after the denied call, want still 1", n)
	}
}

// driftReports is how many decision receipts ClickHouse holds for the
// drift reports of server/tool by enforcement point epID.
func driftReports(ctx context.Context, t *testing.T, s *stack, epID, server, tool string) int {
	t.Helper()
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM receipts FINAL WHERE session_id = ? AND server_id = ? AND tool_name = ? AND kind = 'decision'",
		"tool-drift-"+epID, server, tool).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// assertDriftReported waits for the decision receipt of the gateway's
// report that server/tool drifted from its pin (no call needed) and checks
// the worker denied it DENY_TOOL_DRIFT, and that it is the only one.
func assertDriftReported(ctx context.Context, t *testing.T, s *stack, epID, server, tool string) {
	t.Helper()
	decision, codes := waitDecision(ctx, t, s, "the drift report of "+server+"/"+tool,
		"session_id = ? AND server_id = ? AND tool_name = ?", "tool-drift-"+epID, server, tool)
	if decision != schemas.DecisionDeny || !slices.Contains(codes, schemas.CodeDenyToolDrift) {
		t.Fatalf("receipt of the drift report of %s/%s: %s %v, want deny with %s", server, tool, decision, codes, schemas.CodeDenyToolDrift)
	}
	if n := driftReports(ctx, t, s, epID, server, tool); n != 1 {
		t.Fatalf("the drift of %s/%s was reported %d times, want once", server, tool, n)
	}
}

// waitDecision waits up to 60 s for the decision receipt in ClickHouse
// that where (a condition on receipts, with its args) names, and returns
// its decision and reason codes; what names it in the failure.
func waitDecision(ctx context.Context, t *testing.T, s *stack, what, where string, args ...any) (decision string, codes []string) {
	t.Helper()
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := conn.QueryRow(ctx, "SELECT decision, reason_codes FROM receipts WHERE "+where+" AND kind = 'decision' LIMIT 1", args...).Scan(&decision, &codes)
		if err == nil {
			return decision, codes
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision receipt of %s: %v", what, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// assertWorkerDenied waits for the call's decision receipt in ClickHouse
// and checks the worker denied it with code.
func assertWorkerDenied(ctx context.Context, t *testing.T, s *stack, id, code string) {
	t.Helper()
	decision, codes := waitDecision(ctx, t, s, id, "tool_call_id = ?", id)
	if decision != schemas.DecisionDeny || !slices.Contains(codes, code) {
		t.Fatalf("receipt of %s: %s %v, want deny with %s", id, decision, codes, code)
	}
}

// httpSession is an MCP session with the gateway serving streamable HTTP
// at base, as the principal of bearer token; it closes with the test.
func httpSession(ctx context.Context, t *testing.T, base, token string) *gatewaySession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "talos-test-client", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return &gatewaySession{cs: cs}
}

// toolNames are the names of the tools the session's tools/list shows.
func (g *gatewaySession) toolNames(ctx context.Context, t *testing.T) []string {
	t.Helper()
	res, err := g.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names
}
