package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
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
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// seen is one request an authProxy forwarded: its JSON-RPC method ("" for
// a GET stream, a DELETE or a response) and its Authorization header.
type seen struct {
	method, auth string
}

// authProxy is a reverse proxy in front of a real upstream that records
// the Authorization header of every request it forwards.
type authProxy struct {
	mu   sync.Mutex
	reqs []seen
	url  string
}

func newAuthProxy(t *testing.T, target string) *authProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &authProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		p.mu.Lock()
		p.reqs = append(p.reqs, seen{method: msg.Method, auth: r.Header.Get("Authorization")})
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	p.url = hs.URL + "/mcp"
	return p
}

// split is the Authorization headers of the tools/call requests the proxy
// forwarded, and those of all its other requests (the session's own).
func (p *authProxy) split() (calls, session []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reqs {
		if r.method == "tools/call" {
			calls = append(calls, r.auth)
		} else {
			session = append(session, r.auth)
		}
	}
	return calls, session
}

// of is the Authorization headers of the requests of one JSON-RPC method.
func (p *authProxy) of(method string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, r := range p.reqs {
		if r.method == method {
			out = append(out, r.auth)
		}
	}
	return out
}

// tokenEndpoint is a token endpoint that checks the gateway's client
// credentials and records each request's form: an RFC 8693 exchange is
// answered with a fresh token for the requested audience, a client
// credentials grant (RFC 6749 §4.4) bound to the upstream's audience and
// to a resource with a fresh "own" token for it; everything with 503
// while failing.
type tokenEndpoint struct {
	mu      sync.Mutex
	forms   []map[string]string // exchanges
	grants  []map[string]string // client credentials grants
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
		own := f["grant_type"] == "client_credentials"
		e.mu.Lock()
		if own {
			e.grants = append(e.grants, f)
		} else {
			e.forms = append(e.forms, f)
		}
		n := len(e.forms) // each kind is numbered apart
		if own {
			n = len(e.grants)
		}
		e.mu.Unlock()
		if e.failing.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if f["client_id"] != "talos-gw" || f["client_secret"] != "gw-client-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		switch {
		case own && (f["audience"] != "everything-api" || !strings.HasSuffix(f["resource"], "/mcp") || f["subject_token"] != ""):
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_target"}`))
		case own:
			_ = json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("own-%d-aud-%s", n, f["audience"]),
				"token_type": "Bearer", "expires_in": 600})
		case f["grant_type"] != "urn:ietf:params:oauth:grant-type:token-exchange":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"unsupported_grant_type"}`))
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("exchanged-%d-aud-%s", n, f["audience"]),
				"token_type": "Bearer", "issued_token_type": "urn:ietf:params:oauth:token-type:access_token", "expires_in": 600})
		}
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

func (e *tokenEndpoint) clientGrants() []map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.grants)
}

// TestCredentialBoundary runs the gateway binary in HTTP mode (TLS, JWTs
// from a test issuer) in front of the real npm server-everything over
// streamable HTTP, with the real pipeline and ClickHouse (CSP MUST 5). Each
// gateway reaches server-everything through its own reverse proxy that
// records the Authorization header of every request it forwards:
//   - CRED-01: with token_exchange, the token endpoint gets an RFC 8693
//     exchange of alice's JWT for the upstream's audience and resource with
//     the gateway's client credentials, and every tools/call the upstream
//     gets carries the exchanged token; a second call reuses it; the
//     session's own requests (initialize, tools/list, its stream) carry the
//     gateway's own token, from one client credentials grant for the same
//     audience and resource; a gateway refused that grant does not start,
//     naming the server and the endpoint's error;
//   - with mode secret, the upstream gets the configured secret on every
//     request, alice's call included, and never her JWT;
//   - CRED-02: no client token reaches the upstream; a gateway whose
//     secret for that upstream equals alice's token denies her call
//     DENY_TOKEN_PASSTHROUGH with a receipt and forwards no tools/call;
//   - with the token endpoint down, a call is denied
//     DENY_CREDENTIAL_UNAVAILABLE with a receipt (fail closed);
//   - CRED-03: the decision receipts in ClickHouse carry token_handling,
//     passthrough_detected false for the exchanged and secret calls and
//     true for the refused one, and no token reached ClickHouse.
func TestCredentialBoundary(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	idp := filepath.Join(s.dir, "idp")
	if err := os.MkdirAll(idp, 0o700); err != nil {
		t.Fatal(err)
	}
	is := testenv.NewIssuer(t, idp)
	everything, sts := testenv.StartEverythingHTTP(t), newTokenEndpoint(t)
	writeJSON(t, filepath.Join(s.dir, "principals.json"), map[string]any{"principals": []map[string]string{
		{"name": "alice", "jwt_subject": "alice@clients"}, {"name": "ops", "jwt_subject": "ops@clients"}}})
	writeJSON(t, filepath.Join(s.dir, "exchange.json"), map[string]any{"servers": map[string]any{
		"everything": map[string]any{"mode": "token_exchange", "token_endpoint": sts.url, "client_id": "talos-gw",
			"client_secret_env": "GW_STS_SECRET", "audience": "everything-api", "scope": []string{"echo"}}}})
	writeJSON(t, filepath.Join(s.dir, "secret.json"), map[string]any{"servers": map[string]any{
		"everything": map[string]any{"mode": "secret", "secret_env": "EVERYTHING_TOKEN"}}})
	alice := is.Mint(t, "RS256", is.Claims("alice@clients", audience, time.Hour))
	ops := is.Mint(t, "ES256", is.Claims("ops@clients", audience, time.Hour))

	client := is.TLS.Client()
	gw := func(ep, creds string, env ...string) (func(token string) *gatewaySession, *authProxy) {
		up := newAuthProxy(t, everything)
		port := testenv.FreePort(t)
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
		}, up
	}
	leaks := func(what string, auths []string) {
		t.Helper()
		for _, a := range auths {
			if strings.Contains(a, alice) || strings.Contains(a, ops) {
				t.Fatalf("CRED-02: %s: a client's token reached the upstream", what)
			}
		}
	}

	// CRED-01: exchanged for the upstream's audience, twice from the cache.
	exchange, xUp := gw("gw-cred-x", "exchange.json", "GW_STS_SECRET=gw-client-secret")
	aliceX := exchange(alice)
	var allowed []string
	for i := range 2 {
		res := aliceX.call(ctx, "echo", map[string]any{"message": "hi " + strconv.Itoa(i)}).mustAllow(t, "CRED-01 alice's echo")
		if !strings.Contains(text(res), "Echo: hi "+strconv.Itoa(i)) {
			t.Fatalf("echo: %q", text(res))
		}
		allowed = append(allowed, res.Meta[gateway.MetaToolCallID].(string))
	}
	ex := sts.exchanges()
	if len(ex) != 1 {
		t.Fatalf("%d exchanges for two calls of one principal, want 1 (cached)", len(ex))
	}
	for k, v := range map[string]string{"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "audience": "everything-api",
		"resource": xUp.url, "scope": "echo", "subject_token": alice, "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
		"client_id": "talos-gw"} {
		if ex[0][k] != v {
			t.Fatalf("CRED-01: the exchange's %s is %q, want %q", k, ex[0][k], v)
		}
	}
	calls, session := xUp.split()
	if !slices.Equal(calls, []string{"Bearer exchanged-1-aud-everything-api", "Bearer exchanged-1-aud-everything-api"}) {
		t.Fatalf("CRED-01: the upstream's tools/call requests carried %q, want the exchanged token twice", calls)
	}
	// The session's own requests carry the gateway's own token, granted to
	// it for the upstream's audience and resource and cached: never a
	// client's token, and never nothing.
	grants := sts.clientGrants()
	if len(grants) != 1 {
		t.Fatalf("%d client credentials grants, want 1 (cached for the session)", len(grants))
	}
	for k, v := range map[string]string{"grant_type": "client_credentials", "audience": "everything-api", "resource": xUp.url,
		"scope": "echo", "client_id": "talos-gw", "subject_token": ""} {
		if grants[0][k] != v {
			t.Fatalf("the client credentials grant's %s is %q, want %q", k, grants[0][k], v)
		}
	}
	const own = "Bearer own-1-aud-everything-api"
	for _, m := range []string{"initialize", "tools/list"} {
		if got := xUp.of(m); len(got) == 0 || slices.ContainsFunc(got, func(a string) bool { return a != own }) {
			t.Fatalf("token_exchange: the upstream's %s requests carried %q, want the gateway's own token", m, got)
		}
	}
	if slices.ContainsFunc(session, func(a string) bool { return a != own }) {
		t.Fatalf("token_exchange: the session's own requests carried %q, want the gateway's own token on each", session)
	}

	// A token endpoint that refuses the gateway its own token: the upstream
	// cannot be connected, nothing is sent to it, and the gateway does not
	// start, saying which server and what the endpoint answered.
	rUp := newAuthProxy(t, everything)
	rCmd := testenv.CommandContext(ctx, s.gateway, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", registryDir,
		"--ep-id", "gw-cred-r", "--spool-dir", t.TempDir(), "--upstream", "everything="+rUp.url,
		"--credentials", filepath.Join(s.dir, "exchange.json"))
	rCmd.Env = append(os.Environ(), "GW_STS_SECRET=not-the-client-secret")
	out, err := rCmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("a refused client credentials grant: %v, want exit 1:\n%s", err, out)
	}
	for _, part := range []string{`server "everything"`, "client credentials grant at " + sts.url, "invalid_client"} {
		if !strings.Contains(string(out), part) {
			t.Fatalf("a refused client credentials grant: the gateway's error does not say %q:\n%s", part, out)
		}
	}
	if calls, session := rUp.split(); len(calls)+len(session) != 0 {
		t.Fatalf("a refused client credentials grant: %d requests reached the upstream", len(calls)+len(session))
	}

	// The token endpoint down: ops (nothing cached) is denied, fail closed.
	sts.failing.Store(true)
	down := exchange(ops).call(ctx, "echo", map[string]any{"message": "x"}).mustDeny(t, "token endpoint down", schemas.CodeDenyCredentialUnavailable)
	sts.failing.Store(false)
	calls, session = xUp.split()
	if len(calls) != 2 {
		t.Fatalf("the upstream ran %d calls, want the 2 allowed", len(calls))
	}
	leaks("token_exchange", append(calls, session...))

	// Mode secret: the upstream gets the configured secret, not alice's JWT.
	const secret = "everything-upstream-secret"
	secretGW, sUp := gw("gw-cred-s", "secret.json", "EVERYTHING_TOKEN="+secret)
	res := secretGW(alice).call(ctx, "echo", map[string]any{"message": "with the secret"}).mustAllow(t, "alice's echo, mode secret")
	allowedSecret := res.Meta[gateway.MetaToolCallID].(string)
	calls, session = sUp.split()
	if !slices.Equal(calls, []string{"Bearer " + secret}) {
		t.Fatalf("secret: the upstream's tools/call requests carried %q, want the secret once", calls)
	}
	for _, a := range session {
		if a != "Bearer "+secret {
			t.Fatalf("secret: a session request carried %q, want the secret", a)
		}
	}
	leaks("secret", append(calls, session...))

	// CRED-02: a secret equal to alice's token is refused, not forwarded.
	// The check is per call: this gateway's session requests (initialize,
	// tools/list, its stream) carry its configured secret, here alice's
	// token, because it cannot know that before a client calls.
	pass, pUp := gw("gw-cred-p", "secret.json", "EVERYTHING_TOKEN="+alice)
	refused := pass(alice).call(ctx, "echo", map[string]any{"message": "leak?"}).mustDeny(t, "CRED-02 passthrough", schemas.CodeDenyTokenPassthrough)
	if refused.ReceiptID == "" {
		t.Fatalf("CRED-02: the denial names no receipt: %+v", refused)
	}
	if calls, _ := pUp.split(); len(calls) != 0 {
		t.Fatalf("CRED-02: the refused call reached the upstream (%d tools/call requests)", len(calls))
	}

	// CRED-03: the receipts say how each call's credential was handled.
	conn := s.clickhouse(t, ctx)
	defer conn.Close()
	want := map[string]schemas.TokenHandling{
		allowed[0]:         {Mode: schemas.TokenModeTokenExchange, Audience: "everything-api"},
		allowed[1]:         {Mode: schemas.TokenModeTokenExchange, Audience: "everything-api"},
		down.ToolCallID:    {Mode: schemas.TokenModeTokenExchange, Audience: "everything-api", Error: schemas.TokenErrEndpointUnreachable},
		allowedSecret:      {Mode: schemas.TokenModeSecret, Audience: "everything"},
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
	for _, tok := range []string{alice, ops, "exchanged-1-aud", "own-1-aud", secret} {
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
