// Package natsauth is the NATS auth model of Talos: the users file (JSON,
// mode 0600) that lists the NATS users with a role, the fixed permissions of
// each role, and how a client logs in as the user of its role.
//
// The users file looks like
//
//	{"users": [
//	  {"user": "talosd",         "password": "…", "role": "worker"},
//	  {"user": "responder",      "password": "…", "role": "responder"},
//	  {"user": "ep-demo-ep",     "password": "…", "role": "enforcement", "ep_id": "demo-ep"}]}
//
// talosd creates or completes it (Ensure), its embedded nats-server admits
// only its users, each limited to its role's Permissions (package
// natsserver converts them), and ServerConf renders the same users for a
// standalone nats-server. talosctl and talos-mcp-gateway read it (ReadUsers,
// Find) to pick the user for what they are about to do. Everything a role
// does not allow is denied.
//
// This package links no nats-server code, so the clients that read the file
// stay small.
package natsauth

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// None is the --nats-auth value that disables authentication.
const None = "none"

// DevUsersFile is the users file `talosd dev` (scripts/dev.sh) writes,
// relative to where it runs: what talosctl and the gateway read when
// --nats-auth is not given and it exists (Login.Default).
const DevUsersFile = "talos-data/nats-auth.json"

// ErrBadEPID is what Ensure's error wraps when an ep id is no subject
// token.
var ErrBadEPID = errors.New("bad ep id")

// badEPID is Ensure's error for an ep id that is no subject token.
type badEPID struct{ ep string }

func (e badEPID) Error() string {
	return fmt.Sprintf("ep id %q must match %s", e.ep, schemas.IDPattern)
}

func (e badEPID) Is(target error) bool { return target == ErrBadEPID }

// File is the users file.
type File struct {
	Users []User `json:"users"`
}

// User is one NATS user of the users file.
type User struct {
	User     string `json:"user"`
	Password string `json:"password"`
	Role     string `json:"role"`
	// EPID is the enforcement point the user speaks for (role enforcement).
	EPID string `json:"ep_id,omitempty"`
}

// SubjectPermission lists the subjects allowed and denied for one
// direction (publish or subscribe). Allow is an allow list: a subject it
// does not match is denied.
type SubjectPermission struct {
	Allow []string
	Deny  []string
}

// Permissions are what a user may publish and subscribe to.
type Permissions struct {
	Publish   SubjectPermission
	Subscribe SubjectPermission
}

// RolePermissions is what a user of u's role may publish and subscribe to.
//
// An enforcement point's connection MUST use the inbox prefix
// schemas.EPInboxPrefix(ep_id) (nats.CustomInboxPrefix): JetStream sends
// its publish acks, API replies and approval events there. A responder's
// MUST use schemas.ResponderInboxPrefix for the replies to its requests.
// Only workers may read other inboxes or use the JetStream API ($JS.API.>)
// beyond the approval consumers of an enforcement point (approvalAPI) and
// its direct gets of its own decisions (schemas.DecisionGetSubjects).
func RolePermissions(u User) Permissions {
	switch u.Role {
	case schemas.NATSRoleWorker:
		return Permissions{
			Publish:   SubjectPermission{Allow: []string{">"}},
			Subscribe: SubjectPermission{Allow: []string{">"}},
		}
	case schemas.NATSRoleResponder:
		return Permissions{
			Publish:   SubjectPermission{Allow: []string{schemas.SubjectCtlAll}},
			Subscribe: SubjectPermission{Allow: []string{schemas.SubjectStatusAll, schemas.ResponderInboxPrefix + ".>"}},
		}
	case schemas.NATSRoleEnforcement:
		// It publishes calls on its own ep_id's subjects only, so a call's
		// subject names the enforcement point that sent it.
		// It hears its own decisions, and asks TALOS_DECISIONS again for
		// its own calls' only (a direct get whose subject names its ep_id).
		p := Permissions{
			Publish: SubjectPermission{Allow: []string{schemas.EPCallSubjects(u.EPID), schemas.DecisionGetSubjects(u.EPID)}},
			Subscribe: SubjectPermission{Allow: []string{
				schemas.DecisionSubjects(u.EPID), schemas.EPInboxPrefix(u.EPID) + ".>",
			}},
		}
		// It also reads the approve and reject events (signed control
		// receipts naming a tool_call_id) to release the calls it parked.
		allow, deny := approvalAPI()
		p.Publish.Allow = append(p.Publish.Allow, allow...)
		p.Publish.Deny = append(p.Publish.Deny, deny...)
		return p
	}
	// Validate rejects other roles; deny everything should one slip through.
	return Permissions{
		Publish:   SubjectPermission{Deny: []string{">"}},
		Subscribe: SubjectPermission{Deny: []string{">"}},
	}
}

// EPUserName is the user name generated for an enforcement point.
func EPUserName(epID string) string { return "ep-" + epID }

// ConnectOptions are the nats.Connect options that log in as u: its user
// and password and, for an enforcement point or a responder, its inbox
// prefix.
func (u User) ConnectOptions() []nats.Option {
	opts := []nats.Option{nats.UserInfo(u.User, u.Password)}
	switch u.Role {
	case schemas.NATSRoleEnforcement:
		opts = append(opts, nats.CustomInboxPrefix(schemas.EPInboxPrefix(u.EPID)))
	case schemas.NATSRoleResponder:
		opts = append(opts, nats.CustomInboxPrefix(schemas.ResponderInboxPrefix))
	}
	return opts
}

// Find is the first user of role; for the enforcement role, the one that
// speaks for epID.
func Find(users []User, role, epID string) (User, bool) {
	for _, u := range users {
		if u.Role == role && (role != schemas.NATSRoleEnforcement || u.EPID == epID) {
			return u, true
		}
	}
	return User{}, false
}

// Find is the file's first user of role (see Find).
func (a *File) Find(role, epID string) (User, bool) { return Find(a.Users, role, epID) }

// Validate checks what the server and the clients rely on: every user has
// a name, a password and a known role, names are unique, and an enforcement
// user names a valid ep_id.
func (a *File) Validate() error {
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

// parse decodes a users file, refusing unknown fields.
func parse(b []byte) (*File, error) {
	var a File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, err
	}
	return &a, nil
}

// ReadUsers reads the users of a users file as a client does: unknown
// fields are refused, the users are not validated (the server refuses a
// login that is wrong).
func ReadUsers(path string) ([]User, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a.Users, nil
}

// Load reads and validates a users file. A missing file is an error that
// wraps fs.ErrNotExist.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("NATS auth file: %w", err)
	}
	a, err := parse(b)
	if err == nil {
		err = a.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("NATS auth file %s: %w", path, err)
	}
	return a, nil
}

// Ensure returns the users file at path after creating it, if it is
// missing, with a worker user "talosd", a responder user "responder" and an
// enforcement user EPUserName(id) for each of eps, all with random
// passwords. An existing file keeps every user it has; only enforcement
// users for eps it lacks are appended. added names the users written. An
// ep id that is no subject token is ErrBadEPID; a file that is not valid is
// left as it is.
func Ensure(path string, eps []string) (a *File, added []string, err error) {
	for _, ep := range eps {
		if !schemas.ValidID(ep) {
			return nil, nil, badEPID{ep}
		}
	}
	a, err = Load(path)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	if !exists {
		a = &File{}
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
		a.Users = append(a.Users, User{User: name, Password: pw, Role: role, EPID: ep})
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
		if _, ok := a.Find(schemas.NATSRoleEnforcement, ep); !ok {
			if err := newUser(EPUserName(ep), schemas.NATSRoleEnforcement, ep); err != nil {
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
	if err := WriteSecret(path, append(b, '\n'), !exists); err != nil {
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

// WriteSecret writes b to path with mode 0600, atomically: readers see the
// old file or the new one, never a part. With exclusive, an existing file
// is an error (two processes creating the same file: the first wins).
func WriteSecret(path string, b []byte, exclusive bool) error {
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

// ServerConf is a nats-server configuration file granting the file's users
// their role's permissions (docker-compose's nats.conf includes it); source
// names the users file in its header.
func (a *File) ServerConf(source string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by `talosd nats-auth` from %s: the NATS users of Talos and what\n# each may publish and subscribe to. Regenerate it; do not edit.\nauthorization {\n  users = [\n", source)
	list := func(subjects []string) string {
		q := make([]string, len(subjects))
		for i, s := range subjects {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	perm := func(p SubjectPermission) string {
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
		p := RolePermissions(u)
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

// HasUser reports whether any URL of a comma-separated NATS URL list
// carries a user name (nats.go then logs in with it).
func HasUser(urls string) bool {
	for _, s := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil && u.User.Username() != "" {
			return true
		}
	}
	return false
}

// Redact hides the passwords of a NATS URL list, for messages.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, s := range parts {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}
