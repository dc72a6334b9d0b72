package gateway

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certCheckEvery is the least time between two reads of the certificate
// files: a handshake reads them again at most this often.
const certCheckEvery = 5 * time.Second

// certFiles serves the certificate of a pair of PEM files, a certificate
// (chain) and its key, and follows their renewal (by cert-manager, certbot
// or an operator) without a restart. At a handshake, at most every
// certCheckEvery, both files are read again; when either changed, the pair
// is loaded and served from then on. A changed pair that cannot be used
// (a file unreadable or half written, a key that does not match the
// certificate) is logged once, without key material, and the last good
// pair stays served until the files change again. It is safe for
// concurrent use; mu is held for a check, never across a handshake.
type certFiles struct {
	certFile, keyFile string
	every             time.Duration
	now               func() time.Time
	log               *slog.Logger

	mu      sync.Mutex
	current *tls.Certificate
	loaded  [sha256.Size]byte // the files' digest when current was loaded
	refused [sha256.Size]byte // the digest of the last pair refused
	checked time.Time
}

// newCertFiles loads the pair at once: a pair that cannot be used is an
// error here, never a certificate served later.
func newCertFiles(certFile, keyFile string, every time.Duration, now func() time.Time, log *slog.Logger) (*certFiles, error) {
	c := &certFiles{certFile: certFile, keyFile: keyFile, every: every, now: now, log: log}
	cert, sum, err := c.load()
	if err != nil {
		return nil, err
	}
	c.current, c.loaded, c.checked = cert, sum, now()
	return c, nil
}

// load reads and checks the pair, and digests what it read (or, when a
// file cannot be read, why).
func (c *certFiles) load() (*tls.Certificate, [sha256.Size]byte, error) {
	certPEM, err := os.ReadFile(c.certFile)
	if err == nil {
		var keyPEM []byte
		if keyPEM, err = os.ReadFile(c.keyFile); err == nil {
			return pair(certPEM, keyPEM)
		}
	}
	return nil, sha256.Sum256([]byte(err.Error())), err
}

func pair(certPEM, keyPEM []byte) (*tls.Certificate, [sha256.Size]byte, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%d:", len(certPEM))
	h.Write(certPEM)
	h.Write(keyPEM)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err == nil && cert.Leaf == nil {
		cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
	}
	if err != nil {
		return nil, sum, err
	}
	return &cert, sum, nil
}

// get is tls.Config.GetCertificate: the current pair, read again first if
// the last read is certCheckEvery old.
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if now.Sub(c.checked) < c.every {
		return c.current, nil
	}
	c.checked = now
	cert, sum, err := c.load()
	switch {
	case err == nil && sum == c.loaded:
	case err == nil:
		c.current, c.loaded, c.refused = cert, sum, [sha256.Size]byte{}
		c.log.Info("TLS certificate reloaded: new handshakes get it", "cert", c.certFile, "subject", cert.Leaf.Subject.String(),
			"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter.UTC())
	case sum != c.refused:
		c.refused = sum
		c.log.Warn("TLS certificate files changed but cannot be used: the previous certificate is still served",
			"cert", c.certFile, "key", c.keyFile, "err", err)
	}
	return c.current, nil
}

// LoadTLS is the server TLS configuration of a certificate (chain) and its
// key, PEM files: TLS 1.2 at least. A pair that cannot be used is an error
// now; once serving, a renewed pair written over the files is picked up
// within certCheckEvery, without a restart (certFiles), and a renewal that
// cannot be used is logged and leaves the last good pair served.
func LoadTLS(certFile, keyFile string, log *slog.Logger) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if log == nil {
		log = slog.Default()
	}
	c, err := newCertFiles(certFile, keyFile, certCheckEvery, time.Now, log)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return &tls.Config{GetCertificate: c.get, MinVersion: tls.VersionTLS12}, nil
}
