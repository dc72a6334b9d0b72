package natstls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"slices"
	"time"

	"github.com/talos-audit/talos/ingest/natsauth"
)

// Ensure returns the files of the generated directory dir after creating
// what is missing: a CA, once, and a server certificate from it naming
// localhost, 127.0.0.1, ::1 and hosts. Existing files are reused; the
// server certificate alone is reissued, by the same CA, when it does not
// name every host, no longer matches its key or the CA, or expires within
// 90 days. A CA certificate without its key is an error (nothing is
// overwritten that clients may already trust).
func Ensure(dir string, hosts []string) (Files, error) {
	return ensureAt(dir, hosts, time.Now())
}

func ensureAt(dir string, hosts []string, now time.Time) (Files, error) {
	f := Layout(dir)
	ca, caKey, err := loadOrCreateCA(f, now)
	if err != nil {
		return Files{}, fmt.Errorf("NATS TLS CA in %s: %w", dir, err)
	}
	names := append([]string{"localhost", "127.0.0.1", "::1"}, hosts...)
	if serverCertOK(f, ca, names, now) {
		return f, nil
	}
	if err := issueServer(f, ca, caKey, names, now); err != nil {
		return Files{}, fmt.Errorf("NATS TLS server certificate in %s: %w", dir, err)
	}
	return f, nil
}

// loadOrCreateCA reads the CA of f, creating it when neither file exists.
// The key is written before the certificate, so a CA certificate always
// has its key.
func loadOrCreateCA(f Files, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	_, certErr := os.Stat(f.CA)
	_, keyErr := os.Stat(f.CAKey)
	switch {
	case certErr == nil && keyErr == nil:
		cert, err := readCert(f.CA)
		if err != nil {
			return nil, nil, err
		}
		key, err := readKey(f.CAKey)
		if err != nil {
			return nil, nil, err
		}
		if !publicKeyEqual(cert.PublicKey, key.Public()) {
			return nil, nil, fmt.Errorf("%s does not belong to %s", f.CAKey, f.CA)
		}
		return cert, key, nil
	case certErr == nil && errors.Is(keyErr, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("%s exists without its key %s: restore the key, or remove the CA to generate a new one (every client must then trust the new ca.pem)", f.CA, f.CAKey)
	case certErr != nil && !errors.Is(certErr, fs.ErrNotExist):
		return nil, nil, certErr
	case keyErr != nil && !errors.Is(keyErr, fs.ErrNotExist):
		return nil, nil, keyErr
	}
	// No certificate: a key alone is left from a creation cut short.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "Talos NATS CA " + now.UTC().Format("2006-01-02T15:04:05Z")},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	cert, err := sign(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(f.CAKey, key); err != nil {
		return nil, nil, err
	}
	if err := writeCert(f.CA, cert); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// serverCertOK reports whether f's server certificate can be reused: it
// matches its key, chains to ca for TLS servers and clients, names every
// one of names, and has more than renewBefore left.
func serverCertOK(f Files, ca *x509.Certificate, names []string, now time.Time) bool {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || leaf.NotAfter.Sub(now) < renewBefore {
		return false
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return false
		}
	}
	for _, n := range names {
		if leaf.VerifyHostname(n) != nil {
			return false
		}
	}
	return true
}

// issueServer writes a new server key and a certificate for names signed
// by ca.
func issueServer(f Files, ca *x509.Certificate, caKey crypto.Signer, names []string, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "talos-nats"},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(serverValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.After(ca.NotAfter) {
		tmpl.NotAfter = ca.NotAfter
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			if !slices.ContainsFunc(tmpl.IPAddresses, ip.Equal) {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if !slices.Contains(tmpl.DNSNames, n) {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	cert, err := sign(tmpl, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	if err := writeKey(f.Key, key); err != nil {
		return err
	}
	return writeCert(f.Cert, cert)
}

// sign makes the certificate tmpl, with a random serial number, signed by
// parent's key.
func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, parentKey crypto.Signer) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cert, nil
}

func readKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PEM private key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", path)
	}
	return s, nil
}

func publicKeyEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

// writeKey writes key as PKCS #8 PEM, mode 0600, atomically.
func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return natsauth.WriteSecret(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), false)
}

// writeCert writes cert as PEM, atomically, readable by all (mode 0644):
// clients of other users read ca.pem.
func writeCert(path string, cert *x509.Certificate) error {
	if err := natsauth.WriteSecret(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), false); err != nil {
		return err
	}
	return os.Chmod(path, 0o644)
}
