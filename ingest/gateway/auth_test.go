package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/jwtauth"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

const testAudience = "talos-mcp-gateway"

func hexSHA(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// testPrincipals: alice by sub, the ops team by claim, legacy by a static
// token; carol by both a static token and a sub.
func testPrincipals() []*Principal {
	return []*Principal{
		{Name: "alice", JWTSubject: "alice@clients"},
		{Name: "ops", JWTPrincipal: "ops-team"},
		{Name: "legacy", TokenSHA256: hexSHA("legacy-token")},
		{Name: "carol", TokenSHA256: hexSHA("carol-token"), JWTSubject: "carol@clients"},
	}
}

// TestPrincipalByJWT: the talos_principal claim, when present, selects by
// jwt_principal alone; otherwise sub selects by jwt_subject.
func TestPrincipalByJWT(t *testing.T) {
	ix, err := indexPrincipals(testPrincipals())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		claims jwtauth.Claims
		want   string // "" = none
	}{
		{"sub selects", jwtauth.Claims{Subject: "alice@clients", Extra: map[string]any{}}, "alice"},
		{"claim selects", jwtauth.Claims{Subject: "someone", Extra: map[string]any{PrincipalClaim: "ops-team"}}, "ops"},
		{"claim wins over sub", jwtauth.Claims{Subject: "alice@clients", Extra: map[string]any{PrincipalClaim: "ops-team"}}, "ops"},
		{"unknown claim is not read as sub", jwtauth.Claims{Subject: "alice@clients", Extra: map[string]any{PrincipalClaim: "admins"}}, ""},
		{"claim not a string", jwtauth.Claims{Subject: "alice@clients", Extra: map[string]any{PrincipalClaim: []any{"ops-team"}}}, ""},
		{"claim is a principal's name, not its jwt_principal", jwtauth.Claims{Extra: map[string]any{PrincipalClaim: "ops"}}, ""},
		{"unknown sub", jwtauth.Claims{Subject: "mallory", Extra: map[string]any{}}, ""},
		{"no sub", jwtauth.Claims{Extra: map[string]any{}}, ""},
		{"a principal's name as sub", jwtauth.Claims{Subject: "legacy", Extra: map[string]any{}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ix.byJWT(&tc.claims)
			got := ""
			if p != nil {
				got = p.Name
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	if p := ix.byStaticToken("legacy-token"); p == nil || p.Name != "legacy" {
		t.Fatalf("static token: %v", p)
	}
	if p := ix.byStaticToken("alice@clients"); p != nil {
		t.Fatalf("a sub taken for a static token: %v", p.Name)
	}
}

func TestLoadPrincipalsJWT(t *testing.T) {
	dir := t.TempDir()
	write := func(v any) string {
		b, _ := json.Marshal(v)
		p := filepath.Join(dir, "p.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ps, err := LoadPrincipals(write(map[string]any{"principals": []map[string]string{
		{"name": "alice", "jwt_subject": "alice@clients"},
		{"name": "ops", "jwt_principal": "ops-team", "agent_id": "ops-agent"},
		{"name": "legacy", "token_sha256": strings.ToUpper(hexSHA("x"))},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].JWTSubject != "alice@clients" || ps[0].AgentID != "alice" || ps[1].JWTPrincipal != "ops-team" ||
		ps[1].AgentID != "ops-agent" || ps[2].TokenSHA256 != hexSHA("x") {
		t.Fatalf("loaded %+v %+v %+v", ps[0], ps[1], ps[2])
	}
	for name, entries := range map[string][]map[string]string{
		"no way in":           {{"name": "a"}},
		"same subject":        {{"name": "a", "jwt_subject": "s"}, {"name": "b", "jwt_subject": "s"}},
		"same claim value":    {{"name": "a", "jwt_principal": "s"}, {"name": "b", "jwt_principal": "s"}},
		"same static token":   {{"name": "a", "token_sha256": hexSHA("t")}, {"name": "b", "token_sha256": hexSHA("t")}},
		"bad token_sha256":    {{"name": "a", "token_sha256": "abc", "jwt_subject": "s"}},
		"unknown field":       {{"name": "a", "jwt_subject": "s", "jwt_audience": "x"}},
		"duplicate name":      {{"name": "a", "jwt_subject": "s"}, {"name": "a", "jwt_subject": "t"}},
		"empty name with jwt": {{"jwt_subject": "s"}},
	} {
		if _, err := LoadPrincipals(write(map[string]any{"principals": entries})); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCheckListen(t *testing.T) {
	cases := []struct {
		addr          string
		tls, insecure bool
		ok            bool
	}{
		{"0.0.0.0:8931", true, false, true},
		{"0.0.0.0:8931", false, false, false},
		{"0.0.0.0:8931", false, true, false},
		{":8931", false, true, false},
		{"192.0.2.1:8931", false, true, false},
		{"127.0.0.1:8931", false, false, false},
		{"127.0.0.1:8931", false, true, true},
		{"[::1]:8931", false, true, true},
		{"localhost:8931", false, true, true},
		{"127.0.0.1:8931", true, true, false},
	}
	for _, tc := range cases {
		err := CheckListen(tc.addr, tc.tls, tc.insecure)
		if (err == nil) != tc.ok {
			t.Errorf("%s tls=%v insecure=%v: %v", tc.addr, tc.tls, tc.insecure, err)
		}
	}
}

func TestPeekRequest(t *testing.T) {
	cases := []struct {
		body, id, method string
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}`, `7`, "initialize"},
		{`{"jsonrpc":"2.0","id":"a-1","method":"tools/call","params":{"arguments":{"x":"secret"}}}`, `"a-1"`, "tools/call"},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `null`, "notifications/initialized"},
		{`{"jsonrpc":"2.0","id":{"x":1},"method":"initialize"}`, `null`, "initialize"},
		{`{"jsonrpc":"2.0","id":1,"method":"a method with spaces"}`, `1`, "POST"},
		{`not json`, `null`, "POST"},
		{``, `null`, "POST"},
	}
	for _, tc := range cases {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(tc.body))
		id, method := peekRequest(r)
		if string(id) != tc.id || method != tc.method {
			t.Errorf("%s: id %s method %s, want %s %s", tc.body, id, method, tc.id, tc.method)
		}
	}
}

// refusalGateway is a Gateway with only what refusals need: no NATS, its
// refusal outbox never started.
func refusalGateway() *Gateway {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return &Gateway{o: Options{EPID: "gw-1"}, log: log, refused: ep.NewOutbox(log)}
}

// sent keeps the reports a refusals sends.
type sent struct{ calls []*schemas.ToolCall }

func (s *sent) Send(c *schemas.ToolCall) { s.calls = append(s.calls, c) }
func (s *sent) Full() bool               { return false }

func (s *sent) byID(t *testing.T, id string) *schemas.ToolCall {
	t.Helper()
	for _, c := range s.calls {
		if c.ToolCallID == id {
			return c
		}
	}
	t.Fatalf("report %s not sent", id)
	return nil
}

// TestRefusalLimits: each source gets its burst of reports, then one a
// second; all sources together no more than Total; each refusal beyond is
// counted, and the next report from its source says how many it missed.
func TestRefusalLimits(t *testing.T) {
	g := refusalGateway()
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"reason", "receipted"})
	r := newRefusals(g, RefusalLimits{PerSource: 1, PerSourceBurst: 3, Total: 100, TotalBurst: 5, MaxSources: 2}, counter)
	now := time.Unix(1_000_000, 0)
	r.now = func() time.Time { return now }
	out := &sent{}
	r.out = out
	f := refusal{source: "192.0.2.1", method: "initialize", reason: "expired", fingerprint: "sha256:0011223344556677"}
	var ids []string
	for range 10 {
		if id := r.report(f); id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) != 3 {
		t.Fatalf("one source, burst 3: %d reported", len(ids))
	}
	if got := testutil.ToFloat64(counter.WithLabelValues("expired", "false")); got != 7 {
		t.Fatalf("unreported counted %v, want 7", got)
	}
	// A second source has its own bucket, but the total burst (5) is
	// nearly used: 2 more.
	g2 := f
	g2.source = "192.0.2.2"
	n := 0
	for range 5 {
		if r.report(g2) != "" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("second source under the total bucket: %d reported, want 2", n)
	}
	// A second later the first source's next report says what it missed.
	now = now.Add(1100 * time.Millisecond)
	id := r.report(f)
	if id == "" {
		t.Fatal("no report a second later")
	}
	env := out.byID(t, id)
	var args map[string]any
	if err := json.Unmarshal(env.Request.Arguments, &args); err != nil {
		t.Fatal(err)
	}
	if args["unreported_before"] != float64(7) || args["reason"] != "expired" || args["source"] != "192.0.2.1" ||
		args["fingerprint"] != f.fingerprint || len(args) != 4 {
		t.Fatalf("report arguments %v", args)
	}
	if env.ServerID != schemas.ServerUnauthenticated || env.ToolName != "initialize" || env.Phase != schemas.PhasePre ||
		env.Actor.AgentID != "" || env.SessionID != "unauthenticated-192.0.2.1" || env.RequestHash == "" {
		t.Fatalf("report envelope %+v", env)
	}
	raw, _ := json.Marshal(env)
	if _, err := schemas.ParseToolCall(raw, schemas.Limits{}); err != nil {
		t.Fatalf("the report is not a valid envelope: %v", err)
	}
	// MaxSources 2: a third source shares the overflow bucket while both
	// tracked ones are busy.
	g3 := f
	g3.source = "192.0.2.3"
	if _, tracked := r.sources["192.0.2.3"]; tracked {
		t.Fatal("tracked before its first refusal")
	}
	r.report(g3)
	if _, tracked := r.sources["192.0.2.3"]; tracked || len(r.sources) != 2 {
		t.Fatalf("sources tracked: %d", len(r.sources))
	}
}

// TestAuthenticator: a static token wins; a JWT selects by its claims;
// every refusal is JSON-RPC -32001 over 401 naming the request id, with a
// reason and a report to Talos.
func TestAuthenticator(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	ks, err := jwtauth.NewKeySet(jwtauth.KeySetOptions{File: is.JWKSFile})
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, err := jwtauth.NewVerifier(jwtauth.Options{Issuer: is.Name, Audience: testAudience, Keys: ks})
	if err != nil {
		t.Fatal(err)
	}
	g := refusalGateway()
	a := frontDoor(t, g, testPrincipals(), v)
	claims := func(sub string, extra map[string]any) map[string]any {
		c := is.Claims(sub, testAudience, time.Hour)
		for k, x := range extra {
			c[k] = x
		}
		return c
	}
	expired := claims("alice@clients", map[string]any{"exp": time.Now().Add(-time.Hour).Unix()})
	cases := []struct {
		name, auth, want, reason string
	}{
		{"static token", "Bearer legacy-token", "legacy", ""},
		{"static token beside a sub", "Bearer carol-token", "carol", ""},
		{"jwt by sub", "Bearer " + is.Mint(t, "ES256", claims("alice@clients", nil)), "alice", ""},
		{"jwt by claim", "Bearer " + is.Mint(t, "EdDSA", claims("x", map[string]any{PrincipalClaim: "ops-team"})), "ops", ""},
		{"no header", "", "", "missing_token"},
		{"not bearer", "Basic YTpi", "", "missing_token"},
		{"unknown opaque token", "Bearer nope", "", "malformed_token"},
		{"expired jwt", "Bearer " + is.Mint(t, "RS256", expired), "", "expired"},
		{"jwt for nobody here", "Bearer " + is.Mint(t, "RS256", claims("mallory", nil)), "", "unknown_principal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":"r-9","method":"tools/list"}`))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			a.ServeHTTP(rec, req)
			if tc.want != "" {
				if rec.Code != http.StatusOK || rec.Body.String() != tc.want {
					t.Fatalf("HTTP %d %q, want principal %s", rec.Code, rec.Body.String(), tc.want)
				}
				return
			}
			checkRefusal(t, rec, `"r-9"`, tc.reason)
		})
	}
	// Without a verifier an unknown token is just unknown.
	a.jwt = nil
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+is.Mint(t, "ES256", claims("alice@clients", nil)))
	a.ServeHTTP(rec, req)
	checkRefusal(t, rec, `null`, "unknown_token")
}

// frontDoor is the authenticator over handlers that answer their
// principal's name.
func frontDoor(t testing.TB, g *Gateway, ps []*Principal, v *jwtauth.Verifier) *authenticator {
	ix, err := indexPrincipals(ps)
	if err != nil {
		t.Fatal(err)
	}
	hs := map[string]http.Handler{}
	for _, p := range ps {
		hs[p.Name] = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, p.Name) })
	}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"reason", "receipted"})
	return &authenticator{ix: ix, jwt: v, handlers: hs, log: g.log,
		refusals: newRefusals(g, RefusalLimits{PerSourceBurst: 1 << 20, TotalBurst: 1 << 20}, counter)}
}

func checkRefusal(t *testing.T, rec *httptest.ResponseRecorder, id, reason string) {
	t.Helper()
	if rec.Code != http.StatusUnauthorized || !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer ") {
		t.Fatalf("HTTP %d, WWW-Authenticate %q", rec.Code, rec.Header().Get("WWW-Authenticate"))
	}
	var resp struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code int             `json:"code"`
			Data Unauthenticated `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if resp.JSONRPC != "2.0" || string(resp.ID) != id || resp.Error.Code != CodeUnauthenticated ||
		resp.Error.Data.Reason != reason || resp.Error.Data.ToolCallID == "" ||
		len(resp.Error.Data.ReasonCodes) != 1 || resp.Error.Data.ReasonCodes[0] != schemas.CodeDenyUnauthenticated {
		t.Fatalf("refusal %s, want id %s reason %s", rec.Body.String(), id, reason)
	}
}
