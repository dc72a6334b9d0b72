package natsauth_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
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
