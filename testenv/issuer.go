package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// TLSFiles is a test certificate authority and a server certificate it
// signed for 127.0.0.1, ::1 and localhost, as PEM files.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
	Pool                      *x509.CertPool // holds the CA
	Cert                      tls.Certificate
}

// NewTLSFiles writes a fresh CA and server certificate under dir.
func NewTLSFiles(t testing.TB, dir string) *TLSFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "talos test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	f := &TLSFiles{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server.key"),
		Pool: x509.NewCertPool()}
	f.Pool.AddCert(caCert)
	writePEM(t, f.CAFile, "CERTIFICATE", caDER)
	writePEM(t, f.CertFile, "CERTIFICATE", leafDER)
	writePEM(t, f.KeyFile, "PRIVATE KEY", keyDER)
	if f.Cert, err = tls.LoadX509KeyPair(f.CertFile, f.KeyFile); err != nil {
		t.Fatal(err)
	}
	return f
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Client is an HTTP client that trusts only the test CA.
func (f *TLSFiles) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.Pool, MinVersion: tls.VersionTLS12}}}
}

// Issuer is a test identity provider: one signing key per algorithm
// (RS256, ES256, EdDSA; key id = the algorithm's name), their JWKS as a file
// and served over HTTPS by a certificate of TLS, and the tokens it mints.
type Issuer struct {
	Name     string // the iss of its tokens
	JWKSFile string
	JWKSURL  string
	TLS      *TLSFiles
	Keys     map[string]crypto.Signer // by algorithm
	failing  atomic.Bool
	served   atomic.Int64
}

// NewIssuer starts an issuer whose files live under dir; its HTTPS server
// stops when the test ends.
func NewIssuer(t testing.TB, dir string) *Issuer {
	t.Helper()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	is := &Issuer{Name: "https://issuer.talos.test", TLS: NewTLSFiles(t, dir), JWKSFile: filepath.Join(dir, "jwks.json"),
		Keys: map[string]crypto.Signer{"RS256": rsaKey, "ES256": ecKey, "EdDSA": edKey}}
	var set jose.JSONWebKeySet
	for alg, k := range is.Keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: alg, Algorithm: alg, Use: "sig"})
	}
	jwks, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(is.JWKSFile, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if is.failing.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		is.served.Add(1)
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(jwks)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{is.TLS.Cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	is.JWKSURL = srv.URL + "/.well-known/jwks.json"
	return is
}

// SetFailing makes the JWKS endpoint answer 503 (true) or serve the keys.
func (is *Issuer) SetFailing(f bool) { is.failing.Store(f) }

// Served is how many times the JWKS endpoint served the keys.
func (is *Issuer) Served() int64 { return is.served.Load() }

// Claims are a token's usual claims for sub and aud, valid for ttl from now.
func (is *Issuer) Claims(sub, aud string, ttl time.Duration) map[string]any {
	now := time.Now()
	return map[string]any{"iss": is.Name, "sub": sub, "aud": aud, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(ttl).Unix()}
}

// Mint signs claims with the issuer's key for alg.
func (is *Issuer) Mint(t testing.TB, alg string, claims map[string]any) string {
	t.Helper()
	return MintJWT(t, is.Keys[alg], alg, alg, claims)
}

// MintJWT signs claims with key as a compact JWT whose header names alg
// and kid, or no kid if kid is "" (a test may sign with a key the issuer
// does not hold).
func MintJWT(t testing.TB, key crypto.Signer, alg, kid string, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.SignatureAlgorithm(alg), Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
