package gateway

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talos-audit/talos/testenv"
)

// TestCertRotation: the HTTPS listener's certificate follows its files.
// A new handshake gets a renewed pair once the check interval has passed
// (not before); a renewal that cannot be used (a key that does not match,
// a key file that is not PEM, a missing file) is logged once each, never
// with key material, and the last good pair stays served; a good pair
// written after it is served; a bad pair at start is an error.
func TestCertRotation(t *testing.T) {
	dir := t.TempDir()
	first := testenv.NewTLSFiles(t, dir)
	second := testenv.NewTLSFiles(t, t.TempDir())
	third := testenv.NewTLSFiles(t, t.TempDir())
	var logs testenv.SyncBuffer
	clk := testenv.NewClock(time.Now())
	cf, err := newCertFiles(first.CertFile, first.KeyFile, certCheckEvery, clk.Now, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: cf.get, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	})
	roots := x509.NewCertPool()
	var keys [][]byte
	for _, f := range []*testenv.TLSFiles{first, second, third} {
		roots.AppendCertsFromPEM(mustRead(t, f.CAFile))
		keys = append(keys, mustRead(t, f.KeyFile))
	}
	served := func() []byte {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Raw
	}
	expect := func(what string, want *testenv.TLSFiles) {
		t.Helper()
		if !bytes.Equal(served(), want.Cert.Certificate[0]) {
			t.Fatalf("%s: another certificate was served", what)
		}
	}
	write := func(cert, key *testenv.TLSFiles) {
		t.Helper()
		if cert != nil {
			writeFileAtomic(t, first.CertFile, mustRead(t, cert.CertFile))
		}
		if key != nil {
			writeFileAtomic(t, first.KeyFile, mustRead(t, key.KeyFile))
		}
	}

	expect("at start", first)
	write(second, second)
	expect("renewed within the check interval", first)
	clk.Add(certCheckEvery)
	expect("renewed, interval passed", second)
	if n := strings.Count(logs.String(), "TLS certificate reloaded"); n != 1 {
		t.Fatalf("%d reloads logged, want 1:\n%s", n, logs.String())
	}

	// Bad renewals keep the last good pair, each logged once.
	write(third, nil) // the key is not (yet) the certificate's
	for range 3 {
		clk.Add(certCheckEvery)
		expect("a certificate whose key is not written yet", second)
	}
	if err := os.WriteFile(first.KeyFile, []byte("-----BEGIN PRIVATE KEY-----\nnot a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clk.Add(certCheckEvery)
	expect("a key file that is not PEM", second)
	if err := os.Remove(first.KeyFile); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		clk.Add(certCheckEvery)
		expect("a key file removed", second)
	}
	if n := strings.Count(logs.String(), "cannot be used"); n != 3 {
		t.Fatalf("%d refused renewals logged, want 3 (one per distinct bad pair):\n%s", n, logs.String())
	}
	for _, key := range keys {
		if strings.Contains(logs.String(), string(key[30:60])) {
			t.Fatal("key material in the log")
		}
	}
	if !strings.Contains(logs.String(), "private key does not match public key") {
		t.Fatalf("the mismatch is not named:\n%s", logs.String())
	}

	write(nil, third)
	clk.Add(certCheckEvery)
	expect("the renewal completed", third)

	// At start, a bad pair is an error, not a certificate served later.
	if _, err := LoadTLS(second.CertFile, third.KeyFile, nil); err == nil || !strings.Contains(err.Error(), "--tls-cert/--tls-key") {
		t.Fatalf("a mismatched pair at start: %v", err)
	}
	if _, err := LoadTLS(second.CertFile, filepath.Join(dir, "none.key"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing key at start: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFileAtomic replaces path by b, as a renewal tool does.
func writeFileAtomic(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
