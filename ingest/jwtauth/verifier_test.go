package jwtauth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/talos-audit/talos/testenv"
)

const aud = "talos-mcp-gateway"

func verifier(t *testing.T, ks *KeySet, is *testenv.Issuer) *Verifier {
	t.Helper()
	v, err := NewVerifier(Options{Issuer: is.Name, Audience: aud, Keys: ks})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func fileKeys(t *testing.T, is *testenv.Issuer) *KeySet {
	t.Helper()
	ks, err := NewKeySet(KeySetOptions{File: is.JWKSFile})
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ks
}

// unsigned is a token with alg "none".
func unsigned(claims map[string]any) string {
	h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"RS256"}`))
	b, _ := json.Marshal(claims)
	return h + "." + base64.RawURLEncoding.EncodeToString(b) + "."
}

// TestVerifyReasons: a token of each allowed algorithm passes; each way a
// token can be wrong is refused with its own reason.
func TestVerifyReasons(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	v := verifier(t, fileKeys(t, is), is)
	good := is.Claims("alice", aud, time.Hour)
	with := func(k string, val any) map[string]any {
		c := map[string]any{}
		for kk, vv := range good {
			c[kk] = vv
		}
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte(strings.Repeat("k", 32))},
		(&jose.SignerOptions{}).WithHeader("kid", "RS256"))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(good)
	hsJWS, _ := hs.Sign(payload)
	hsTok, _ := hsJWS.CompactSerialize()
	now := time.Now()
	for _, alg := range []string{"RS256", "ES256", "EdDSA"} {
		c, err := v.Verify(is.Mint(t, alg, good))
		if err != nil || c.Subject != "alice" || c.Extra["sub"] != "alice" {
			t.Fatalf("%s: %v %+v", alg, err, c)
		}
	}
	cases := []struct {
		name  string
		token string
		want  Reason
	}{
		{"not a JWT", "abc", Malformed},
		{"alg none", unsigned(good), AlgorithmNotAllowed},
		{"HS256 with a public key id", hsTok, AlgorithmNotAllowed},
		{"signed by another key under a known id", testenv.MintJWT(t, otherKey, "ES256", "ES256", good), BadSignature},
		{"key id not in the set", testenv.MintJWT(t, otherKey, "ES256", "nope", good), UnknownKey},
		{"key of another algorithm", testenv.MintJWT(t, is.Keys["ES256"], "ES256", "RS256", good), AlgorithmNotAllowed},
		{"wrong audience", is.Mint(t, "ES256", with("aud", "someone-else")), WrongAudience},
		{"wrong issuer", is.Mint(t, "ES256", with("iss", "https://evil.test")), WrongIssuer},
		{"expired", is.Mint(t, "ES256", with("exp", now.Add(-2*time.Minute).Unix())), Expired},
		{"not yet valid", is.Mint(t, "ES256", with("nbf", now.Add(5*time.Minute).Unix())), NotYetValid},
		{"no expiry", is.Mint(t, "ES256", with("exp", nil)), NoExpiry},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(tc.token)
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if got := ReasonOf(err); got != tc.want {
				t.Fatalf("reason %s, want %s (%v)", got, tc.want, err)
			}
		})
	}
	// Within the leeway an expired token still passes.
	if _, err := v.Verify(is.Mint(t, "ES256", with("exp", now.Add(-5*time.Second).Unix()))); err != nil {
		t.Fatalf("5 s past exp, within the leeway: %v", err)
	}
}

// TestKeySetRefreshFailureRefuses: keys never read, and keys whose refresh
// has failed for longer than MaxStale, refuse every token; a failed
// refresh within MaxStale keeps the last keys.
func TestKeySetRefreshFailureRefuses(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	clk := testenv.NewClock(time.Now())
	ks, err := NewKeySet(KeySetOptions{URL: is.JWKSURL, Refresh: time.Minute, MaxStale: 10 * time.Minute,
		HTTPClient: is.TLS.Client(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	v := verifier(t, ks, is)
	tok := is.Mint(t, "RS256", is.Claims("alice", aud, 24*time.Hour))
	if _, err := v.Verify(tok); ReasonOf(err) != KeysUnavailable {
		t.Fatalf("before any fetch: %v, want %s", err, KeysUnavailable)
	}
	is.SetFailing(true)
	if err := ks.Refresh(context.Background()); err == nil {
		t.Fatal("a 503 from the JWKS endpoint was taken for keys")
	}
	if _, err := v.Verify(tok); ReasonOf(err) != KeysUnavailable {
		t.Fatalf("first fetch failed: %v, want %s", err, KeysUnavailable)
	}
	is.SetFailing(false)
	if err := ks.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("with fresh keys: %v", err)
	}
	is.SetFailing(true)
	clk.Add(5 * time.Minute)
	if err := ks.Refresh(context.Background()); err == nil {
		t.Fatal("refresh should fail")
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("refresh failed 5 min after the last good one (max stale 10 min): %v", err)
	}
	clk.Add(6 * time.Minute)
	if err := ks.Refresh(context.Background()); err == nil {
		t.Fatal("refresh should fail")
	}
	if _, err := v.Verify(tok); ReasonOf(err) != KeysUnavailable {
		t.Fatalf("keys 11 min old with every refresh failing: %v, want %s", err, KeysUnavailable)
	}
	is.SetFailing(false)
	if err := ks.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("keys back: %v", err)
	}
}

// TestKeySetUnknownKeyRefreshes: a token naming a key id the set lacks is
// refused, and asks Run for a refresh that picks up a rotated key.
func TestKeySetUnknownKeyRefreshes(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	dir := t.TempDir()
	file := filepath.Join(dir, "jwks.json")
	var set jose.JSONWebKeySet
	set.Keys = []jose.JSONWebKey{{Key: is.Keys["RS256"].Public(), KeyID: "RS256", Algorithm: "RS256", Use: "sig"}}
	b, _ := json.Marshal(set)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The clock moves past minKick once the key is rotated in: the
	// unknown key id before the rotation spent the refresh it may ask for.
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	ks, err := NewKeySet(KeySetOptions{File: file, Refresh: time.Hour, MaxStale: 2 * time.Hour, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ks.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	v := verifier(t, ks, is)
	tok := is.Mint(t, "ES256", is.Claims("alice", aud, time.Hour))
	if _, err := v.Verify(tok); ReasonOf(err) != UnknownKey {
		t.Fatalf("key not yet published: %v", err)
	}
	// The issuer rotates in its ES256 key.
	if err := os.Rename(is.JWKSFile, file); err != nil {
		t.Fatal(err)
	}
	skew.Store(int64(minKick + time.Second))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := v.Verify(tok); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the rotated key was never picked up")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewKeySetAndVerifierRefuse(t *testing.T) {
	for name, o := range map[string]KeySetOptions{
		"neither":       {},
		"both":          {File: "x", URL: "https://x"},
		"plain http":    {URL: "http://issuer.test/jwks"},
		"stale < fresh": {File: "x", Refresh: time.Hour, MaxStale: time.Minute},
	} {
		if _, err := NewKeySet(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ks, _ := NewKeySet(KeySetOptions{File: "x"})
	for _, algs := range [][]string{{"HS256"}, {"none"}, {"RS256", "HS512"}} {
		if _, err := NewVerifier(Options{Issuer: "i", Audience: "a", Keys: ks, Algorithms: algs}); err == nil {
			t.Errorf("algorithms %v accepted", algs)
		}
	}
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: priv, KeyID: "k"}}})
	if _, err := parseKeys(b); err == nil || !strings.Contains(err.Error(), "private") {
		t.Errorf("a JWKS with a private key: %v", err)
	}
}

// TestKeySetCacheControl: a JWKS URL is read again when its response's
// Cache-Control says it is stale (max-age less Age; at once with no-cache,
// no-store or a max-age that cannot be read), never sooner than
// minRefresh after the last read and never later than Refresh; a response
// that says none of these is read again every Refresh. A short max-age
// does not shorten MaxStale: keys past it stay in use while the issuer
// cannot be reached.
func TestKeySetCacheControl(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	jwks, err := os.ReadFile(is.JWKSFile)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	header := http.Header{}
	failing := false
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		maps.Copy(w.Header(), header)
		_, _ = w.Write(jwks)
	}))
	defer srv.Close()
	serve := func(h ...string) {
		mu.Lock()
		defer mu.Unlock()
		header = http.Header{}
		for i := 0; i < len(h); i += 2 {
			header.Add(h[i], h[i+1])
		}
	}
	clk := testenv.NewClock(time.Now())
	const refresh = 10 * time.Minute
	ks, err := NewKeySet(KeySetOptions{URL: srv.URL, Refresh: refresh, MaxStale: 30 * time.Minute, HTTPClient: srv.Client(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if w := ks.wait(); w != 0 {
		t.Fatalf("never read: due in %s, want at once", w)
	}
	cases := []struct {
		name   string
		header []string
		want   time.Duration
	}{
		{"no Cache-Control", nil, refresh},
		{"says nothing of freshness", []string{"Cache-Control", "public, must-revalidate"}, refresh},
		{"max-age", []string{"Cache-Control", "public, max-age=120"}, 2 * time.Minute},
		{"max-age quoted, other case", []string{"Cache-Control", `Max-Age="90"`}, 90 * time.Second},
		{"max-age less Age", []string{"Cache-Control", "max-age=120", "Age", "50"}, 70 * time.Second},
		{"Age past max-age", []string{"Cache-Control", "max-age=120", "Age", "500"}, minRefresh},
		{"max-age below the floor", []string{"Cache-Control", "max-age=5"}, minRefresh},
		{"max-age=0", []string{"Cache-Control", "max-age=0"}, minRefresh},
		{"max-age beyond Refresh", []string{"Cache-Control", "max-age=86400"}, refresh},
		{"max-age too large to read", []string{"Cache-Control", "max-age=99999999999999999999999"}, refresh},
		{"max-age unreadable", []string{"Cache-Control", "max-age=soon"}, minRefresh},
		{"max-age negative", []string{"Cache-Control", "max-age=-60"}, minRefresh},
		{"no-cache", []string{"Cache-Control", "no-cache"}, minRefresh},
		{"no-store beside a max-age", []string{"Cache-Control", "max-age=600", "Cache-Control", "no-store"}, minRefresh},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			serve(tc.header...)
			if err := ks.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if w := ks.wait(); w != tc.want {
				t.Fatalf("due in %s, want %s", w, tc.want)
			}
		})
	}

	// The clock runs down the time left; past it the keys are due at once.
	serve("Cache-Control", "max-age=120")
	if err := ks.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Add(50 * time.Second)
	if w := ks.wait(); w != 70*time.Second {
		t.Fatalf("50 s after a max-age=120 read: due in %s, want 70s", w)
	}
	clk.Add(100 * time.Second)
	if w := ks.wait(); w != 0 {
		t.Fatalf("past max-age: due in %s, want at once", w)
	}

	// Stale by max-age, but within MaxStale: the keys stay in use while
	// the issuer cannot be reached.
	v := verifier(t, ks, is)
	tok := is.Mint(t, "ES256", is.Claims("alice", aud, 24*time.Hour))
	mu.Lock()
	failing = true
	mu.Unlock()
	clk.Add(20 * time.Minute)
	if err := ks.Refresh(context.Background()); err == nil {
		t.Fatal("a 503 was taken for keys")
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("keys 22 min old, max-age 2 min, max stale 30 min: %v", err)
	}
	clk.Add(10 * time.Minute)
	if _, err := v.Verify(tok); ReasonOf(err) != KeysUnavailable {
		t.Fatalf("keys 32 min old, max stale 30 min: %v, want %s", err, KeysUnavailable)
	}
}

// TestKeySetRunReadsAtOnce: a refresher started on a set never read reads
// it at once, not a Refresh later (a gateway whose first read failed
// refuses every JWT until then).
func TestKeySetRunReadsAtOnce(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	ks, err := NewKeySet(KeySetOptions{URL: is.JWKSURL, Refresh: time.Hour, MaxStale: 2 * time.Hour, HTTPClient: is.TLS.Client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ks.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	v := verifier(t, ks, is)
	tok := is.Mint(t, "RS256", is.Claims("alice", aud, time.Hour))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := v.Verify(tok)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refresher did not read the keys: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := is.Served(); n != 1 {
		t.Fatalf("JWKS served %d times, want 1", n)
	}
}

// TestVerifyNoKeyID: a token whose header names no key id is verified by
// the one key of the set usable for its algorithm (the key's alg, else its
// type and curve), with or without an id of its own; with no such key, or
// several, it is refused as unknown_key, saying which. A key without an id
// never verifies a token that names one.
func TestVerifyNoKeyID(t *testing.T) {
	is := testenv.NewIssuer(t, t.TempDir())
	es2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	claims := is.Claims("alice", aud, time.Hour)
	rsaKey, esKey, edKey := is.Keys["RS256"], is.Keys["ES256"], is.Keys["EdDSA"]
	jwk := func(k crypto.Signer, id, alg string) jose.JSONWebKey {
		return jose.JSONWebKey{Key: k.Public(), KeyID: id, Algorithm: alg, Use: "sig"}
	}
	cases := []struct {
		name  string
		keys  []jose.JSONWebKey
		token string
		want  Reason // "" = accepted
		says  string
	}{
		{"one key", []jose.JSONWebKey{jwk(rsaKey, "k1", "RS256")}, testenv.MintJWT(t, rsaKey, "RS256", "", claims), "", ""},
		{"one key per algorithm", []jose.JSONWebKey{jwk(rsaKey, "RS256", "RS256"), jwk(esKey, "ES256", "ES256"), jwk(edKey, "EdDSA", "EdDSA")},
			testenv.MintJWT(t, esKey, "ES256", "", claims), "", ""},
		{"one key, no alg, no id", []jose.JSONWebKey{jwk(edKey, "", "")}, testenv.MintJWT(t, edKey, "EdDSA", "", claims), "", ""},
		{"an EC key of another curve beside", []jose.JSONWebKey{jwk(esKey, "a", ""), jwk(p384, "b", "")}, testenv.MintJWT(t, esKey, "ES256", "", claims), "", ""},
		{"signed by another key", []jose.JSONWebKey{jwk(esKey, "a", "ES256")}, testenv.MintJWT(t, es2, "ES256", "", claims), BadSignature, ""},
		{"no key for its algorithm", []jose.JSONWebKey{jwk(rsaKey, "k1", "RS256")}, testenv.MintJWT(t, esKey, "ES256", "", claims), UnknownKey,
			"no key id (kid), and the JWKS holds no key for ES256"},
		{"no key of its curve", []jose.JSONWebKey{jwk(p384, "k1", "")}, testenv.MintJWT(t, esKey, "ES256", "", claims), UnknownKey, "no key for ES256"},
		{"two keys for its algorithm", []jose.JSONWebKey{jwk(esKey, "a", "ES256"), jwk(es2, "b", "")}, testenv.MintJWT(t, esKey, "ES256", "", claims), UnknownKey,
			"holds 2 keys for ES256: a kid must say which"},
		{"a key without an id, a token naming one", []jose.JSONWebKey{jwk(esKey, "", "ES256")}, testenv.MintJWT(t, esKey, "ES256", "a", claims), UnknownKey,
			`key id "a" is not in the JWKS`},
	}
	if h, _, _ := strings.Cut(cases[0].token, "."); strings.Contains(decode(t, h), "kid") {
		t.Fatalf("the token's header names a key id: %s", decode(t, h))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "jwks.json")
			b, _ := json.Marshal(jose.JSONWebKeySet{Keys: tc.keys})
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
			ks, err := NewKeySet(KeySetOptions{File: file})
			if err != nil {
				t.Fatal(err)
			}
			if err := ks.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			c, err := verifier(t, ks, is).Verify(tc.token)
			switch {
			case tc.want == "" && (err != nil || c.Subject != "alice"):
				t.Fatalf("refused: %v", err)
			case tc.want != "" && ReasonOf(err) != tc.want:
				t.Fatalf("%v, want %s", err, tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.says):
				t.Fatalf("%v, want it to say %q", err, tc.says)
			}
		})
	}
}

func decode(t *testing.T, b64 string) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
