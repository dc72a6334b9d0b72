package jwtauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
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

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

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
	clk := &clock{t: time.Now()}
	ks, err := NewKeySet(KeySetOptions{URL: is.JWKSURL, Refresh: time.Minute, MaxStale: 10 * time.Minute,
		HTTPClient: is.TLS.Client(), Now: clk.now})
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
	clk.add(5 * time.Minute)
	if err := ks.Refresh(context.Background()); err == nil {
		t.Fatal("refresh should fail")
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("refresh failed 5 min after the last good one (max stale 10 min): %v", err)
	}
	clk.add(6 * time.Minute)
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
