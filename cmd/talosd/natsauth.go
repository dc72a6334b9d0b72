package main

// Who may use which subjects: the NATS users of the embedded nats-server
// (and of docker-compose's cluster, through `talosd nats-auth --conf`).
//
// The auth file (JSON, mode 0600) lists users with a role:
//
//	{"users": [
//	  {"user": "talosd",         "password": "…", "role": "worker"},
//	  {"user": "responder",      "password": "…", "role": "responder"},
//	  {"user": "ep-demo-ep",     "password": "…", "role": "enforcement", "ep_id": "demo-ep"}]}
//
// and each role is a fixed set of permissions (rolePermissions); everything
// a role does not allow is denied. talosctl reads the same file to pick the
// user for what it is about to do.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// natsAuthNone is the --nats-auth value that disables authentication.
const natsAuthNone = "none"

// natsAuth is the auth file.
type natsAuth struct {
	Users []natsUser `json:"users"`
}

// natsUser is one NATS user of the auth file.
type natsUser struct {
	User     string `json:"user"`
	Password string `json:"password"`
	Role     string `json:"role"`
	// EPID is the enforcement point the user speaks for (role enforcement).
	EPID string `json:"ep_id,omitempty"`
}

// rolePermissions is what a user of role may publish and subscribe to.
// Lists are allow lists: a subject no list allows is denied.
//
// An enforcement point's connection MUST use the inbox prefix
// schemas.EPInboxPrefix(ep_id) (nats.CustomInboxPrefix): JetStream sends
// its publish acks there. A responder's MUST use schemas.ResponderInboxPrefix for
// the replies to its requests. Only workers may read other inboxes or use
// the JetStream API ($JS.API.>).
func rolePermissions(u natsUser) *server.Permissions {
	switch u.Role {
	case schemas.NATSRoleWorker:
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{">"}},
			Subscribe: &server.SubjectPermission{Allow: []string{">"}},
		}
	case schemas.NATSRoleResponder:
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{schemas.SubjectCtlAll}},
			Subscribe: &server.SubjectPermission{Allow: []string{schemas.SubjectStatusAll, schemas.ResponderInboxPrefix + ".>"}},
		}
	case schemas.NATSRoleEnforcement:
		// It also reads the approve and reject events (signed control
		// receipts naming a tool_call_id) to release the calls it parked.
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{schemas.SubjectCallsAll}},
			Subscribe: &server.SubjectPermission{Allow: []string{
				schemas.DecisionSubject(u.EPID), schemas.EPInboxPrefix(u.EPID) + ".>",
				schemas.ControlSubject(schemas.VerbApprove), schemas.ControlSubject(schemas.VerbReject),
			}},
		}
	}
	// validate rejects other roles; deny everything should one slip through.
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Deny: []string{">"}},
		Subscribe: &server.SubjectPermission{Deny: []string{">"}},
	}
}

// epUserName is the user name generated for an enforcement point.
func epUserName(epID string) string { return "ep-" + epID }

// natsAuthPath is the auth file talosd uses: --nats-auth, by default
// <data-dir>/nats-auth.json; "" when --nats-auth is none.
func (f *Flags) natsAuthPath() string {
	switch f.NatsAuth {
	case natsAuthNone:
		return ""
	case "":
		return filepath.Join(f.DataDir, "nats-auth.json")
	}
	return f.NatsAuth
}

// prepareNATSAuth reads (and, for the embedded server, creates or
// completes) the auth file. It returns nil when there is none to use:
// --nats-auth none, or --nats-url with no auth file at the default path.
func (f *Flags) prepareNATSAuth(log *slog.Logger) (*natsAuth, error) {
	path := f.natsAuthPath()
	if f.NatsURL != "" {
		if path == "" {
			return nil, nil
		}
		a, err := loadNATSAuth(path)
		if errors.Is(err, fs.ErrNotExist) && f.NatsAuth == "" {
			return nil, nil // the default file is optional with --nats-url
		}
		return a, err
	}
	if path == "" {
		log.Warn("NATS AUTHENTICATION IS OFF (--nats-auth none): any client that reaches the embedded nats-server "+
			"can publish control commands, forge decisions and read every enforcement point's traffic; never do this outside a test", "listen", f.NatsListen)
		return nil, nil
	}
	a, added, err := ensureNATSAuth(path, f.NatsEPs)
	if err != nil {
		return nil, err
	}
	if len(added) > 0 {
		log.Info("NATS users written", "file", path, "added", added)
	}
	return a, nil
}

// natsConnectOptions are the credentials talosd's own connection uses: the
// worker user of the auth file with the embedded server; with --nats-url,
// --nats-user/--nats-password, else the auth file's worker user, else none.
// (Credentials in the URL itself win over both; nats.go reads them.)
func (f *Flags) natsConnectOptions(a *natsAuth) ([]nats.Option, error) {
	if f.NatsURL != "" && f.NatsUser != "" {
		return []nats.Option{nats.UserInfo(f.NatsUser, f.NatsPassword)}, nil
	}
	if a == nil {
		return nil, nil
	}
	u, ok := a.find(schemas.NATSRoleWorker, "")
	if !ok {
		return nil, fmt.Errorf("NATS auth file %s has no user with role %q for talosd", f.natsAuthPath(), schemas.NATSRoleWorker)
	}
	return u.connectOptions(), nil
}

// connectOptions are the nats.Connect options that log in as u: its user
// and password and, for an enforcement point or a responder, its inbox
// prefix.
func (u natsUser) connectOptions() []nats.Option {
	opts := []nats.Option{nats.UserInfo(u.User, u.Password)}
	switch u.Role {
	case schemas.NATSRoleEnforcement:
		opts = append(opts, nats.CustomInboxPrefix(schemas.EPInboxPrefix(u.EPID)))
	case schemas.NATSRoleResponder:
		opts = append(opts, nats.CustomInboxPrefix(schemas.ResponderInboxPrefix))
	}
	return opts
}

// find returns the first user of role (for an enforcement point, the one
// speaking for epID).
func (a *natsAuth) find(role, epID string) (natsUser, bool) {
	for _, u := range a.Users {
		if u.Role == role && (role != schemas.NATSRoleEnforcement || u.EPID == epID) {
			return u, true
		}
	}
	return natsUser{}, false
}

// serverUsers are the users for server.Options; nil for a nil file (no
// authentication).
func (a *natsAuth) serverUsers() []*server.User {
	if a == nil {
		return nil
	}
	users := make([]*server.User, 0, len(a.Users))
	for _, u := range a.Users {
		users = append(users, &server.User{Username: u.User, Password: u.Password, Permissions: rolePermissions(u)})
	}
	return users
}

// validate checks what the server and talosctl rely on: every user has a
// name, a password and a known role, names are unique, and an enforcement
// user names a valid ep_id.
func (a *natsAuth) validate() error {
	if len(a.Users) == 0 {
		return errors.New("no users")
	}
	seen := map[string]bool{}
	for i, u := range a.Users {
		switch {
		case u.User == "" || u.Password == "":
			return fmt.Errorf("user %d: user and password are required", i+1)
		case seen[u.User]:
			return fmt.Errorf("user %q appears twice", u.User)
		case u.Role != schemas.NATSRoleWorker && u.Role != schemas.NATSRoleResponder && u.Role != schemas.NATSRoleEnforcement:
			return fmt.Errorf("user %q: role %q is none of %s, %s, %s", u.User, u.Role, schemas.NATSRoleWorker, schemas.NATSRoleResponder, schemas.NATSRoleEnforcement)
		case u.Role == schemas.NATSRoleEnforcement && !schemas.ValidID(u.EPID):
			return fmt.Errorf("user %q: ep_id %q must match %s", u.User, u.EPID, schemas.IDPattern)
		case u.Role != schemas.NATSRoleEnforcement && u.EPID != "":
			return fmt.Errorf("user %q: ep_id is for role %s only", u.User, schemas.NATSRoleEnforcement)
		}
		seen[u.User] = true
	}
	return nil
}

// loadNATSAuth reads and validates an auth file.
func loadNATSAuth(path string) (*natsAuth, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("NATS auth file: %w", err)
	}
	var a natsAuth
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("NATS auth file %s: %w", path, err)
	}
	if err := a.validate(); err != nil {
		return nil, fmt.Errorf("NATS auth file %s: %w", path, err)
	}
	return &a, nil
}

// ensureNATSAuth returns the auth file at path after creating it, if it is
// missing, with a worker user "talosd", a responder user "responder" and an
// enforcement user "ep-<id>" for each of eps, all with random passwords. An
// existing file keeps every user it has; only enforcement users for eps it
// lacks are appended. added names the users written.
func ensureNATSAuth(path string, eps []string) (a *natsAuth, added []string, err error) {
	for _, ep := range eps {
		if !schemas.ValidID(ep) {
			return nil, nil, usagef("--nats-eps: ep id %q must match %s", ep, schemas.IDPattern)
		}
	}
	a, err = loadNATSAuth(path)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	if !exists {
		a = &natsAuth{}
	}
	newUser := func(name, role, ep string) error {
		for _, u := range a.Users {
			if u.User == name {
				return fmt.Errorf("NATS auth file %s: user %q exists with role %q, cannot add it for ep_id %q", path, name, u.Role, ep)
			}
		}
		pw, err := randomPassword()
		if err != nil {
			return err
		}
		a.Users = append(a.Users, natsUser{User: name, Password: pw, Role: role, EPID: ep})
		added = append(added, name)
		return nil
	}
	if !exists {
		if err := newUser("talosd", schemas.NATSRoleWorker, ""); err != nil {
			return nil, nil, err
		}
		if err := newUser("responder", schemas.NATSRoleResponder, ""); err != nil {
			return nil, nil, err
		}
	}
	for _, ep := range eps {
		if _, ok := a.find(schemas.NATSRoleEnforcement, ep); !ok {
			if err := newUser(epUserName(ep), schemas.NATSRoleEnforcement, ep); err != nil {
				return nil, nil, err
			}
		}
	}
	if len(added) == 0 {
		return a, nil, nil
	}
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	if err := writeSecret(path, append(b, '\n'), !exists); err != nil {
		return nil, nil, fmt.Errorf("NATS auth file: %w", err)
	}
	return a, added, nil
}

// randomPassword is 32 random bytes in hex: no character a shell or a flag
// parser treats specially (base64url could start with '-', which a user
// pasting it after --nats-password would see taken for a flag).
func randomPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// writeSecret writes b to path with mode 0600, atomically: readers see the
// old file or the new one, never a part. With exclusive, an existing file
// is an error (two processes creating the same file: the first wins).
func writeSecret(path string, b []byte, exclusive bool) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if exclusive {
		return os.Link(tmp.Name(), path) // fails if path exists
	}
	return os.Rename(tmp.Name(), path)
}

// serverConf is a nats-server configuration file granting the file's users
// their role's permissions (docker-compose's nats.conf includes it).
func (a *natsAuth) serverConf(source string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by `talosd nats-auth` from %s: the NATS users of Talos and what\n# each may publish and subscribe to. Regenerate it; do not edit.\nauthorization {\n  users = [\n", source)
	list := func(subjects []string) string {
		q := make([]string, len(subjects))
		for i, s := range subjects {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	perm := func(p *server.SubjectPermission) string {
		s := "{allow: " + list(p.Allow)
		if len(p.Deny) > 0 {
			s += ", deny: " + list(p.Deny)
		}
		return s + "}"
	}
	for _, u := range a.Users {
		for _, s := range []string{u.User, u.Password} {
			if !confSafe(s) {
				return nil, fmt.Errorf("user %q: user names and passwords in a nats-server config must be printable ASCII without quotes or backslashes", u.User)
			}
		}
		p := rolePermissions(u)
		fmt.Fprintf(&b, "    {user: %q, password: %q, permissions: {publish: %s, subscribe: %s}}\n",
			u.User, u.Password, perm(p.Publish), perm(p.Subscribe))
	}
	b.WriteString("  ]\n}\n")
	return []byte(b.String()), nil
}

func confSafe(s string) bool {
	for _, r := range s {
		if r < 0x20 || r > 0x7e || r == '"' || r == '\\' {
			return false
		}
	}
	return true
}

// natsAuthCmd is `talosd nats-auth`: create or complete the auth file
// without starting anything, and optionally render it for nats-server.
type natsAuthCmd struct {
	Conf string `name:"conf" type:"path" help:"Also write a nats-server config file (mode 0600) with these users and their permissions, for an 'include' in nats.conf."`
}

func (c *natsAuthCmd) Run(f *Flags) error {
	path := f.natsAuthPath()
	if path == "" {
		return usagef("nats-auth: --nats-auth is none: there is no file to write")
	}
	a, added, err := ensureNATSAuth(path, f.NatsEPs)
	if err != nil {
		return err
	}
	if c.Conf != "" {
		conf, err := a.serverConf(filepath.Base(path))
		if err != nil {
			return fmt.Errorf("NATS auth file %s: %w", path, err)
		}
		if err := writeSecret(c.Conf, conf, false); err != nil {
			return err
		}
	}
	for _, u := range a.Users {
		mark := ""
		if slices.Contains(added, u.User) {
			mark = " (new)"
		}
		ep := ""
		if u.EPID != "" {
			ep = " ep_id " + u.EPID
		}
		fmt.Printf("%s: %s%s%s\n", u.User, u.Role, ep, mark)
	}
	return nil
}
