package natsauth_test

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/schemas"
)

// TestLoginPrecedence checks the one login order every program uses: the
// URL's user, then the flags, then the users file (explicit, or the
// default when it exists), then none; and the errors for what is missing.
func TestLoginPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "nats-auth.json")
	a, _, err := natsauth.Ensure(file, []string{"ep1"})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := a.Find(schemas.NATSRoleEnforcement, "ep1")
	worker, _ := a.Find(schemas.NATSRoleWorker, "")
	missing := filepath.Join(dir, "absent.json")

	epInbox := schemas.EPInboxPrefix("ep1")
	cases := []struct {
		name              string
		login             natsauth.Login
		role, ep          string
		user, pass, inbox string
		err               string
	}{
		{"url user wins", natsauth.Login{URL: "nats://u:p@h:4222", User: "x", UsersFile: file}, schemas.NATSRoleEnforcement, "ep1", "", "", epInbox, ""},
		{"flags before file", natsauth.Login{URL: "nats://h", User: "x", Password: "y", UsersFile: file}, schemas.NATSRoleWorker, "", "x", "y", "", ""},
		{"explicit file", natsauth.Login{UsersFile: file}, schemas.NATSRoleEnforcement, "ep1", ep.User, ep.Password, epInbox, ""},
		{"default file", natsauth.Login{Default: file}, schemas.NATSRoleWorker, "", worker.User, worker.Password, "", ""},
		{"responder inbox", natsauth.Login{UsersFile: natsauth.None}, schemas.NATSRoleResponder, "", "", "", schemas.ResponderInboxPrefix, ""},
		{"absent default is none", natsauth.Login{Default: missing}, schemas.NATSRoleWorker, "", "", "", "", ""},
		{"none", natsauth.Login{UsersFile: natsauth.None, Default: file}, schemas.NATSRoleWorker, "", "", "", "", ""},
		{"default that cannot be read", natsauth.Login{Default: dir}, schemas.NATSRoleWorker, "", "", "", "", "NATS users file"},
		{"absent explicit file", natsauth.Login{UsersFile: missing}, schemas.NATSRoleWorker, "", "", "", "", "no such file"},
		{"no user for ep", natsauth.Login{UsersFile: file}, schemas.NATSRoleEnforcement, "ep2", "", "", "", `no user for enforcement point "ep2"`},
		{"bad ep id", natsauth.Login{}, schemas.NATSRoleEnforcement, "a b", "", "", "", "must match"},
		{"unknown role", natsauth.Login{}, "admin", "", "", "", "", "unknown NATS role"},
	}
	for _, c := range cases {
		opts, err := c.login.Options(c.role, c.ep)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: err %v, want %q", c.name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err == "":
			var o nats.Options
			for _, opt := range opts {
				if err := opt(&o); err != nil {
					t.Fatal(err)
				}
			}
			if o.User != c.user || o.Password != c.pass || o.InboxPrefix != c.inbox {
				t.Errorf("%s: user %q password %q inbox %q, want %q %q %q", c.name, o.User, o.Password, o.InboxPrefix, c.user, c.pass, c.inbox)
			}
		}
	}
	if ep.Password == "" || worker.Password == "" {
		t.Fatal("Ensure wrote no passwords")
	}
}

// TestLoginCA checks how Login finds the CA of the server's certificate:
// --nats-ca first; else nats-tls/ca.pem beside the users file it would read
// (explicit, or the default even when the default file is missing); else
// none. With a CA the client requires TLS and trusts that CA alone.
func TestLoginCA(t *testing.T) {
	dataDir, other := t.TempDir(), t.TempDir()
	writeCA := func(dir string) string {
		t.Helper()
		f, err := natstls.Ensure(filepath.Join(dir, natsauth.TLSDir), nil)
		if err != nil {
			t.Fatal(err)
		}
		return f.CA
	}
	dataCA, otherCA := writeCA(dataDir), writeCA(other)
	users := filepath.Join(dataDir, "nats-auth.json")
	if _, _, err := natsauth.Ensure(users, nil); err != nil {
		t.Fatal(err)
	}
	bare := t.TempDir()
	cases := []struct {
		name  string
		login natsauth.Login
		ca    string // "" for none
		err   string
	}{
		{"flag wins", natsauth.Login{CA: otherCA, UsersFile: users}, otherCA, ""},
		{"beside the users file", natsauth.Login{UsersFile: users, Default: filepath.Join(other, "nats-auth.json")}, dataCA, ""},
		{"beside the default", natsauth.Login{Default: users}, dataCA, ""},
		{"default users file missing, CA there", natsauth.Login{Default: filepath.Join(other, "nats-auth.json")}, otherCA, ""},
		{"users none: beside the default", natsauth.Login{UsersFile: natsauth.None, Default: users}, dataCA, ""},
		{"URL credentials: still the CA", natsauth.Login{URL: "nats://u:p@h:4222", Default: users}, dataCA, ""},
		{"nothing beside", natsauth.Login{Default: filepath.Join(bare, "nats-auth.json")}, "", ""},
		{"no file at all", natsauth.Login{UsersFile: natsauth.None}, "", ""},
		{"explicit CA missing", natsauth.Login{CA: filepath.Join(bare, "ca.pem"), UsersFile: natsauth.None}, "", "rootCA"},
	}
	pool := func(path string) *x509.CertPool {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		p.AppendCertsFromPEM(b)
		return p
	}
	for _, c := range cases {
		opts, err := c.login.Options(schemas.NATSRoleWorker, "")
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var o nats.Options
		var applyErr error
		for _, opt := range opts {
			if err := opt(&o); err != nil {
				applyErr = err
			}
		}
		switch {
		case c.err != "":
			if applyErr == nil || !strings.Contains(applyErr.Error(), c.err) {
				t.Errorf("%s: %v, want %q when connecting", c.name, applyErr, c.err)
			}
		case applyErr != nil:
			t.Errorf("%s: %v", c.name, applyErr)
		case c.ca == "" && (o.Secure || o.RootCAsCB != nil):
			t.Errorf("%s: TLS required with no CA found", c.name)
		case c.ca != "":
			got, err := o.RootCAsCB()
			if !o.Secure || err != nil || !got.Equal(pool(c.ca)) {
				t.Errorf("%s: secure %v, roots %v, want exactly %s", c.name, o.Secure, err, c.ca)
			}
		}
	}
}
