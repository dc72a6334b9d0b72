package chserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/xml"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestFindMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := find(nil)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	for _, want := range []string{"clickhouse-server not found", "sudo apt-get install -y clickhouse-server clickhouse-client"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestFindSingleBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "clickhouse")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	argv, err := find(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 2 || argv[0] != bin || argv[1] != "server" {
		t.Fatalf("argv = %q, want [%s server]", argv, bin)
	}
}

func TestStartBadBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "clickhouse-server")
	// A "server" that exits at once: the error must say so and show its output.
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho boom: cannot start >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Binary: bin, Dir: filepath.Join(dir, "data")})
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "boom: cannot start") {
		t.Fatalf("err = %v, want an early-exit error with the output tail", err)
	}
}

// TestUsersConfig: the users file is XML with the admin, the writer and the
// reader, their profiles, and allow_databases only when databases are named.
func TestUsersConfig(t *testing.T) {
	type user struct {
		XMLName   xml.Name
		Profile   string   `xml:"profile"`
		Databases []string `xml:"allow_databases>database"`
	}
	type usersDoc struct {
		Profiles struct {
			Writer struct {
				AllowDDL string `xml:"allow_ddl"`
			} `xml:"writer"`
			Reader struct {
				Readonly string `xml:"readonly"`
				AllowDDL string `xml:"allow_ddl"`
			} `xml:"reader"`
		} `xml:"profiles"`
		Users struct {
			List []user `xml:",any"`
		} `xml:"users"`
	}
	for _, dbs := range [][]string{nil, {"talos", "t<2>"}} {
		var doc usersDoc
		if err := xml.Unmarshal([]byte(usersConfig(dbs)), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Profiles.Writer.AllowDDL != "0" || doc.Profiles.Reader.Readonly != "2" || doc.Profiles.Reader.AllowDDL != "0" {
			t.Fatalf("profiles %+v", doc.Profiles)
		}
		got := map[string]user{}
		for _, u := range doc.Users.List {
			got[u.XMLName.Local] = u
		}
		want := map[string]string{AdminUser: "default", WriterUser: "writer", ReaderUser: "reader"}
		if len(got) != len(want) {
			t.Fatalf("users %v", got)
		}
		for name, profile := range want {
			u := got[name]
			limited := name != AdminUser && dbs != nil
			if u.Profile != profile || limited != (u.Databases != nil) || limited && !slices.Equal(u.Databases, dbs) {
				t.Errorf("databases %q: user %s = %+v", dbs, name, u)
			}
		}
	}
}

// TestWriteTLS: the server's certificate verifies for 127.0.0.1 and
// localhost against the CA, the client's as a client certificate.
func TestWriteTLS(t *testing.T) {
	f, err := writeTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	caPEM, _ := os.ReadFile(f.CA)
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}
	for _, tc := range []struct {
		cert, key, name string
		usage           x509.ExtKeyUsage
	}{
		{f.ServerCert, f.ServerKey, "127.0.0.1", x509.ExtKeyUsageServerAuth},
		{f.ServerCert, f.ServerKey, "localhost", x509.ExtKeyUsageServerAuth},
		{f.ClientCert, f.ClientKey, "", x509.ExtKeyUsageClientAuth},
	} {
		pair, err := tls.LoadX509KeyPair(tc.cert, tc.key)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: tc.name, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Errorf("%s for %q: %v", tc.cert, tc.name, err)
		}
	}
	if st, err := os.Stat(f.ServerKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("server key mode: %v %v", st.Mode(), err)
	}
}

// TestFreePorts: the ports are distinct, free, and outside the range the
// kernel hands out, so no outgoing connection can take one meanwhile.
func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(50)
	if err != nil {
		t.Fatal(err)
	}
	low := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range ports {
		if p >= low || p < 1024 || seen[p] {
			t.Fatalf("port %d: want distinct ports in [1024, %d)", p, low)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d not free: %v", p, err)
		}
		l.Close()
	}
	if len(ports) != 50 {
		t.Fatalf("%d ports, want 50", len(ports))
	}
}

// The server's environment keeps freed memory in jemalloc (MALLOC_CONF),
// unless the caller's environment already says what jemalloc does.
func TestServerEnv(t *testing.T) {
	got := serverEnv([]string{"PATH=/usr/bin", "HOME=/root"})
	if !slices.Equal(got, []string{"PATH=/usr/bin", "HOME=/root", "MALLOC_CONF=" + allocatorConf}) {
		t.Fatalf("without MALLOC_CONF: %q", got)
	}
	own := []string{"MALLOC_CONF=dirty_decay_ms:1000", "PATH=/usr/bin"}
	if got := serverEnv(own); !slices.Equal(got, own) {
		t.Fatalf("with the operator's MALLOC_CONF: %q", got)
	}
}
