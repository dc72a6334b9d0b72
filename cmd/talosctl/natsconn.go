package main

import (
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/schemas"
)

// defaultNATSAuth is where `talosd dev` (scripts/dev.sh) keeps its auth
// file, relative to the repository root.
const defaultNATSAuth = "talos-data/nats-auth.json"

// connect opens a NATS connection for work of role (worker, responder or
// enforcement; epID names the enforcement point). Credentials, first that
// applies:
//
//  1. user and password in --nats-url;
//  2. --nats-user and --nats-password;
//  3. the user of that role (and ep_id) in the auth file: --nats-auth, or
//     talos-data/nats-auth.json when it exists;
//  4. none.
//
// An enforcement connection always uses the inbox prefix
// schemas.EPInboxPrefix(epID), a responder connection "_INBOX.responder":
// the only inboxes their NATS users may read (so nc.Request just works).
// Configuration mistakes are usage errors (exit 2), an unreachable or
// refusing server is a failure (exit 1).
func (g *Globals) connect(role, epID string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("talosctl " + role), nats.Timeout(5 * time.Second)}
	switch role {
	case schemas.NATSRoleEnforcement:
		if !schemas.ValidID(epID) {
			return nil, usage("ep_id %q must match %s", epID, schemas.IDPattern)
		}
		opts = append(opts, nats.CustomInboxPrefix(schemas.EPInboxPrefix(epID)))
	case schemas.NATSRoleResponder:
		opts = append(opts, nats.CustomInboxPrefix(schemas.ResponderInboxPrefix))
	case schemas.NATSRoleWorker:
	default:
		return nil, usage("unknown NATS role %q", role)
	}
	creds, err := g.natsCredentials(role, epID)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(g.NatsURL, append(opts, creds...)...)
	if err != nil {
		return nil, failed("connect %s: %v", natsauth.Redact(g.NatsURL), err)
	}
	return nc, nil
}

// natsCredentials picks the login for role (see connect).
func (g *Globals) natsCredentials(role, epID string) ([]nats.Option, error) {
	if natsauth.HasUser(g.NatsURL) {
		return nil, nil // nats.go logs in with the URL's userinfo
	}
	if g.NatsUser != "" {
		return []nats.Option{nats.UserInfo(g.NatsUser, g.NatsPassword)}, nil
	}
	path := g.NatsAuth
	switch path {
	case "none":
		return nil, nil
	case "":
		if _, err := os.Stat(defaultNATSAuth); err != nil {
			return nil, nil
		}
		path = defaultNATSAuth
	}
	users, err := natsauth.ReadUsers(path)
	if err != nil {
		return nil, usage("--nats-auth: %v", err)
	}
	if u, ok := natsauth.Find(users, role, epID); ok {
		return []nats.Option{nats.UserInfo(u.User, u.Password)}, nil
	}
	if role == schemas.NATSRoleEnforcement {
		return nil, usage("%s has no NATS user for enforcement point %q: add it with talosd --nats-eps (or 'talosd nats-auth --nats-eps %s'), or pass --nats-user/--nats-password", path, epID, epID)
	}
	return nil, usage("%s has no NATS user with role %s; pass --nats-user/--nats-password", path, role)
}
