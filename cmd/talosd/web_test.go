package main

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"image/png"
	"io"
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

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// findChromium returns Debian's chromium, or fails: CI runs
// scripts/test.sh, which installs it, so a missing browser is an error,
// not a reason to skip.
func findChromium(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/usr/bin/chromium"); err == nil && !st.IsDir() {
		return "/usr/bin/chromium"
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Fatal("chromium is not installed: run scripts/test.sh (installs chromium), or apt-get install chromium")
	return ""
}

// artifactsDir is where the screenshots go: $TALOS_TEST_ARTIFACTS, else
// <repo root>/test-artifacts/web.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TALOS_TEST_ARTIFACTS")
	if dir == "" {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
			t.Fatalf("repo root %s: %v", root, err)
		}
		dir = filepath.Join(root, "test-artifacts", "web")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browse loads url in headless Chromium, saves a 1280x1000 screenshot as
// <name>.png and the DOM as <name>.html under dir, and returns the DOM.
func browse(t *testing.T, chromium, dir, name, url string) string {
	t.Helper()
	profile, err := os.MkdirTemp("", "talos-chromium-*")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(profile)
	shot := filepath.Join(dir, name+".png")
	_ = os.Remove(shot)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testenv.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+profile, "--window-size=1280,1000", "--screenshot="+shot, "--dump-dom", url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", name, err, stderr.String())
	}
	dom := stdout.String()
	if err := os.WriteFile(filepath.Join(dir, name+".html"), stdout.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	checkScreenshot(t, shot)
	return dom
}

// checkScreenshot fails unless path is a 1280x1000 PNG with a real page
// on it (many colours, not a blank or single-colour image).
func checkScreenshot(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer f.Close()
	st, _ := f.Stat()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 1000 {
		t.Errorf("screenshot %s is %dx%d, want 1280x1000", path, b.Dx(), b.Dy())
	}
	colours := map[[3]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, _ := img.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
		}
	}
	if len(colours) < 32 || st.Size() < 10_000 {
		t.Errorf("screenshot %s looks blank: %d colours, %d bytes", path, len(colours), st.Size())
	}
}

var domFigure = regexp.MustCompile(`data-figure="([^"]*)"[^>]*>([^<]*)<`)

// domFigures reads the data-figure elements of a DOM: key -> text.
func domFigures(dom string) map[string]string {
	out := map[string]string{}
	for _, m := range domFigure.FindAllStringSubmatch(dom, -1) {
		out[html.UnescapeString(m[1])] = strings.TrimSpace(html.UnescapeString(m[2]))
	}
	return out
}

// figuresWithPrefix is the subset of figs whose key starts with prefix.
func figuresWithPrefix(figs map[string]string, prefix string) map[string]string {
	out := map[string]string{}
	for k, v := range figs {
		if strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return out
}

func sameFigures(t *testing.T, page, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %s figures %v, want (from ClickHouse) %v", page, what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s figure %q = %q, want (from ClickHouse) %q", page, what, k, got[k], v)
		}
	}
}

// sqlFigures runs sql (rows of key, count) and returns prefix+key -> count.
func sqlFigures(t *testing.T, ctx context.Context, conn driver.Conn, prefix, sql string, args ...any) map[string]string {
	t.Helper()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var (
			k string
			n uint64
		)
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[prefix+k] = strconv.FormatUint(n, 10)
	}
	return out
}

// TestWebDashboardInChromium runs talosd with every role against real NATS
// and ClickHouse, drives calls through it (allows, denials of five
// reasons, a kill switch set and cleared), then loads each dashboard page
// in headless Chromium: the figures in the DOM equal what ClickHouse
// answers to independent SQL on the raw tables, and what the traffic was.
// Screenshots of every page are kept under artifactsDir. Without the
// token the dashboard answers with the 401 page.
func TestWebDashboardInChromium(t *testing.T) {
	chromium := findChromium(t)
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	artifacts := artifactsDir(t)
	writeKeyPair(t, dir, "worker")
	writeKeyPair(t, dir, "responder")
	webAddr := testenv.FreeAddr(t)
	dataDir := filepath.Join(dir, "talos-data")
	logPath := filepath.Join(dir, "talosd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.Command(talosd, "--data-dir", dataDir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "demo/registry", "--signing-key", filepath.Join(dir, "worker.key"),
		"--responder-keys", filepath.Join(dir, "responder.pub"), "--roles", "enforce,sink,control,web",
		"--web-addr", webAddr, "--http-addr", "", "--chains", "1", "--instance", "web-worker",
		"--capabilities", "optional", "--batch-age", "50ms", "--log-format", "json", "--log-level", "debug",
		"--checkpoint-every", "1") // every receipt is checkpointed at once: the receipt page shows its proof
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait(); logf.Close() })

	// Traffic, as an enforcement point.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nc, js := connectStreams(t, ctx, ns.URL())
	client, err := ep.NewClient(nc, js, "web-ep")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const xss = `<script>alert(1)</script>`
	type sent struct {
		agent, server, tool string
		args                any
		idem                string
		want                string // a reason code the decision must carry; "" for an allow
		post                bool   // send the post event after the allow
		method, parent      string // a server request's mcp_method and call
	}
	var postCall string
	calls, denials := 0, 0
	send := func(c sent) (*schemas.ToolCall, *schemas.Decision) {
		t.Helper()
		call, err := ep.NewCall("web-ep", c.server, c.tool, c.args)
		if err != nil {
			t.Fatal(err)
		}
		call.Actor.AgentID, call.IdempotencyKey = c.agent, c.idem
		call.MCPMethod, call.ParentToolCallID = c.method, c.parent
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second) // the first waits for the worker to start
		defer ccancel()
		started := time.Now()
		dec, err := client.Call(cctx, call)
		if err != nil {
			t.Fatalf("%s %s/%s: %v\n(talosd log: %s)", c.agent, c.server, c.tool, err, logPath)
		}
		calls++
		if c.want == "" {
			if dec.Decision != schemas.DecisionAllow {
				t.Fatalf("%s/%s: %s %v, want allow", c.server, c.tool, dec.Decision, dec.ReasonCodes)
			}
		} else {
			denials++
			if dec.Decision != schemas.DecisionDeny || !slices.Contains(dec.ReasonCodes, c.want) {
				t.Fatalf("%s/%s: %s %v, want a deny with %s", c.server, c.tool, dec.Decision, dec.ReasonCodes, c.want)
			}
		}
		if c.post {
			post, err := ep.PostOf(call, map[string]any{"content": []any{map[string]any{"type": "text", "text": "hello"}}}, true, started, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.Call(cctx, post); err != nil {
				t.Fatal(err)
			}
			postCall = call.ToolCallID
		}
		return call, dec
	}
	for _, c := range []sent{
		{agent: "agent-a", server: "files", tool: "read_file", args: map[string]any{"path": "README.md"}, post: true},
		{agent: "agent-a", server: "files", tool: "read_file", args: map[string]any{"path": "notes.txt"}},
		{agent: "agent-c", server: "files", tool: "list_directory", args: map[string]any{"path": "."}},
		{agent: "agent-b", server: "files", tool: "rm_rf", args: map[string]any{}, want: schemas.CodeToolUnclassifiedDenied},
		{agent: "agent-b", server: "files", tool: "write_file", args: map[string]any{"path": "a.txt", "content": "x"}, want: "IDEMPOTENCY_KEY_REQUIRED"},
		{agent: "agent-c", server: "files", tool: "read_file", args: map[string]any{"path": "../../etc/passwd"}, want: "DENY_PATH_TRAVERSAL"},
		{agent: xss, server: "files", tool: "list_directory", args: map[string]any{"path": ".", "recursive": true}, want: "DENY_UNKNOWN_FIELDS"},
	} {
		send(c)
	}
	// A sampling request the server made during the executed call.
	_, sampled := send(sent{agent: "agent-a", server: "files", tool: schemas.MethodSamplingCreateMessage, args: map[string]any{"messages": []any{}},
		method: schemas.MethodSamplingCreateMessage, parent: postCall})
	responder, err := receipts.LoadPrivateKey(filepath.Join(dir, "responder.key"))
	if err != nil {
		t.Fatal(err)
	}
	cc := control.NewControlClient(nc, responder, "alice")
	// The control service waits only for workers it has heard from: wait
	// for the worker's first heartbeat, as `talosctl status` shows it.
	for deadline := time.Now().Add(30 * time.Second); ; {
		rep, err := cc.Do(ctx, cc.NewCommand(schemas.VerbStatus))
		if err == nil && rep.OK && len(rep.Status) == 1 && rep.Status[0].CaughtUp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live worker in talos.ctl.status: %v %+v", err, rep)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctl := func(verb, scope, reason string) {
		t.Helper()
		cmd := cc.NewCommand(verb)
		cmd.Scope, cmd.Reason = scope, reason
		rep, prop, err := cc.DoAndWait(ctx, cmd, 20*time.Second)
		if err != nil || !rep.OK || len(prop.Missing) > 0 || len(prop.Applied) == 0 {
			t.Fatalf("%s %s: %v %+v %+v", verb, scope, err, rep, prop)
		}
	}
	ctl(schemas.VerbKillSwitchSet, "tool:files/read_file", "incident 7")
	killCall, killDec := send(sent{agent: "agent-a", server: "files", tool: "read_file", args: map[string]any{"path": "README.md"}, want: "KILL_SWITCH"})
	killReceipt := killDec.ReceiptID
	ctl(schemas.VerbKillSwitchClear, "tool:files/read_file", "resolved")

	// Wait until ClickHouse has every record: the decisions, the effect
	// receipt of the post event, the two control receipts, the
	// ToolCallEvents of the executed call and of the kill-switch denial.
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var dec, eff, ctlEv, tcs uint64
		err := conn.QueryRow(ctx, "SELECT uniqExactIf(tool_call_id, kind = 'decision'), uniqExactIf(tool_call_id, kind = 'effect'), "+
			"(SELECT uniqExact(event_id) FROM `"+db+"`.control_events WHERE verb LIKE 'killswitch.%'), (SELECT uniqExact(tool_call_id) FROM `"+db+"`.tool_calls WHERE tool_call_id IN (?, ?)) FROM `"+db+"`.receipts",
			postCall, killCall.ToolCallID).Scan(&dec, &eff, &ctlEv, &tcs)
		if err == nil && dec == uint64(calls) && eff == 1 && ctlEv == 2 && tcs == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClickHouse: %d decisions (want %d), %d effects (want 1), %d kill-switch receipts (want 2), %d of 2 tool calls (%v); log %s",
				dec, calls, eff, ctlEv, tcs, err, logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The kill-switch denial's checkpoint has reached ClickHouse.
	workerKey, err := receipts.LoadPrivateKey(filepath.Join(dir, "worker.key"))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, _, err := query.ProveReceipt(ctx, conn, db, killReceipt, verify.KeySet{workerKey.KID: workerKey.Public()})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint proof for the kill-switch receipt: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The token: created in the token file, 0600, never in the log.
	raw, err := os.ReadFile(filepath.Join(dataDir, "web.token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(raw))
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(token) {
		t.Fatalf("web.token holds %d bytes that are not 32 random bytes in hex", len(token))
	}
	if st, _ := os.Stat(filepath.Join(dataDir, "web.token")); st.Mode().Perm() != 0o600 {
		t.Errorf("web.token mode %v, want 0600", st.Mode().Perm())
	}
	base := "http://" + webAddr

	// Plain HTTP: no token is 401, the bearer token gets in, POST is 405.
	status := func(method, path, auth string) int {
		req, _ := http.NewRequestWithContext(ctx, method, base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := status("GET", "/", ""); c != 401 {
		t.Errorf("GET / without the token: %d, want 401", c)
	}
	if c := status("GET", "/", token+"0"); c != 401 {
		t.Errorf("GET / with a wrong token: %d, want 401", c)
	}
	if c := status("GET", "/", token); c != 200 {
		t.Errorf("GET / with the token: %d, want 200", c)
	}
	if c := status("POST", "/", token); c != 405 {
		t.Errorf("POST /: %d, want 405", c)
	}

	// 1. Overview, against independent SQL on the raw receipts table.
	dom := browse(t, chromium, artifacts, "overview", base+"/?since=all&token="+token)
	figs := domFigures(dom)
	var wantCalls, wantDenials, wantAgents uint64
	if err := conn.QueryRow(ctx, "SELECT uniqExact(tool_call_id), uniqExactIf(tool_call_id, decision = 'deny'), uniqExactIf(agent_id, agent_id != '') "+
		"FROM `"+db+"`.receipts WHERE kind = 'decision' AND phase = 'pre'").Scan(&wantCalls, &wantDenials, &wantAgents); err != nil {
		t.Fatal(err)
	}
	if wantCalls != uint64(calls) || wantDenials != uint64(denials) || wantAgents != 4 {
		t.Fatalf("ClickHouse holds %d calls, %d denials, %d agents; the traffic was %d, %d, 4", wantCalls, wantDenials, wantAgents, calls, denials)
	}
	sameFigures(t, "overview", "totals", map[string]string{"total-calls": figs["total-calls"], "total-denials": figs["total-denials"], "total-agents": figs["total-agents"]},
		map[string]string{"total-calls": fmt.Sprint(wantCalls), "total-denials": fmt.Sprint(wantDenials), "total-agents": fmt.Sprint(wantAgents)})
	const isDenial = " WHERE kind IN ('decision', 'effect') AND decision = 'deny'"
	denied := "FROM `" + db + "`.receipts" + isDenial
	reasons := sqlFigures(t, ctx, conn, "reason:", "SELECT code, uniqExact(tool_call_id) FROM `"+db+"`.receipts ARRAY JOIN reason_codes AS code"+isDenial+" GROUP BY code")
	if reasons["reason:KILL_SWITCH"] != "1" || reasons["reason:DENY_PATH_TRAVERSAL"] != "1" || len(reasons) < 5 {
		t.Fatalf("ClickHouse reasons %v do not match the traffic", reasons)
	}
	sameFigures(t, "overview", "reason", figuresWithPrefix(figs, "reason:"), reasons)
	agents := sqlFigures(t, ctx, conn, "agent:", "SELECT agent_id, uniqExact(tool_call_id) "+denied+" GROUP BY agent_id")
	if agents["agent:agent-b"] != "2" || agents["agent:"+xss] != "1" {
		t.Fatalf("ClickHouse denied agents %v do not match the traffic", agents)
	}
	sameFigures(t, "overview", "agent", figuresWithPrefix(figs, "agent:"), agents)
	sameFigures(t, "overview", "tool", figuresWithPrefix(figs, "tool:"),
		sqlFigures(t, ctx, conn, "tool:", "SELECT concat(server_id, '/', tool_name), uniqExact(tool_call_id) "+denied+" GROUP BY server_id, tool_name"))
	hourly := "FROM `" + db + "`.receipts WHERE kind = 'decision' AND phase = 'pre' GROUP BY h"
	sameFigures(t, "overview", "calls per hour", figuresWithPrefix(figs, "calls@"),
		sqlFigures(t, ctx, conn, "calls@", "SELECT formatDateTime(toStartOfHour(time), '%Y-%m-%dT%H:00Z') AS h, uniqExact(tool_call_id) "+hourly))
	sameFigures(t, "overview", "denials per hour", figuresWithPrefix(figs, "denials@"),
		sqlFigures(t, ctx, conn, "denials@", "SELECT formatDateTime(toStartOfHour(time), '%Y-%m-%dT%H:00Z') AS h, uniqExactIf(tool_call_id, decision = 'deny') "+hourly))
	// The hostile agent id is text, not markup.
	if strings.Contains(dom, "<script") || !strings.Contains(dom, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("overview: the agent id <script>… was not escaped")
	}

	// 2. Receipt list: the count and the newest 50, newest first.
	dom = browse(t, chromium, artifacts, "receipts", base+"/receipts?since=all&token="+token)
	figs = domFigures(dom)
	var wantReceipts uint64
	if err := conn.QueryRow(ctx, "SELECT uniqExact(receipt_id) FROM `"+db+"`.receipts").Scan(&wantReceipts); err != nil {
		t.Fatal(err)
	}
	if figs["receipts-matching"] != fmt.Sprint(wantReceipts) {
		t.Errorf("receipts: %q match, ClickHouse has %d", figs["receipts-matching"], wantReceipts)
	}
	var shown []string
	for _, m := range regexp.MustCompile(`data-receipt-id="([^"]+)"`).FindAllStringSubmatch(dom, -1) {
		shown = append(shown, m[1])
	}
	rows, err := conn.Query(ctx, "SELECT receipt_id FROM (SELECT receipt_id, max(time_ms) AS t FROM `"+db+"`.receipts GROUP BY receipt_id) ORDER BY t DESC, receipt_id DESC LIMIT 50")
	if err != nil {
		t.Fatal(err)
	}
	var newest []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		newest = append(newest, id)
	}
	rows.Close()
	if !slices.Equal(shown, newest) {
		t.Errorf("receipts listed:\n%v\nClickHouse newest first:\n%v", shown, newest)
	}
	// The sampling request names its method and links the call it was
	// made during; a tool call's receipt says tools/call.
	if m := figs["method:"+sampled.ReceiptID]; m != schemas.MethodSamplingCreateMessage || figs["method:"+killReceipt] != schemas.MethodToolsCall {
		t.Errorf("receipts: method of the sampling request %q, of the kill-switch denial %q", m, figs["method:"+killReceipt])
	}
	if link := `data-parent="` + sampled.ReceiptID + `" href="/receipts?tool_call_id=` + postCall; !strings.Contains(dom, link) {
		t.Errorf("receipts: the sampling request does not link its call (%s)", link)
	}

	// 3. The kill-switch denial's receipt page: verified, with its fields.
	dom = browse(t, chromium, artifacts, "receipt", base+"/receipts/"+killReceipt+"?token="+token)
	figs = domFigures(dom)
	var (
		wantDecision string
		wantCodes    []string
		cloudevent   string
	)
	if err := conn.QueryRow(ctx, "SELECT decision, reason_codes, cloudevent FROM `"+db+"`.receipts WHERE receipt_id = ? LIMIT 1", killReceipt).
		Scan(&wantDecision, &wantCodes, &cloudevent); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"verify": "verified", "verify:signature": "valid", "verify:columns": "agree", "verify:copies": "1",
		"verify:chain": "linked", "verify:checkpoint": "covered",
		"receipt:decision": wantDecision, "receipt:reasons": strings.Join(wantCodes, " "), "receipt:agent": "agent-a",
		"toolcall:tool_id": "files/read_file", "toolcall:decision": "deny",
	} {
		if figs[k] != want {
			t.Errorf("receipt page: %s = %q, want %q", k, figs[k], want)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/receipts/"+killReceipt+".json", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != cloudevent {
		t.Errorf("raw receipt: %d, not the stored cloudevent", resp.StatusCode)
	}

	// 4. Incident timeline: the kill switch set and clear.
	dom = browse(t, chromium, artifacts, "incidents", base+"/incidents?since=all&token="+token)
	figs = domFigures(dom)
	// Incidents are the commands that change enforcement (not reads such
	// as the status polls above).
	incidents := sqlFigures(t, ctx, conn, "verb:", "SELECT verb, uniqExact(event_id) FROM `"+db+"`.control_events "+
		"WHERE verb IN ('killswitch.set', 'killswitch.clear', 'quarantine.set', 'quarantine.clear', 'revoke', 'registry.publish', 'registry.pin', 'replay.flush') GROUP BY verb")
	if incidents["verb:killswitch.set"] != "1" || incidents["verb:killswitch.clear"] != "1" || len(incidents) != 2 {
		t.Fatalf("ClickHouse control events %v, want one kill switch set and one clear", incidents)
	}
	sameFigures(t, "incidents", "verb", figuresWithPrefix(figs, "verb:"), incidents)
	if figs["incidents"] != "2" || !strings.Contains(dom, "tool:files/read_file") || !strings.Contains(dom, "incident 7") {
		t.Errorf("incidents: %q commands shown, want 2 with the kill switch's scope and reason", figs["incidents"])
	}

	// Without the token: the 401 page, and no figures.
	dom = browse(t, chromium, artifacts, "unauthorized", base+"/")
	if !strings.Contains(dom, "Sign-in required") || strings.Contains(dom, `data-figure="total-calls"`) || strings.Contains(dom, token) {
		t.Errorf("the page without the token is not the 401 page:\n%s", dom)
	}

	logged, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(logged, []byte(token)) {
		t.Error("the talosd log contains the dashboard token")
	}
	if !bytes.Contains(logged, []byte("web role started")) {
		t.Errorf("the talosd log does not show the web role starting:\n%s", logged)
	}
	t.Logf("screenshots in %s", artifacts)
}

// TestWebTokenFile: the token file is created once (0600, 64 hex) and then
// reused; --web-token wins; an empty file is an error naming the file.
func TestWebTokenFile(t *testing.T) {
	dir := t.TempDir()
	f := &Flags{DataDir: filepath.Join(dir, "data")}
	log := newLogger(&Flags{LogLevel: "error"})
	tok, err := webToken(f, log)
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok) {
		t.Fatalf("new token: %v (%d chars)", err, len(tok))
	}
	st, err := os.Stat(filepath.Join(dir, "data", "web.token"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
	if again, err := webToken(f, log); err != nil || again != tok {
		t.Fatalf("second start: a different token (%v)", err)
	}
	f.WebToken = "from-the-environment-0123"
	if got, _ := webToken(f, log); got != f.WebToken {
		t.Fatal("--web-token does not win over the file")
	}
	empty := filepath.Join(dir, "empty.token")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := webToken(&Flags{WebTokenFile: empty}, log); err == nil || !strings.Contains(err.Error(), empty) {
		t.Fatalf("empty token file: %v", err)
	}
}

// TestWebUsageErrors: the web role's configuration mistakes exit 2 naming
// the fix, and never echo the token.
func TestWebUsageErrors(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--roles", "web"}, "--clickhouse-addr"},
		{[]string{"--roles", "web", "--clickhouse-addr", "127.0.0.1:1", "--web-token", "tooShort"}, "--web-token"},
	} {
		args := append([]string{"--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-addr", ""}, c.args...)
		out, err := testenv.Command(bin, args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("talosd %v: %v, want exit 2 naming %s\n%s", c.args, err, c.want, out)
		}
		if strings.Contains(string(out), "tooShort") {
			t.Errorf("talosd %v echoes the token:\n%s", c.args, out)
		}
	}
}
