package natstls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// read returns the contents of every file of f.
func read(t *testing.T, f Files) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, p := range []string{f.CA, f.CAKey, f.Cert, f.Key} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(p)] = b
	}
	return out
}

// leaf parses f's server certificate and checks it chains to f's CA.
func leaf(t *testing.T, f Files) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	ca, err := readCert(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: c.NotBefore.Add(2 * time.Hour), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("server certificate is not a TLS client certificate of the CA (cluster routes need it): %v", err)
	}
	return c
}

// TestEnsureOnceAndReuse: the first Ensure writes a CA and a server
// certificate (keys 0600) naming the loopback names and the hosts; a second
// reuses every byte; a new host or a certificate near its expiry gets a new
// server certificate from the same CA.
func TestEnsureOnceAndReuse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats-tls")
	now := time.Now()
	f, err := ensureAt(dir, []string{"nats1", "10.0.0.7"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if f != Layout(dir) {
		t.Fatalf("Ensure returned %+v, want %+v", f, Layout(dir))
	}
	for p, mode := range map[string]os.FileMode{f.CA: 0o644, f.Cert: 0o644, f.CAKey: 0o600, f.Key: 0o600} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", p, st.Mode().Perm(), err, mode)
		}
	}
	c := leaf(t, f)
	for _, h := range []string{"localhost", "127.0.0.1", "::1", "nats1", "10.0.0.7"} {
		if err := c.VerifyHostname(h); err != nil {
			t.Errorf("certificate does not name %s: %v", h, err)
		}
	}
	if c.VerifyHostname("nats2") == nil {
		t.Error("certificate names a host it was not given")
	}
	first := read(t, f)

	if _, err := ensureAt(dir, []string{"nats1"}, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for name, b := range read(t, f) {
		if !bytes.Equal(b, first[name]) {
			t.Errorf("a second Ensure rewrote %s", name)
		}
	}

	// A host the certificate lacks: new server certificate, same CA.
	if _, err := ensureAt(dir, []string{"nats2"}, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	second := read(t, f)
	if !bytes.Equal(second[CAFile], first[CAFile]) || !bytes.Equal(second[CAKeyFile], first[CAKeyFile]) {
		t.Error("a new host replaced the CA")
	}
	if bytes.Equal(second[CertFile], first[CertFile]) || bytes.Equal(second[KeyFile], first[KeyFile]) {
		t.Error("a new host did not reissue the server certificate")
	}
	if leaf(t, f).VerifyHostname("nats2") != nil {
		t.Error("reissued certificate does not name nats2")
	}

	// Near its expiry: reissued at the next start.
	late := leaf(t, f).NotAfter.Add(-renewBefore / 2)
	if _, err := ensureAt(dir, []string{"nats2"}, late); err != nil {
		t.Fatal(err)
	}
	if c := leaf(t, f); !c.NotAfter.After(late.Add(renewBefore)) {
		t.Errorf("certificate near expiry not renewed: not after %v", c.NotAfter)
	}
	if third := read(t, f); !bytes.Equal(third[CAFile], first[CAFile]) || bytes.Equal(third[CertFile], second[CertFile]) {
		t.Error("renewal must keep the CA and replace the server certificate")
	}
}

// TestEnsureRefusesOrphanCA: a CA certificate whose key is gone is an
// error, not silently replaced (clients may trust it); a key whose
// certificate was never written is a creation cut short, and replaced.
func TestEnsureRefusesOrphanCA(t *testing.T) {
	dir := t.TempDir()
	f, err := Ensure(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(f.CA)
	if err := os.Remove(f.CAKey); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(dir, nil); err == nil || !strings.Contains(err.Error(), "without its key") {
		t.Fatalf("Ensure with a CA and no key: %v", err)
	}
	if b, _ := os.ReadFile(f.CA); !bytes.Equal(b, ca) {
		t.Fatal("the orphan CA was overwritten")
	}

	dir = t.TempDir()
	f = Layout(dir)
	if err := os.WriteFile(f.CAKey, []byte("left over"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(dir, nil); err != nil {
		t.Fatalf("Ensure after a creation cut short: %v", err)
	}
	leaf(t, f)
}

// TestServerConfig: the operator's certificate, or the generated one;
// a certificate without its key is a settings error.
func TestServerConfig(t *testing.T) {
	own := Layout(t.TempDir())
	if _, err := Ensure(filepath.Dir(own.CA), nil); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "gen")
	cases := []struct {
		name    string
		s       Server
		listen  string
		ca      string
		wantErr error
	}{
		{"operator's", Server{CertFile: own.Cert, KeyFile: own.Key, Dir: dir}, "127.0.0.1", "", nil},
		{"generated", Server{Dir: dir, Hosts: []string{"talos.example"}}, "192.0.2.1", Layout(dir).CA, nil},
		{"cert without key", Server{CertFile: own.Cert, Dir: dir}, "", "", ErrConfig},
		{"nothing", Server{}, "", "", ErrConfig},
	}
	for _, c := range cases {
		cfg, err := c.s.Config(c.listen)
		if !errors.Is(err, c.wantErr) || (c.wantErr == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.wantErr)
			continue
		}
		if got := c.s.CA(); got != c.ca {
			t.Errorf("%s: CA %q, want %q", c.name, got, c.ca)
		}
		if err != nil {
			continue
		}
		if len(cfg.Certificates) != 1 || cfg.MinVersion < tls.VersionTLS12 {
			t.Errorf("%s: config %+v", c.name, cfg)
		}
	}
	gen := leaf(t, Layout(dir))
	for _, h := range []string{"talos.example", "192.0.2.1"} {
		if gen.VerifyHostname(h) != nil {
			t.Errorf("generated certificate does not name %s", h)
		}
	}
	// An unspecified listen address is no name.
	if got := (&Server{}).hosts("0.0.0.0"); len(got) != 0 {
		t.Errorf("hosts(0.0.0.0) = %v", got)
	}
}

// TestFlags: talosd's flags map to the server and to the CA its own
// clients trust.
func TestFlags(t *testing.T) {
	gen := Flags{NatsTLSHosts: []string{"h"}}
	if s := gen.Server("/data"); s.Dir != "/data/nats-tls" || s.CertFile != "" || s.Hosts[0] != "h" {
		t.Errorf("Server: %+v", s)
	}
	if got := gen.EmbeddedCA("/data"); got != "/data/nats-tls/ca.pem" {
		t.Errorf("EmbeddedCA generated: %q", got)
	}
	own := Flags{NatsTLSCert: "c.pem", NatsTLSKey: "c.key"}
	if got := own.EmbeddedCA("/data"); got != "" {
		t.Errorf("EmbeddedCA of the operator's certificate without --nats-ca: %q", got)
	}
	own.NatsCA = "corp-ca.pem"
	if got := own.EmbeddedCA("/data"); got != "corp-ca.pem" {
		t.Errorf("EmbeddedCA with --nats-ca: %q", got)
	}
}
