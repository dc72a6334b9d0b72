package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

const audience = "talos-mcp-gateway"

// rpcRefusal is a refused request's answer.
type rpcRefusal struct {
	status    int
	challenge string
	id        string
	code      int
	data      gateway.Unauthenticated
}

// post sends one JSON-RPC request to /mcp with an Authorization header
// (none if auth is "") and reads the refusal it expects.
func post(t *testing.T, c *http.Client, url, auth, body string) rpcRefusal {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Code int                     `json:"code"`
			Data gateway.Unauthenticated `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("HTTP %d, body %q: %v", resp.StatusCode, b, err)
	}
	return rpcRefusal{status: resp.StatusCode, challenge: resp.Header.Get("WWW-Authenticate"), id: string(m.ID), code: m.Error.Code, data: m.Error.Data}
}

// mustRefuse checks AUTH-01/AUTH-02's answer: HTTP 401 with a bearer
// challenge, JSON-RPC -32001 naming the request id, DENY_UNAUTHENTICATED,
// the reason, and (reported) the tool_call_id of its receipt.
func (r rpcRefusal) mustRefuse(t *testing.T, what, id, reason string, reported bool) string {
	t.Helper()
	if r.status != http.StatusUnauthorized || !strings.HasPrefix(r.challenge, "Bearer ") || r.code != gateway.CodeUnauthenticated ||
		r.id != id || r.data.Reason != reason || !slices.Equal(r.data.ReasonCodes, []string{schemas.CodeDenyUnauthenticated}) ||
		(reported && r.data.ToolCallID == "") {
		t.Fatalf("%s: %+v, want 401, -32001, id %s, reason %s", what, r, id, reason)
	}
	return r.data.ToolCallID
}

// httpsGateway runs the gateway binary in HTTP mode with args and waits
// until its /healthz answers over client.
func (s *stack) httpsGateway(t *testing.T, client *http.Client, base string, env []string, args ...string) {
	t.Helper()
	cmd := testenv.Command(s.gateway, append([]string{"--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", registryDir,
		"--log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	s.serveGateway(t, cmd, client, base)
}

// TestHTTPAuthTLSJWT: the gateway's HTTP mode over TLS with JWTs from a
// test issuer whose JWKS it fetches over HTTPS, in front of the real
// filesystem MCP server and the real pipeline (CSP MUST 2):
//   - TLS-01: plain HTTP to the TLS port gets no MCP service; a client
//     that does not trust the certificate, or offers only TLS 1.1, cannot
//     connect; a client with the test CA can;
//   - AUTH-01: no token is JSON-RPC -32001 over HTTP 401;
//   - AUTH-02: a token with a bad signature, the wrong audience or issuer,
//     or expired, is -32001 too;
//   - every such refusal has a signed deny receipt with
//     DENY_UNAUTHENTICATED in ClickHouse, also one refused while NATS was
//     down (refused at once, reported once NATS is back), and neither the
//     token nor the request reaches the audit trail;
//   - a flood of bad tokens is refused in full, but only the refusal
//     limits' worth is reported; the rest is counted in /metrics;
//   - a valid JWT selects its principal by sub (or by the talos_principal
//     claim), lists tools and calls one, allowed, with a receipt; a static
//     token keeps working beside JWTs, and so does a JWT without a kid
//     (one key of its algorithm in the JWKS);
//   - a renewed certificate written over the files is served to new
//     connections without a restart.
func TestHTTPAuthTLSJWT(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := s.dir
	idp := filepath.Join(d, "idp")
	if err := os.MkdirAll(idp, 0o700); err != nil {
		t.Fatal(err)
	}
	is := testenv.NewIssuer(t, idp)
	s.ctl("cap", "issue", "--issuer-key", filepath.Join(d, "issuer.key"), "--subject", "alice", "--subject-key", filepath.Join(d, "alice.pub"),
		"--scope", "tool:fs:*", "--out", filepath.Join(d, "alice.cap.json"))
	b, _ := json.Marshal(map[string]any{"principals": []map[string]string{
		{"name": "alice", "jwt_subject": "alice@clients", "capability": "alice.cap.json", "agent_key": "alice.key"},
		{"name": "ops", "jwt_principal": "ops-team"},
		{"name": "legacy", "token_sha256": sha("legacy-token")},
	}})
	if err := os.WriteFile(filepath.Join(d, "principals.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("hello over TLS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	client := is.TLS.Client()
	s.httpsGateway(t, client, base, []string{"SSL_CERT_FILE=" + is.TLS.CAFile},
		"--ep-id", "gw-auth", "--upstream", "fs="+testenv.MCPBin(t, "mcp-server-filesystem")+" "+root, "--workspace", "fs="+root,
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--principals", filepath.Join(d, "principals.json"),
		"--tls-cert", is.TLS.CertFile, "--tls-key", is.TLS.KeyFile,
		"--jwt-issuer", is.Name, "--jwt-audience", audience, "--jwks-url", is.JWKSURL, "--auth-refusal-burst", "20")
	good := is.Mint(t, "RS256", is.Claims("alice@clients", audience, time.Hour))

	// TLS-01.
	plain := strings.Replace(base, "https://", "http://", 1)
	req, _ := http.NewRequest(http.MethodPost, plain+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer "+good)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || bytes.Contains(body, []byte("jsonrpc")) {
			t.Fatalf("plain HTTP to the TLS port: HTTP %d %q", resp.StatusCode, body)
		}
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("a client without the test CA connected: the certificate was not validated")
	}
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: is.TLS.Pool, MaxVersion: tls.VersionTLS11}}}
	if _, err := old.Get(base + "/healthz"); err == nil {
		t.Fatal("a TLS 1.1 client connected")
	}

	// AUTH-01 and AUTH-02.
	initialize := `{"jsonrpc":"2.0","id":%s,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	var refused []string
	refused = append(refused, post(t, client, base+"/mcp", "", fmt.Sprintf(initialize, "1")).mustRefuse(t, "AUTH-01 no token", "1", "missing_token", true))
	refused = append(refused, post(t, client, base+"/mcp", "", "garbage").mustRefuse(t, "AUTH-01 unreadable body", "null", "missing_token", true))
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	forged := testenv.MintJWT(t, otherKey, "ES256", "ES256", is.Claims("alice@clients", audience, time.Hour))
	claims := is.Claims("alice@clients", audience, time.Hour)
	claims["exp"] = time.Now().Add(-10 * time.Minute).Unix()
	expired := is.Mint(t, "ES256", claims)
	foreign := is.Claims("alice@clients", audience, time.Hour)
	foreign["iss"] = "https://other-issuer.test"
	for _, tc := range []struct{ what, token, reason string }{
		{"AUTH-02 bad signature", forged, "invalid_signature"},
		{"AUTH-02 wrong audience", is.Mint(t, "EdDSA", is.Claims("alice@clients", "another-service", time.Hour)), "wrong_audience"},
		{"AUTH-02 expired", expired, "expired"},
		{"AUTH-02 another issuer", is.Mint(t, "RS256", foreign), "wrong_issuer"},
		{"AUTH-02 unknown principal", is.Mint(t, "RS256", is.Claims("mallory@clients", audience, time.Hour)), "unknown_principal"},
	} {
		refused = append(refused, post(t, client, base+"/mcp", "Bearer "+tc.token, fmt.Sprintf(initialize, `"r-2"`)).mustRefuse(t, tc.what, `"r-2"`, tc.reason, true))
	}

	// A valid JWT: alice (by sub) lists tools and calls one over TLS.
	connect := func(token string) *gatewaySession {
		c := mcp.NewClient(&mcp.Implementation{Name: "talos-auth-test", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp",
			HTTPClient: &http.Client{Transport: bearer{token: token, next: client.Transport}}}, nil)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return &gatewaySession{cs: cs}
	}
	alice := connect(good)
	tools, err := alice.cs.ListTools(ctx, nil)
	if err != nil || !slices.ContainsFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "read_text_file" }) {
		t.Fatalf("alice's tools/list: %v %v", err, tools)
	}
	res := alice.call(ctx, "read_text_file", map[string]any{"path": filepath.Join(root, "notes.txt")}).mustAllow(t, "alice reads over TLS")
	if !strings.Contains(text(res), "hello over TLS") {
		t.Fatalf("read_text_file: %q", text(res))
	}
	allowedID := res.Meta[gateway.MetaToolCallID].(string)
	for name, token := range map[string]string{
		"ops, by the talos_principal claim": is.Mint(t, "ES256", func() map[string]any {
			c := is.Claims("someone@clients", audience, time.Hour)
			c[gateway.PrincipalClaim] = "ops-team"
			return c
		}()),
		"legacy, by its static token":   "legacy-token",
		"alice, by a JWT without a kid": testenv.MintJWT(t, is.Keys["RS256"], "RS256", "", is.Claims("alice@clients", audience, time.Hour)),
	} {
		if _, err := connect(token).cs.ListTools(ctx, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}

	// NATS down: refused at once all the same (fail closed), reported later.
	s.stopNATS()
	started := time.Now()
	refused = append(refused, post(t, client, base+"/mcp", "", fmt.Sprintf(initialize, "3")).mustRefuse(t, "no token, NATS down", "3", "missing_token", true))
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("the refusal waited %s for NATS", took)
	}
	s.startNATS()

	// A flood of bad tokens from one source: all refused, few reported.
	reported := 0
	for i := range 60 {
		r := post(t, client, base+"/mcp", fmt.Sprintf("Bearer flood-%d", i), fmt.Sprintf(initialize, strconv.Itoa(100+i)))
		if id := r.mustRefuse(t, "flood", strconv.Itoa(100+i), "malformed_token", false); id != "" {
			refused = append(refused, id)
			reported++
		}
	}
	if reported >= 30 {
		t.Fatalf("%d of 60 flood refusals reported: the limits did not hold", reported)
	}
	checkRefusalMetric(t, client, base, 60-reported)
	checkStageMetric(t, client, base)
	checkCertRenewal(t, is.TLS, base)

	checkRefusalReceipts(t, ctx, s, refused, allowedID, []string{forged, expired})
	if out, code := s.ctlCode("verify", "--trusted-keys", filepath.Join(s.dir, "worker.pub")); code != 0 {
		t.Fatalf("talosctl verify: exit %d\n%s", code, out)
	}
}

// checkCertRenewal: a renewed certificate written over the gateway's
// --tls-cert/--tls-key is served to new connections without a restart.
func checkCertRenewal(t *testing.T, old *testenv.TLSFiles, base string) {
	t.Helper()
	renewed := testenv.NewTLSFiles(t, t.TempDir())
	for from, to := range map[string]string{renewed.CertFile: old.CertFile, renewed.KeyFile: old.KeyFile} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	written := time.Now()
	for {
		resp, err := renewed.Client().Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Since(written) > 30*time.Second {
			t.Fatalf("the renewed certificate is not served: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the renewed certificate was served %s after it was written", time.Since(written).Round(time.Millisecond))
	if _, err := old.Client().Get(base + "/healthz"); err == nil {
		t.Fatal("a new connection still got the old certificate")
	}
}

// readMetrics is the body of the gateway's /metrics at base.
func readMetrics(t *testing.T, client *http.Client, base string) []byte {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var unreportedMetric = regexp.MustCompile(`talos_gateway_auth_refusals_total\{reason="malformed_token",receipted="false"\} (\d+)`)

// checkRefusalMetric: /metrics counts the unreported refusals.
func checkRefusalMetric(t *testing.T, client *http.Client, base string, want int) {
	t.Helper()
	b := readMetrics(t, client, base)
	m := unreportedMetric.FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics has no unreported refusals:\n%s", b)
	}
	if n, _ := strconv.Atoi(string(m[1])); n != want {
		t.Fatalf("/metrics counts %d unreported refusals, want %d", n, want)
	}
}

var stageMetric = regexp.MustCompile(`talos_gateway_stage_seconds_(sum|count)\{stage="(\w+)"\} (\S+)`)

// checkStageMetric: /metrics times the decided requests' stages. Each one
// forwarded (here every one decided: alice's call, and whatever its server
// asked of the client) has a decision, an upstream call and a post event,
// each of some time.
func checkStageMetric(t *testing.T, client *http.Client, base string) {
	t.Helper()
	b := readMetrics(t, client, base)
	count, sum := map[string]float64{}, map[string]float64{}
	for _, m := range stageMetric.FindAllSubmatch(b, -1) {
		v, err := strconv.ParseFloat(string(m[3]), 64)
		if err != nil {
			t.Fatalf("/metrics: %s", m[0])
		}
		if string(m[1]) == "count" {
			count[string(m[2])] = v
		} else {
			sum[string(m[2])] = v
		}
	}
	n := count[gateway.StageDecision]
	for _, stage := range []string{gateway.StageDecision, gateway.StageUpstream, gateway.StagePost} {
		if count[stage] < 1 || count[stage] != n || sum[stage] <= 0 {
			t.Fatalf("/metrics times stage %s %v times in %v s, want as many as decisions (%v), at least one, in some time:\n%s", stage, count[stage], sum[stage], n, b)
		}
	}
}

// checkRefusalReceipts: every reported refusal has a deny decision receipt
// with DENY_UNAUTHENTICATED alone and a ToolCallEvent, no other refusal
// was recorded, the allowed call has its receipts, and no token reached
// ClickHouse.
func checkRefusalReceipts(t *testing.T, ctx context.Context, s *stack, refused []string, allowedID string, tokens []string) {
	t.Helper()
	conn := s.clickhouse(t, ctx)
	defer conn.Close()
	count := rowCounter(ctx, t, conn)
	for _, id := range refused {
		testenv.WaitUntil(t, 90*time.Second, 300*time.Millisecond, "the refusal receipt of "+id, func() bool {
			return count(`SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'decision' AND decision = 'deny'
				AND server_id = ? AND reason_codes = ['DENY_UNAUTHENTICATED']`, id, schemas.ServerUnauthenticated) > 0 &&
				count("SELECT count() FROM tool_calls WHERE tool_call_id = ?", id) > 0
		})
	}
	if n := count("SELECT uniqExact(tool_call_id) FROM receipts WHERE server_id = ?", schemas.ServerUnauthenticated); n != uint64(len(refused)) {
		t.Fatalf("%d refusals recorded, %d reported", n, len(refused))
	}
	testenv.WaitUntil(t, 90*time.Second, 300*time.Millisecond, "the allowed call's receipts", func() bool {
		return count("SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'decision' AND decision = 'allow'", allowedID) > 0 &&
			count("SELECT count() FROM receipts WHERE tool_call_id = ? AND kind = 'effect'", allowedID) > 0
	})
	for _, tok := range tokens {
		sig := tok[strings.LastIndexByte(tok, '.')+1:]
		for _, table := range []string{"receipts", "tool_calls", "artifacts"} {
			q := fmt.Sprintf("SELECT count() FROM %s WHERE positionCaseInsensitive(toString(tuple(*)), ?) > 0", table)
			if n := count(q, sig[:24]); n != 0 {
				t.Fatalf("a refused token reached %s (%d rows)", table, n)
			}
		}
	}
}

// TestHTTPModeRefusesPlainHTTP: the gateway will not start serving
// bearer tokens in the clear off loopback, nor on loopback without being
// told, nor with an algorithm that could take a public key for a secret.
func TestHTTPModeRefusesPlainHTTP(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talos-mcp-gateway")
	dir := t.TempDir()
	tlsFiles := testenv.NewTLSFiles(t, dir)
	pf := filepath.Join(dir, "principals.json")
	if err := os.WriteFile(pf, []byte(`{"principals":[{"name":"a","token_sha256":"`+sha("t")+`"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--ep-id", "gw-x", "--registry", registryDir, "--upstream", "x=/bin/false", "--principals", pf, "--nats-auth", "none"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"all interfaces, no TLS", []string{"--listen", "0.0.0.0:0"}, "--tls-cert"},
		{"all interfaces, plain HTTP asked for", []string{"--listen", "0.0.0.0:0", "--insecure-plain-http"}, "loopback"},
		{"a routable address, plain HTTP asked for", []string{"--listen", "192.0.2.1:0", "--insecure-plain-http"}, "loopback"},
		{"loopback without the flag", []string{"--listen", "127.0.0.1:0"}, "--insecure-plain-http"},
		{"HS256 allowed", []string{"--listen", "0.0.0.0:0", "--tls-cert", tlsFiles.CertFile, "--tls-key", tlsFiles.KeyFile,
			"--jwt-issuer", "i", "--jwt-audience", "a", "--jwks-file", pf, "--jwt-algorithms", "HS256"}, "not allowed"},
		{"JWKS over plain HTTP", []string{"--listen", "0.0.0.0:0", "--tls-cert", tlsFiles.CertFile, "--tls-key", tlsFiles.KeyFile,
			"--jwt-issuer", "i", "--jwt-audience", "a", "--jwks-url", "http://issuer.test/jwks"}, "https"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := testenv.Command(bin, append(slices.Clone(base), tc.args...)...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
				t.Fatalf("%v, want exit 2 naming %q:\n%s", err, tc.want, out)
			}
		})
	}
}
