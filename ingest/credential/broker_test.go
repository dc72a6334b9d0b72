package credential

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// sts is an RFC 8693 token endpoint for tests: it checks the grant and the
// client credentials, and issues "exchanged-<n>-for-<audience>" tokens
// valid for expiresIn seconds (the subject token itself when echo is set);
// to the client credentials grant, "own-<n>-for-<audience>" tokens.
type sts struct {
	*httptest.Server
	mu        sync.Mutex
	forms     []map[string]string
	n         atomic.Int64
	status    atomic.Int64 // answer this HTTP status instead (0: issue)
	echo      atomic.Bool
	expiresIn int
}

func newSTS(t *testing.T) *sts {
	s := &sts{expiresIn: 300}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		form := map[string]string{}
		for k := range r.PostForm {
			form[k] = r.PostForm.Get(k)
		}
		s.mu.Lock()
		s.forms = append(s.forms, form)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if st := s.status.Load(); st != 0 {
			w.WriteHeader(int(st))
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		if form["client_id"] != "gw" || form["client_secret"] != "gw-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		if form["grant_type"] == "client_credentials" && form["subject_token"] == "" {
			_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "own-" + strconv.FormatInt(s.n.Add(1), 10) + "-for-" + form["audience"],
				"token_type": "Bearer", "expires_in": s.expiresIn})
			return
		}
		if form["grant_type"] != "urn:ietf:params:oauth:grant-type:token-exchange" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"unsupported_grant_type"}`))
			return
		}
		tok := "exchanged-" + strconv.FormatInt(s.n.Add(1), 10) + "-for-" + form["audience"]
		if s.echo.Load() {
			tok = form["subject_token"]
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer",
			"issued_token_type": TokenTypeAccessToken, "expires_in": s.expiresIn})
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sts) last() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.forms) == 0 {
		return nil
	}
	return s.forms[len(s.forms)-1]
}

func writeConfig(t *testing.T, v any) string {
	t.Helper()
	dir := t.TempDir()
	b, _ := json.Marshal(v)
	p := filepath.Join(dir, "credentials.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) (string, bool) { return "", false }

var ups = []Upstream{{ServerID: "crm", URL: "https://crm.example/mcp"}, {ServerID: "gh", URL: "https://gh.example/mcp"},
	{ServerID: "local"}, {ServerID: "fs"}}

// TestBrokerModes: none sends nothing; secret sends the gateway's secret
// (from a file, or its environment for a stdio server); token_exchange
// sends a token exchanged for the server's audience and resource with the
// gateway's client credentials (CRED-01), never the client's (CRED-02).
func TestBrokerModes(t *testing.T) {
	st := newSTS(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gh.token"), []byte("gh-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, map[string]any{"servers": map[string]any{
		"gh":    map[string]any{"mode": "secret", "secret_file": filepath.Join(dir, "gh.token")},
		"local": map[string]any{"mode": "secret", "secret_env": "LOCAL_TOKEN", "stdio_env": "API_TOKEN"},
		"crm": map[string]any{"mode": "token_exchange", "token_endpoint": st.URL, "client_id": "gw",
			"client_secret_env": "STS_SECRET", "scope": []string{"crm.read"}},
		"fs": map[string]any{"mode": "none"},
	}})
	env := map[string]string{"LOCAL_TOKEN": "local-secret", "STS_SECRET": "gw-secret"}
	cfg, err := Load(path, ups, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	b := New(cfg, Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		server, want string
		handling     schemas.TokenHandling
	}{
		{"fs", "", schemas.TokenHandling{Mode: "none"}},
		{"unlisted", "", schemas.TokenHandling{Mode: "none"}},
		{"gh", "gh-secret", schemas.TokenHandling{Mode: "secret", Audience: "gh"}},
		{"local", "local-secret", schemas.TokenHandling{Mode: "secret", Audience: "local"}},
		{"crm", "exchanged-1-for-crm", schemas.TokenHandling{Mode: "token_exchange", Audience: "crm"}},
	} {
		c, err := b.Resolve(ctx, Request{Principal: "alice", ServerID: tc.server, Inbound: "client-jwt", SubjectToken: "client-jwt"})
		if err != nil || c.Token != tc.want || c.Handling != tc.handling {
			t.Fatalf("%s: %+v %v, want %q %+v", tc.server, c, err, tc.want, tc.handling)
		}
	}
	f := st.last()
	for k, v := range map[string]string{"audience": "crm", "resource": "https://crm.example/mcp", "subject_token": "client-jwt",
		"subject_token_type": TokenTypeJWT, "requested_token_type": TokenTypeAccessToken, "scope": "crm.read"} {
		if f[k] != v {
			t.Fatalf("exchange form %s = %q, want %q (%v)", k, f[k], v, f)
		}
	}
	if got := b.StdioEnv("local"); len(got) != 1 || got[0] != "API_TOKEN=local-secret" {
		t.Fatalf("StdioEnv: %v", got)
	}
	if b.StdioEnv("gh") != nil || b.Transport("gh", nil).session.get() != "gh-secret" || b.Transport("crm", nil).session != nil ||
		b.Transport("crm", nil).own == nil || b.Transport("gh", nil).own != nil || b.Transport("fs", nil).own != nil {
		t.Fatal("session credentials: a secret, or the gateway's own token in mode token_exchange, is sent outside a call")
	}
}

// TestSecretFileRotation: a secret_file rewritten while the gateway runs is
// what the next call and the session's next request send; a file removed or
// emptied leaves the last good secret in use; an environment secret is
// read once.
func TestSecretFileRotation(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gh.token")
	write := func(v string, at time.Time) {
		if err := os.WriteFile(file, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, at, at); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour)
	write("first-secret\n", t0)
	cfgPath := filepath.Join(dir, "credentials.json")
	if err := os.WriteFile(cfgPath, []byte(`{"servers": {"gh": {"mode": "secret", "secret_file": "gh.token"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := LoadBroker(cfgPath, []Upstream{{ServerID: "gh", URL: "https://gh.example/mcp"}}, func(string) (string, bool) { return "", false }, Options{})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func() string {
		c, err := b.Resolve(context.Background(), Request{Principal: "p", ServerID: "gh"})
		if err != nil {
			t.Fatal(err)
		}
		return c.Token
	}
	session := b.Transport("gh", nil)
	if got := resolve(); got != "first-secret" || session.session.get() != "first-secret" {
		t.Fatalf("before the rotation: %q", got)
	}
	write("second-secret", t0.Add(time.Minute)) // the same size would do: the time changed
	if got := resolve(); got != "second-secret" || session.session.get() != "second-secret" {
		t.Fatalf("after the rotation: call %q, session %q", got, session.session.get())
	}
	write("  \n", t0.Add(2*time.Minute))
	if got := resolve(); got != "second-secret" {
		t.Fatalf("an emptied file: %q, want the last good secret", got)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if got := resolve(); got != "second-secret" {
		t.Fatalf("a removed file: %q, want the last good secret", got)
	}
}

// TestBrokerPassthrough: a configured secret, or an exchanged token, equal
// to the client's token is refused and reported (CRED-02).
func TestBrokerPassthrough(t *testing.T) {
	st := newSTS(t)
	st.echo.Store(true)
	path := writeConfig(t, map[string]any{"servers": map[string]any{
		"gh":  map[string]any{"mode": "secret", "secret_env": "GH"},
		"crm": map[string]any{"mode": "token_exchange", "token_endpoint": st.URL, "client_id": "gw", "client_secret_env": "STS_SECRET"},
	}})
	env := map[string]string{"GH": "client-jwt", "STS_SECRET": "gw-secret"}
	cfg, err := Load(path, ups, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	b := New(cfg, Options{})
	for _, server := range []string{"gh", "crm"} {
		c, err := b.Resolve(context.Background(), Request{Principal: "alice", ServerID: server, Inbound: "client-jwt", SubjectToken: "client-jwt"})
		if !errors.Is(err, ErrPassthrough) || c.Token != "" || !c.Handling.PassthroughDetected || c.Handling.Audience != server {
			t.Fatalf("%s: %+v %v, want a detected passthrough", server, c, err)
		}
	}
	// Another client's token is not a passthrough of this one's.
	if c, err := b.Resolve(context.Background(), Request{Principal: "bob", ServerID: "gh", Inbound: "bob-jwt"}); err != nil || c.Token != "client-jwt" {
		t.Fatalf("bob: %+v %v", c, err)
	}
}

// TestBrokerCache: an exchanged token is reused per (principal, server)
// until RefreshBefore its expiry, exchanged again after it, and for a new
// client token; principals do not share tokens.
func TestBrokerCache(t *testing.T) {
	st := newSTS(t)
	st.expiresIn = 120
	b, now := clockedBroker(t, map[string]any{
		"crm": map[string]any{"mode": "token_exchange", "token_endpoint": st.URL, "client_id": "gw", "client_secret_env": "S"}})
	get := func(principal, subject string) string {
		t.Helper()
		c, err := b.Resolve(context.Background(), Request{Principal: principal, ServerID: "crm", Inbound: subject, SubjectToken: subject})
		if err != nil {
			t.Fatal(err)
		}
		return c.Token
	}
	first := get("alice", "a1")
	if again := get("alice", "a1"); again != first || st.n.Load() != 1 {
		t.Fatalf("cached token not reused: %s then %s (%d exchanges)", first, again, st.n.Load())
	}
	if bob := get("bob", "b1"); bob == first || st.n.Load() != 2 {
		t.Fatalf("bob got alice's token or no exchange: %s", bob)
	}
	now.Add(int64(80 * time.Second)) // 40 s before expiry: still fresh
	if get("alice", "a1") != first {
		t.Fatal("exchanged again too early")
	}
	now.Add(int64(15 * time.Second)) // 25 s before expiry: refresh
	refreshed := get("alice", "a1")
	if refreshed == first || st.n.Load() != 3 {
		t.Fatalf("not exchanged again shortly before expiry: %s", refreshed)
	}
	if next := get("alice", "a2"); next == refreshed || st.n.Load() != 4 {
		t.Fatal("a new client token reused the old exchange")
	}
}

// TestBrokerFailures: without a JWT, with the endpoint refusing, and with
// it down, there is no credential and the handling says why (fail closed);
// nothing stale is served after a failure.
func TestBrokerFailures(t *testing.T) {
	st := newSTS(t)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	path := writeConfig(t, map[string]any{"servers": map[string]any{
		"crm": map[string]any{"mode": "token_exchange", "token_endpoint": st.URL, "client_id": "gw", "client_secret_env": "S"},
		"gh":  map[string]any{"mode": "token_exchange", "token_endpoint": down.URL, "client_id": "gw", "client_secret_env": "S", "timeout": "2s"},
	}})
	cfg, err := Load(path, ups, func(string) (string, bool) { return "gw-secret", true })
	if err != nil {
		t.Fatal(err)
	}
	b := New(cfg, Options{})
	ctx := context.Background()
	if _, err := b.Resolve(ctx, Request{Principal: "a", ServerID: "crm", SubjectToken: "t1"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		server string
		status int
		sub    string
		want   error
		code   string
	}{
		{"no JWT", "crm", 0, "", ErrNoSubjectToken, schemas.TokenErrNoSubjectToken},
		{"refused", "crm", http.StatusBadRequest, "t2", ErrExchange, schemas.TokenErrExchangeRefused},
		{"server error", "crm", http.StatusBadGateway, "t2", ErrExchange, schemas.TokenErrEndpointUnreachable},
		{"down", "gh", 0, "t1", ErrExchange, schemas.TokenErrEndpointUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st.status.Store(int64(tc.status))
			c, err := b.Resolve(ctx, Request{Principal: "a", ServerID: tc.server, SubjectToken: tc.sub})
			if !errors.Is(err, tc.want) || c.Token != "" || c.Handling.Error != tc.code || c.Handling.PassthroughDetected {
				t.Fatalf("%+v %v, want %v (%s)", c, err, tc.want, tc.code)
			}
		})
	}
}

// TestLoadErrors: configurations that could not be honoured are refused
// at start, without repeating a secret.
func TestLoadErrors(t *testing.T) {
	env := func(k string) (string, bool) {
		if k == "SET" {
			return "s3cret-value", true
		}
		return "", false
	}
	for name, tc := range map[string]struct {
		servers map[string]any
		want    string
	}{
		"unknown server":       {map[string]any{"nope": map[string]any{"mode": "none"}}, "not an upstream"},
		"unknown mode":         {map[string]any{"gh": map[string]any{"mode": "passthrough"}}, "want none, secret or token_exchange"},
		"secret without value": {map[string]any{"gh": map[string]any{"mode": "secret"}}, "secret_file or secret_env is required"},
		"secret env unset":     {map[string]any{"gh": map[string]any{"mode": "secret", "secret_env": "UNSET"}}, "not set"},
		"two sources":          {map[string]any{"gh": map[string]any{"mode": "secret", "secret_env": "SET", "secret_file": "x"}}, "exclude"},
		"stdio without env":    {map[string]any{"local": map[string]any{"mode": "secret", "secret_env": "SET"}}, "stdio_env is required"},
		"stdio_env on HTTP":    {map[string]any{"gh": map[string]any{"mode": "secret", "secret_env": "SET", "stdio_env": "X"}}, "stdio upstreams"},
		"exchange on stdio":    {map[string]any{"local": map[string]any{"mode": "token_exchange", "token_endpoint": "https://x", "client_id": "c"}}, "HTTP upstream"},
		"exchange no endpoint": {map[string]any{"crm": map[string]any{"mode": "token_exchange", "client_id": "c"}}, "token_endpoint"},
		"exchange no client":   {map[string]any{"crm": map[string]any{"mode": "token_exchange", "token_endpoint": "https://x"}}, "client_id"},
		"none with a secret":   {map[string]any{"fs": map[string]any{"mode": "none", "secret_env": "SET"}}, "no other field"},
		"exchange bad session": {map[string]any{"crm": map[string]any{"mode": "token_exchange", "token_endpoint": "https://x", "client_id": "c",
			"session": "client"}}, "want client_credentials or none"},
		"session on a secret": {map[string]any{"gh": map[string]any{"mode": "secret", "secret_env": "SET", "session": "none"}}, "mode secret takes"},
		"unknown field":       {map[string]any{"gh": map[string]any{"mode": "none", "token": "x"}}, "unknown field"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load(writeConfig(t, map[string]any{"servers": tc.servers}), ups, env)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret-value") {
				t.Fatalf("%v, want an error naming %q", err, tc.want)
			}
		})
	}
	if _, err := Load(writeConfig(t, map[string]any{"servers": map[string]any{}}), ups, noEnv); err != nil {
		t.Fatalf("an empty file: %v", err)
	}
}

// TestTransport: the client's Authorization never passes; the call's
// credential wins over the session's.
func TestTransport(t *testing.T) {
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
	}))
	defer up.Close()
	for _, tc := range []struct {
		session, call, want string
	}{{"", "", ""}, {"sess", "", "Bearer sess"}, {"sess", "call", "Bearer call"}, {"", "call", "Bearer call"}} {
		c := &http.Client{Transport: &Transport{Session: tc.session}}
		ctx := context.Background()
		if tc.call != "" {
			ctx = WithToken(ctx, tc.call)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, nil)
		req.Header.Set("Authorization", "Bearer client-token")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got[len(got)-1] != tc.want || req.Header.Get("Authorization") != "Bearer client-token" {
			t.Fatalf("%+v: upstream got %q", tc, got[len(got)-1])
		}
	}
}

// TestSessionToken: in mode token_exchange the session's own requests
// carry the gateway's own token, from the client credentials grant with its
// client credentials for the server's audience, resource and scope, cached
// until RefreshBefore its expiry and fetched again after it, apart from
// the exchanged tokens; a call's credential wins; session none sends
// nothing. A refused grant fails the request, naming the server, the
// endpoint and its answer, and nothing reaches the upstream.
func TestSessionToken(t *testing.T) {
	st := newSTS(t)
	st.expiresIn = 120
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.Header.Get("Authorization"))
	}))
	defer up.Close()
	b, now := clockedBroker(t, map[string]any{
		"crm": map[string]any{"mode": "token_exchange", "token_endpoint": st.URL, "client_id": "gw", "client_secret_env": "S",
			"audience": "crm-api", "scope": []string{"crm.read", "crm.list"}},
		"gh": map[string]any{"mode": "token_exchange", "token_endpoint": st.URL, "client_id": "gw", "client_secret_env": "S", "session": "none"},
	})
	send := func(ctx context.Context, server string) (string, error) {
		t.Helper()
		mu.Lock()
		n := len(got)
		mu.Unlock()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader(`{"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer client-token")
		resp, err := (&http.Client{Transport: b.Transport(server, nil)}).Do(req)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if len(got) != n {
				t.Fatalf("%s: a failed request reached the upstream", server)
			}
			return "", err
		}
		resp.Body.Close()
		return got[len(got)-1], nil
	}
	want := func(ctx context.Context, server, auth string, grants int64) {
		t.Helper()
		if a, err := send(ctx, server); err != nil || a != auth || st.n.Load() != grants {
			t.Fatalf("%s: the upstream got %q (%v) after %d grants, want %q after %d", server, a, err, st.n.Load(), auth, grants)
		}
	}
	ctx := context.Background()
	want(ctx, "crm", "Bearer own-1-for-crm-api", 1)
	f := st.last()
	for k, v := range map[string]string{"grant_type": "client_credentials", "audience": "crm-api", "resource": "https://crm.example/mcp",
		"scope": "crm.read crm.list", "client_id": "gw", "client_secret": "gw-secret", "subject_token": ""} {
		if f[k] != v {
			t.Fatalf("client credentials form %s = %q, want %q (%v)", k, f[k], v, f)
		}
	}
	want(ctx, "crm", "Bearer own-1-for-crm-api", 1)
	now.Add(int64(80 * time.Second)) // 40 s before expiry: still fresh
	want(ctx, "crm", "Bearer own-1-for-crm-api", 1)
	now.Add(int64(15 * time.Second)) // 25 s before expiry: fetched again
	want(ctx, "crm", "Bearer own-2-for-crm-api", 2)
	want(WithToken(ctx, "exchanged-for-a-call"), "crm", "Bearer exchanged-for-a-call", 2)
	if c, err := b.Resolve(ctx, Request{Principal: "alice", ServerID: "crm", Inbound: "jwt", SubjectToken: "jwt"}); err != nil || c.Token != "exchanged-3-for-crm-api" {
		t.Fatalf("a call's exchange: %+v %v", c, err)
	}
	want(ctx, "crm", "Bearer own-2-for-crm-api", 3)
	want(ctx, "gh", "", 3) // session none
	if tok, err := b.SessionToken(ctx, "gh"); tok != "" || err != nil {
		t.Fatalf("session none: %q %v", tok, err)
	}

	now.Add(int64(time.Hour)) // expired: the grant is asked again, and refused
	st.status.Store(http.StatusBadRequest)
	_, err := send(ctx, "crm")
	if !errors.Is(err, ErrSessionToken) {
		t.Fatalf("a refused grant: %v, want ErrSessionToken", err)
	}
	for _, part := range []string{"for crm:", "client credentials grant at " + st.URL, "invalid_grant"} {
		if !strings.Contains(err.Error(), part) {
			t.Fatalf("a refused grant: %q does not say %q", err, part)
		}
	}
	if strings.Contains(err.Error(), "gw-secret") {
		t.Fatal("the error repeats the client secret")
	}
	st.status.Store(0)
	want(ctx, "crm", "Bearer own-4-for-crm-api", 4) // granted again
}

// TestLoadBroker: without a file every server is mode none; with one, its
// servers are configured; a bad file is Load's error.
func TestLoadBroker(t *testing.T) {
	b, err := LoadBroker("", ups, noEnv, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h := b.Declared("gh"); h.Mode != "none" {
		t.Fatalf("no file: gh is %q, want none", h.Mode)
	}
	env := func(k string) (string, bool) { return "gh-secret", k == "GH" }
	b, err = LoadBroker(writeConfig(t, map[string]any{"servers": map[string]any{"gh": map[string]any{"mode": "secret", "secret_env": "GH"}}}), ups, env, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.Resolve(t.Context(), Request{Principal: "p", ServerID: "gh"})
	if err != nil || c.Token != "gh-secret" || c.Handling.Mode != "secret" {
		t.Fatalf("gh: %+v, %v", c, err)
	}
	if _, err := LoadBroker(writeConfig(t, map[string]any{"servers": map[string]any{"nope": map[string]any{"mode": "none"}}}), ups, env, Options{}); err == nil ||
		!strings.Contains(err.Error(), "not an upstream") {
		t.Fatalf("a bad file: %v", err)
	}
}

// clockedBroker is a broker over the configuration of servers (client
// secret "gw-secret" from the environment), refreshing 30 s before
// expiry, on a clock the test sets (now, in Unix nanoseconds).
func clockedBroker(t *testing.T, servers map[string]any) (*Broker, *atomic.Int64) {
	t.Helper()
	cfg, err := Load(writeConfig(t, map[string]any{"servers": servers}), ups, func(string) (string, bool) { return "gw-secret", true })
	if err != nil {
		t.Fatal(err)
	}
	now := new(atomic.Int64)
	now.Store(time.Now().UnixNano())
	return New(cfg, Options{RefreshBefore: 30 * time.Second, Now: func() time.Time { return time.Unix(0, now.Load()) }}), now
}
