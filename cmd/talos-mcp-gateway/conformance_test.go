package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/conformance"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// refusalCall is the tool_call_id an AUTH row's evidence names.
var refusalCall = regexp.MustCompile(`refusal reported as call (\S+)\)`)

// TestConformanceGatewayProbes: talosctl conformance --gateway-url probes
// the real gateway binary in HTTPS + JWT mode in front of the real
// pipeline: AUTH-01 (no token) and AUTH-02 (a bad token) are pass with
// HTTP 401, JSON-RPC -32001 and DENY_UNAUTHENTICATED, each naming the
// refusal's call, whose signed deny receipt is in ClickHouse; TLS-01
// (plain HTTP to the TLS port) is pass with the TLS listener's HTTP 400.
// With alice's JWT and capability, DISC-01 and DISC-02 are pass: her
// tools/list is exactly what the registry and her capability permit of the
// filesystem server, and her call to a hidden tool is refused by the
// gateway with a receipt. Against a capability wider, or narrower, than
// hers the same probe fails DISC-02, or DISC-01.
func TestConformanceGatewayProbes(t *testing.T) {
	s := startStack(t)
	d := s.dir
	idp := filepath.Join(d, "idp")
	if err := os.MkdirAll(idp, 0o700); err != nil {
		t.Fatal(err)
	}
	is := testenv.NewIssuer(t, idp)
	capability := func(name string, args ...string) string {
		out := filepath.Join(d, name+".cap.json")
		s.ctl(append([]string{"cap", "issue", "--issuer-key", filepath.Join(d, "issuer.key"), "--subject", "alice",
			"--subject-key", filepath.Join(d, "alice.pub"), "--out", out}, args...)...)
		return out
	}
	// alice may read two filesystem tools; write_file is in her scopes, but
	// her capability is read-only.
	aliceCap := capability("alice", "--scope", "tool:fs:read_text_file", "--scope", "tool:fs:list_directory", "--scope", "tool:fs:write_file", "--read-only")
	b, _ := json.Marshal(map[string]any{"principals": []map[string]string{{"name": "alice", "jwt_subject": "alice@clients",
		"capability": aliceCap, "agent_key": filepath.Join(d, "alice.key")}}})
	if err := os.WriteFile(filepath.Join(d, "principals.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	token := is.Mint(t, "RS256", is.Claims("alice@clients", audience, time.Hour))
	tokenFile := filepath.Join(d, "alice.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	port := testenv.FreePort(t)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	s.httpsGateway(t, is.TLS.Client(), base, []string{"SSL_CERT_FILE=" + is.TLS.CAFile},
		"--ep-id", "gw-conformance", "--upstream", "fs="+testenv.MCPBin(t, "mcp-server-filesystem")+" "+root, "--workspace", "fs="+root,
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--principals", filepath.Join(d, "principals.json"),
		"--tls-cert", is.TLS.CertFile, "--tls-key", is.TLS.KeyFile,
		"--jwt-issuer", is.Name, "--jwt-audience", audience, "--jwks-url", is.JWKSURL)

	// The other rows run against talosd too; only the gateway's matter here.
	cmd := testenv.Command(s.talosctl, "--nats-url", s.natsURL(), "--nats-auth", "none", "--clickhouse-addr", s.chAddr,
		"--clickhouse-database", s.db, "--json", "conformance", "--gateway-url", base+"/mcp", "--gateway-ca", is.TLS.CAFile,
		"--gateway-token-file", tokenFile, "--gateway-capability", aliceCap, "--gateway-server", "fs", "--registry", registryDir,
		"--timeout", "3s", "--event-wait", "1s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep conformance.Report
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("talosctl conformance --json: %v, %v\n%s\n%s", err, jerr, stdout.Bytes(), stderr.Bytes())
	}
	rows := map[string]conformance.Result{}
	for _, r := range rep.Results {
		rows[r.ID] = r
	}
	want := map[string][]string{
		"AUTH-01": {"no token: HTTP 401, JSON-RPC -32001", schemas.CodeDenyUnauthenticated},
		"AUTH-02": {"an invalid bearer token: HTTP 401, JSON-RPC -32001", schemas.CodeDenyUnauthenticated},
		"TLS-01":  {"plain HTTP to 127.0.0.1:" + strconv.Itoa(port), "HTTP 400 from the TLS listener"},
		"DISC-01": {"the 2 tools listed are all permitted by the registry", "and the capability of alice",
			"tools/call of the hidden fs/", "refused by the gateway, JSON-RPC -32030", schemas.CodeToolHidden},
		"DISC-02": {"all 2 tools of server(s) fs permitted by the registry", "are listed"},
	}
	if bytes.Contains(stdout.Bytes(), []byte(token)) || bytes.Contains(stderr.Bytes(), []byte(token)) {
		t.Error("talosctl conformance printed the principal's token")
	}
	var calls []string
	var hidden [2]string // DISC-01's refused call and its receipt
	for id, parts := range want {
		r := rows[id]
		t.Logf("%s %s: %s (%s)", id, r.Status, r.Reason, r.Test)
		if r.Status != conformance.Pass || r.Test == "" {
			t.Errorf("%s: %+v, want pass", id, r)
		}
		for _, p := range parts {
			if !strings.Contains(r.Reason, p) {
				t.Errorf("%s: evidence %q lacks %q", id, r.Reason, p)
			}
		}
		if id == "DISC-01" {
			m := discCall.FindStringSubmatch(r.Reason)
			if m == nil || len(r.ReceiptIDs) != 1 {
				t.Errorf("DISC-01: evidence %q names no refused call, or receipts %v", r.Reason, r.ReceiptIDs)
				continue
			}
			hidden = [2]string{m[1], r.ReceiptIDs[0]}
		}
		if strings.HasPrefix(id, "AUTH") {
			m := refusalCall.FindStringSubmatch(r.Reason)
			if m == nil {
				t.Errorf("%s: evidence %q names no refusal call", id, r.Reason)
				continue
			}
			calls = append(calls, m[1])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	waitRefusalReceipts(t, s, calls)
	waitReceipts(t, s, "deny receipt "+hidden[1]+" for the hidden tool's call "+hidden[0],
		`SELECT count() FROM receipts WHERE tool_call_id = ? AND receipt_id = ? AND kind = 'decision' AND decision = 'deny'`, hidden[0], hidden[1])

	// The same probe against what alice does not hold must fail.
	for _, c := range []struct {
		name, fails, passes, want string
		args                      []string
	}{
		{"wider", "DISC-02", "DISC-01", "but not listed: fs/read_file", []string{"--scope", "tool:fs:*"}},
		{"narrower", "DISC-01", "DISC-02", "listed, but not permitted by the registry", []string{"--scope", "tool:fs:read_text_file"}},
	} {
		cfg := conformance.Config{Registry: registryDir, Timeout: 3 * time.Second}
		_, err := conformance.Files{ReadTool: "files/read_file", WriteTool: "files/write_file", GatewayURL: base + "/mcp", GatewayCA: is.TLS.CAFile,
			GatewayToken: tokenFile, GatewayCapability: capability(c.name, c.args...), GatewayServers: []string{"fs"}}.Load(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		rows := conformance.Discovery(context.Background(), cfg)
		if len(rows) != 2 || rows[0].ID != "DISC-01" || rows[1].ID != "DISC-02" {
			t.Fatalf("%s capability: rows %+v", c.name, rows)
		}
		for _, r := range rows {
			t.Logf("%s capability: %s %s: %s", c.name, r.ID, r.Status, r.Reason)
			switch {
			case r.ID == c.fails && (r.Status != conformance.Fail || !strings.Contains(r.Reason, c.want)):
				t.Errorf("%s capability: %s %s %q, want fail with %q", c.name, r.ID, r.Status, r.Reason, c.want)
			case r.ID == c.passes && r.Status != conformance.Pass:
				t.Errorf("%s capability: %s %s, want pass", c.name, r.ID, r.Status)
			}
		}
	}
}

// discCall is the refused call DISC-01's evidence names.
var discCall = regexp.MustCompile(`refused by the gateway, JSON-RPC -32030 \[[^\]]*\] \(call (\S+)\)`)

// waitRefusalReceipts waits for a signed deny receipt with
// DENY_UNAUTHENTICATED alone for each of the refused calls.
func waitRefusalReceipts(t *testing.T, s *stack, calls []string) {
	t.Helper()
	for _, id := range calls {
		waitReceipts(t, s, "refusal receipt for "+id, `SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'decision' AND decision = 'deny'
			AND server_id = ? AND reason_codes = ['DENY_UNAUTHENTICATED']`, id, schemas.ServerUnauthenticated)
	}
}

// waitReceipts waits until the count query q finds a receipt.
func waitReceipts(t *testing.T, s *stack, what, q string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for {
		var n uint64
		err := conn.QueryRow(ctx, q, args...).Scan(&n)
		if err == nil && n > 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no %s: %v", what, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
