package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// recorder is a streamable-HTTP MCP server offering everything's echo
// tool that records the Authorization header of every tools/call it runs.
type recorder struct {
	mu    sync.Mutex
	auths []string
	url   string
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "recorder", Version: "1"}, nil)
	type echoIn struct {
		Message string `json:"message"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "Echoes the message."},
		func(_ context.Context, req *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			r.mu.Lock()
			r.auths = append(r.auths, req.Extra.Header.Get("Authorization"))
			r.mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "Echo: " + in.Message}}}, nil, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	r.url = hs.URL + "/mcp"
	return r
}

func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.auths)
}

// tokenEndpoint is an RFC 8693 token endpoint that records each exchange's
// form and answers with a fresh token for the requested audience, or 503
// while failing.
type tokenEndpoint struct {
	mu      sync.Mutex
	forms   []map[string]string
	failing atomic.Bool
	url     string
}

func newTokenEndpoint(t *testing.T) *tokenEndpoint {
	e := &tokenEndpoint{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		f := map[string]string{}
		for k := range r.PostForm {
			f[k] = r.PostForm.Get(k)
		}
		e.mu.Lock()
		e.forms = append(e.forms, f)
		n := len(e.forms)
		e.mu.Unlock()
		if e.failing.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if f["grant_type"] != "urn:ietf:params:oauth:grant-type:token-exchange" || f["client_id"] != "talos-gw" || f["client_secret"] != "gw-client-secret" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("exchanged-%d-aud-%s", n, f["audience"]),
			"token_type": "Bearer", "issued_token_type": "urn:ietf:params:oauth:token-type:access_token", "expires_in": 600})
	}))
	t.Cleanup(hs.Close)
	e.url = hs.URL + "/token"
	return e
}

func (e *tokenEndpoint) exchanges() []map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.forms)
}

// TestCredentialBoundary runs the gateway binary in HTTP mode (TLS, JWTs
// from a test issuer) in front of a streamable-HTTP MCP upstream, with the
// real pipeline and ClickHouse (CSP MUST 5):
//   - CRED-01: with token_exchange, the token endpoint gets an RFC 8693
//     exchange of alice's JWT for the upstream's audience and resource with
//     the gateway's client credentials, and the upstream gets the
//     exchanged token; a second call reuses it;
//   - CRED-02: the upstream never gets the client's token; a gateway whose
//     secret for that upstream equals alice's token denies her call
//     DENY_TOKEN_PASSTHROUGH with a receipt and does not forward it;
//   - with the token endpoint down, a call is denied
//     DENY_CREDENTIAL_UNAVAILABLE with a receipt (fail closed);
//   - CRED-03: the decision receipts in ClickHouse carry token_handling,
//     passthrough_detected false for the exchanged call and true for the
//     refused one, and no token reached ClickHouse.
func TestCredentialBoundary(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	idp := filepath.Join(s.dir, "idp")
	if err := os.MkdirAll(idp, 0o700); err != nil {
		t.Fatal(err)
	}
	is := testenv.NewIssuer(t, idp)
	up, sts := newRecorder(t), newTokenEndpoint(t)
	writeJSON(t, filepath.Join(s.dir, "principals.json"), map[string]any{"principals": []map[string]string{
		{"name": "alice", "jwt_subject": "alice@clients"}, {"name": "ops", "jwt_subject": "ops@clients"}}})
	writeJSON(t, filepath.Join(s.dir, "exchange.json"), map[string]any{"servers": map[string]any{
		"everything": map[string]any{"mode": "token_exchange", "token_endpoint": sts.url, "client_id": "talos-gw",
			"client_secret_env": "GW_STS_SECRET", "audience": "everything-api", "scope": []string{"echo"}}}})
	writeJSON(t, filepath.Join(s.dir, "passthrough.json"), map[string]any{"servers": map[string]any{
		"everything": map[string]any{"mode": "secret", "secret_env": "EVERYTHING_TOKEN"}}})
	alice := is.Mint(t, "RS256", is.Claims("alice@clients", audience, time.Hour))
	ops := is.Mint(t, "ES256", is.Claims("ops@clients", audience, time.Hour))

	client := is.TLS.Client()
	gw := func(ep, creds string, env ...string) func(token string) *gatewaySession {
		port := freePort(t)
		base := fmt.Sprintf("https://127.0.0.1:%d", port)
		s.httpsGateway(t, client, base, append([]string{"SSL_CERT_FILE=" + is.TLS.CAFile}, env...),
			"--ep-id", ep, "--upstream", "everything="+up.url, "--credentials", filepath.Join(s.dir, creds),
			"--listen", "127.0.0.1:"+strconv.Itoa(port), "--principals", filepath.Join(s.dir, "principals.json"),
			"--tls-cert", is.TLS.CertFile, "--tls-key", is.TLS.KeyFile,
			"--jwt-issuer", is.Name, "--jwt-audience", audience, "--jwks-url", is.JWKSURL)
		return func(token string) *gatewaySession {
			c := mcp.NewClient(&mcp.Implementation{Name: "talos-cred-test", Version: "1"}, nil)
			cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp",
				HTTPClient: &http.Client{Transport: bearer{token: token, next: client.Transport}}}, nil)
			if err != nil {
				t.Fatalf("connect to %s: %v", ep, err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			return &gatewaySession{cs: cs}
		}
	}

	// CRED-01: exchanged for the upstream's audience, twice from the cache.
	exchange := gw("gw-cred-x", "exchange.json", "GW_STS_SECRET=gw-client-secret")
	aliceX := exchange(alice)
	var allowed []string
	for i := range 2 {
		res := aliceX.call(ctx, "echo", map[string]any{"message": "hi " + strconv.Itoa(i)}).mustAllow(t, "CRED-01 alice's echo")
		if !strings.Contains(text(res), "Echo: hi") {
			t.Fatalf("echo: %q", text(res))
		}
		allowed = append(allowed, res.Meta[gateway.MetaToolCallID].(string))
	}
	ex := sts.exchanges()
	if len(ex) != 1 {
		t.Fatalf("%d exchanges for two calls of one principal, want 1 (cached)", len(ex))
	}
	for k, v := range map[string]string{"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "audience": "everything-api",
		"resource": up.url, "scope": "echo", "subject_token": alice, "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
		"client_id": "talos-gw"} {
		if ex[0][k] != v {
			t.Fatalf("CRED-01: the exchange's %s is %q, want %q", k, ex[0][k], v)
		}
	}
	if got := up.calls(); !slices.Equal(got, []string{"Bearer exchanged-1-aud-everything-api", "Bearer exchanged-1-aud-everything-api"}) {
		t.Fatalf("CRED-01: the upstream got %q, want the exchanged token", got)
	}

	// The token endpoint down: ops (nothing cached) is denied, fail closed.
	sts.failing.Store(true)
	down := exchange(ops).call(ctx, "echo", map[string]any{"message": "x"}).mustDeny(t, "token endpoint down", schemas.CodeDenyCredentialUnavailable)
	sts.failing.Store(false)

	// CRED-02: a secret equal to alice's token is refused, not forwarded.
	pass := gw("gw-cred-p", "passthrough.json", "EVERYTHING_TOKEN="+alice)(alice)
	refused := pass.call(ctx, "echo", map[string]any{"message": "leak?"}).mustDeny(t, "CRED-02 passthrough", schemas.CodeDenyTokenPassthrough)
	if refused.ReceiptID == "" {
		t.Fatalf("CRED-02: the denial names no receipt: %+v", refused)
	}
	for _, a := range up.calls() {
		if strings.Contains(a, alice) || strings.Contains(a, ops) {
			t.Fatalf("CRED-02: a client's token reached the upstream in a call (%d calls)", len(up.calls()))
		}
	}
	if n := len(up.calls()); n != 2 {
		t.Fatalf("the upstream ran %d calls, want the 2 allowed", n)
	}

	// CRED-03: the receipts say how each call's credential was handled.
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := map[string]schemas.TokenHandling{
		allowed[0]:         {Mode: schemas.TokenModeTokenExchange, Audience: "everything-api"},
		allowed[1]:         {Mode: schemas.TokenModeTokenExchange, Audience: "everything-api"},
		down.ToolCallID:    {Mode: schemas.TokenModeTokenExchange, Audience: "everything-api", Error: schemas.TokenErrEndpointUnreachable},
		refused.ToolCallID: {Mode: schemas.TokenModeSecret, Audience: "everything", PassthroughDetected: true},
	}
	for id, th := range want {
		r := decisionReceipt(t, ctx, conn, id)
		if r.TokenHandling == nil || *r.TokenHandling != th {
			t.Fatalf("CRED-03: %s's receipt has token_handling %+v, want %+v", id, r.TokenHandling, th)
		}
		wantDeny := th.PassthroughDetected || th.Error != ""
		if (r.Decision == schemas.DecisionDeny) != wantDeny {
			t.Fatalf("%s: decision %s %v", id, r.Decision, r.ReasonCodes)
		}
	}
	for _, tok := range []string{alice, ops, "exchanged-1-aud"} {
		sig := tok[strings.LastIndexByte(tok, '.')+1:]
		for _, table := range []string{"receipts", "tool_calls", "artifacts"} {
			var n uint64
			q := fmt.Sprintf("SELECT count() FROM %s WHERE positionCaseInsensitive(toString(tuple(*)), ?) > 0", table)
			if err := conn.QueryRow(ctx, q, sig[:min(len(sig), 24)]).Scan(&n); err != nil || n != 0 {
				t.Fatalf("a token reached %s (%d rows, %v)", table, n, err)
			}
		}
	}
}

// decisionReceipt waits for the call's decision receipt in ClickHouse and
// reads its signed data.
func decisionReceipt(t *testing.T, ctx context.Context, conn driver.Conn, toolCallID string) schemas.Receipt {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var ce string
		err := conn.QueryRow(ctx, "SELECT cloudevent FROM receipts WHERE tool_call_id = ? AND kind = 'decision' LIMIT 1", toolCallID).Scan(&ce)
		if err == nil {
			var ev struct {
				Data schemas.Receipt `json:"data"`
			}
			if err := json.Unmarshal([]byte(ce), &ev); err != nil {
				t.Fatal(err)
			}
			return ev.Data
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision receipt for %s: %v", toolCallID, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
