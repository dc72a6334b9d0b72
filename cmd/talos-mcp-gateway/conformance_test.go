package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
func TestConformanceGatewayProbes(t *testing.T) {
	s := startStack(t)
	d := s.dir
	idp := filepath.Join(d, "idp")
	if err := os.MkdirAll(idp, 0o700); err != nil {
		t.Fatal(err)
	}
	is := testenv.NewIssuer(t, idp)
	b, _ := json.Marshal(map[string]any{"principals": []map[string]string{{"name": "alice", "jwt_subject": "alice@clients"}}})
	if err := os.WriteFile(filepath.Join(d, "principals.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	port := freePort(t)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	s.httpsGateway(t, is.TLS.Client(), base, []string{"SSL_CERT_FILE=" + is.TLS.CAFile},
		"--ep-id", "gw-conformance", "--upstream", "fs="+testenv.MCPBin(t, "mcp-server-filesystem")+" "+root, "--workspace", "fs="+root,
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--principals", filepath.Join(d, "principals.json"),
		"--tls-cert", is.TLS.CertFile, "--tls-key", is.TLS.KeyFile,
		"--jwt-issuer", is.Name, "--jwt-audience", audience, "--jwks-url", is.JWKSURL)

	// The other rows run against talosd too; only the gateway's matter here.
	cmd := exec.Command(s.talosctl, "--nats-url", s.natsURL(), "--nats-auth", "none", "--clickhouse-addr", s.chAddr,
		"--clickhouse-database", s.db, "--json", "conformance", "--gateway-url", base+"/mcp", "--gateway-ca", is.TLS.CAFile,
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
	}
	var calls []string
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
}

// waitRefusalReceipts waits for a signed deny receipt with
// DENY_UNAUTHENTICATED alone for each of the refused calls.
func waitRefusalReceipts(t *testing.T, s *stack, calls []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, id := range calls {
		for {
			var n uint64
			err := conn.QueryRow(ctx, `SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'decision' AND decision = 'deny'
				AND server_id = ? AND reason_codes = ['DENY_UNAUTHENTICATED']`, id, schemas.ServerUnauthenticated).Scan(&n)
			if err == nil && n > 0 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("no refusal receipt for %s: %v", id, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
}
