// Command benchcreds writes the credentials `bash scripts/bench.sh gateway`
// needs to run talos-mcp-gateway in HTTP mode with TLS and JWT, into DIR:
//
//	ca.pem, server.pem, server.key  a self-signed CA (ECDSA P-256) and a
//	                                server certificate it signed for
//	                                127.0.0.1, ::1 and localhost (1 day)
//	jwks.json                       an issuer's public key (ES256, kid
//	                                bench-es256), for --jwks-file
//	token.jwt                       a JWT that key signed: -issuer,
//	                                -audience, sub -subject, exp in 1 h
//	static.token                    a random static bearer token
//	principals.json                 one principal, reached by either token
//	                                (token_sha256 of static.token, and
//	                                jwt_subject = the JWT's sub), calling
//	                                with -capability and -agent-key
//
// Usage: go run ./scripts/benchcreds [-issuer I] [-audience A] [-subject S]
// -capability FILE -agent-key FILE DIR. For benchmarks and local trials
// only: the keys are written unencrypted and the CA signs nothing else.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

const keyID = "bench-es256"

type options struct {
	dir, issuer, audience, subject, capability, agentKey string
}

func main() {
	var o options
	flag.StringVar(&o.issuer, "issuer", "https://bench-issuer.talos.test", "the JWT's iss (the gateway's --jwt-issuer)")
	flag.StringVar(&o.audience, "audience", "talos-mcp-gateway", "the JWT's aud (the gateway's --jwt-audience)")
	flag.StringVar(&o.subject, "subject", "bench-agent", "the JWT's sub, and the principal's jwt_subject")
	flag.StringVar(&o.capability, "capability", "", "the principal's capability chain (talosctl cap issue)")
	flag.StringVar(&o.agentKey, "agent-key", "", "the chain holder's key (.key)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: benchcreds [flags] -capability FILE -agent-key FILE DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || o.capability == "" || o.agentKey == "" {
		flag.Usage()
		os.Exit(2)
	}
	o.dir = flag.Arg(0)
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchcreds:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return err
	}
	if err := writeTLS(o.dir); err != nil {
		return err
	}
	if err := writeJWT(o); err != nil {
		return err
	}
	return writePrincipals(o)
}

// writeTLS writes a CA and a server certificate it signed for loopback.
func writeTLS(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "talos bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return err
	}
	return errors.Join(
		writePEM(filepath.Join(dir, "ca.pem"), "CERTIFICATE", caDER),
		writePEM(filepath.Join(dir, "server.pem"), "CERTIFICATE", leafDER),
		writePEM(filepath.Join(dir, "server.key"), "PRIVATE KEY", keyDER))
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// writeJWT writes an issuer's JWKS (one ES256 key) and a token it signed.
func writeJWT(o options) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: keyID, Algorithm: string(jose.ES256), Use: "sig"}}}
	jwks, err := json.Marshal(set)
	if err != nil {
		return err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", keyID))
	if err != nil {
		return err
	}
	now := time.Now()
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: o.issuer, Audience: jwt.Audience{o.audience}, Subject: o.subject,
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}).Serialize()
	if err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(filepath.Join(o.dir, "jwks.json"), jwks, 0o600),
		os.WriteFile(filepath.Join(o.dir, "token.jwt"), []byte(tok), 0o600))
}

// writePrincipals writes a random static token and the one principal it
// and the JWT's subject reach.
func writePrincipals(o options) error {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return err
	}
	static := hex.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(static))
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			return p
		}
		return a
	}
	b, err := json.MarshalIndent(map[string]any{"principals": []map[string]string{{
		"name": "bench", "token_sha256": hex.EncodeToString(sum[:]), "jwt_subject": o.subject,
		"capability": abs(o.capability), "agent_key": abs(o.agentKey),
	}}}, "", "  ")
	if err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(filepath.Join(o.dir, "static.token"), []byte(static), 0o600),
		os.WriteFile(filepath.Join(o.dir, "principals.json"), append(b, '\n'), 0o600))
}
