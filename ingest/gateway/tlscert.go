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
	certPEM, keyPEM, sum, err := c.read()
	if err != nil {
		return nil, err
	}
	if c.current, err = parsePair(certPEM, keyPEM); err != nil {
		return nil, err
	}
	c.loaded, c.checked = sum, now()
	return c, nil
}

// read reads the pair, and a digest of what it read (or, when a file
// cannot be read, of why).
func (c *certFiles) read() (certPEM, keyPEM []byte, sum [sha256.Size]byte, err error) {
	if certPEM, err = os.ReadFile(c.certFile); err == nil {
		keyPEM, err = os.ReadFile(c.keyFile)
	}
	if err != nil {
		return nil, nil, sha256.Sum256([]byte(err.Error())), err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:", len(certPEM))
	h.Write(certPEM)
	h.Write(keyPEM)
	h.Sum(sum[:0])
	return certPEM, keyPEM, sum, nil
}

// parsePair is the certificate of a PEM pair, if its key is the
// certificate's.
func parsePair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err == nil && cert.Leaf == nil {
		cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
	}
	if err != nil {
		return nil, err
	}
	return &cert, nil
}

// get is tls.Config.GetCertificate: the current pair, read again first if
// the last read is certCheckEvery old; a pair is parsed only when its
// files' content changed.
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if now.Sub(c.checked) < c.every {
		return c.current, nil
	}
	c.checked = now
	certPEM, keyPEM, sum, err := c.read()
	if sum == c.loaded || sum == c.refused {
		return c.current, nil
	}
	var cert *tls.Certificate
	if err == nil {
		cert, err = parsePair(certPEM, keyPEM)
	}
	if err != nil {
		c.refused = sum
		c.log.Warn("TLS certificate files changed but cannot be used: the previous certificate is still served",
			"cert", c.certFile, "key", c.keyFile, "err", err)
		return c.current, nil
	}
	c.current, c.loaded, c.refused = cert, sum, [sha256.Size]byte{}
	c.log.Info("TLS certificate reloaded: new handshakes get it", "cert", c.certFile, "subject", cert.Leaf.Subject.String(),
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter.UTC())
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
