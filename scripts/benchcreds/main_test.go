package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/jwtauth"
)

// What benchcreds writes is what the gateway accepts: the certificate
// chains to the CA for 127.0.0.1, the JWT verifies against the JWKS with
// the gateway's own verifier, and the principal is reached by both tokens.
func TestRun(t *testing.T) {
	o := options{dir: filepath.Join(t.TempDir(), "creds"), issuer: "https://iss.test", audience: "gw", subject: "agent-1",
		capability: "cap.json", agentKey: "agent.key"}
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(o.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(read("ca.pem")) {
		t.Fatal("ca.pem holds no certificate")
	}
	block, _ := pem.Decode(read("server.pem"))
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("server certificate for 127.0.0.1: %v", err)
	}

	keys, err := jwtauth.NewKeySet(jwtauth.KeySetOptions{File: filepath.Join(o.dir, "jwks.json")})
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, err := jwtauth.NewVerifier(jwtauth.Options{Issuer: o.issuer, Audience: o.audience, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(string(read("token.jwt")))
	if err != nil {
		t.Fatalf("the token does not verify: %v", err)
	}
	if c.Subject != o.subject || time.Until(c.Expiry) < 50*time.Minute || time.Until(c.Expiry) > time.Hour {
		t.Errorf("claims %+v: want sub %s, exp in about an hour", c, o.subject)
	}
	other, err := jwtauth.NewVerifier(jwtauth.Options{Issuer: o.issuer, Audience: "someone-else", Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Verify(string(read("token.jwt"))); jwtauth.ReasonOf(err) != jwtauth.WrongAudience {
		t.Errorf("another audience: %v, want %s", err, jwtauth.WrongAudience)
	}

	var f struct {
		Principals []map[string]string `json:"principals"`
	}
	if err := json.Unmarshal(read("principals.json"), &f); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(read("static.token"))
	if len(f.Principals) != 1 || f.Principals[0]["jwt_subject"] != o.subject ||
		f.Principals[0]["token_sha256"] != hex.EncodeToString(sum[:]) || !filepath.IsAbs(f.Principals[0]["capability"]) {
		t.Errorf("principals %v: want one, reached by the JWT's sub and the static token, with absolute paths", f.Principals)
	}
}
