package natsauth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// Login is how a client picks its NATS credentials. Every Talos program
// (talosd, talosctl, talos-mcp-gateway, the demo traffic) logs in through
// it, so the precedence is written once. The first that applies wins:
//
//  1. a user and password in URL (nats.go reads them itself);
//  2. User and Password;
//  3. the user of the role (and, for an enforcement point, its ep_id) in
//     the users file: UsersFile, or Default when UsersFile is empty and
//     Default exists; UsersFile None means no file;
//  4. none.
//
// The server's certificate is verified against CA when it is set; else
// against the CA file TLSDir/CAFile beside the users file (UsersFile unless
// it is "" or None, else Default), where talosd keeps the CA of its
// embedded server, when that file exists; else the system's roots (which a
// server that requires TLS with a private CA fails). With a CA, a server
// that offers no TLS is refused.
type Login struct {
	URL            string
	User, Password string
	UsersFile      string
	Default        string
	CA             string
}

// TLSDir is the directory of a talosd data directory where the CA and the
// certificate of its embedded nats-server are kept (package natstls);
// CAFile is the CA certificate in it.
const (
	TLSDir = "nats-tls"
	CAFile = "ca.pem"
)

// Options returns the nats.Connect options that log in as role (and epID
// for an enforcement point): the credentials Login picks and, for an
// enforcement point or a responder, the only inbox prefix its NATS user
// may read. Every error is a configuration mistake.
func (l Login) Options(role, epID string) ([]nats.Option, error) {
	var opts []nats.Option
	switch role {
	case schemas.NATSRoleEnforcement:
		if !schemas.ValidID(epID) {
			return nil, fmt.Errorf("ep_id %q must match %s", epID, schemas.IDPattern)
		}
		opts = append(opts, nats.CustomInboxPrefix(schemas.EPInboxPrefix(epID)))
	case schemas.NATSRoleResponder:
		opts = append(opts, nats.CustomInboxPrefix(schemas.ResponderInboxPrefix))
	case schemas.NATSRoleWorker:
	default:
		return nil, fmt.Errorf("unknown NATS role %q", role)
	}
	ca, err := l.caFile()
	if err != nil {
		return nil, err
	}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	if HasUser(l.URL) {
		return opts, nil
	}
	if l.User != "" {
		return append(opts, nats.UserInfo(l.User, l.Password)), nil
	}
	path, err := l.usersFile()
	if path == "" || err != nil {
		return opts, err
	}
	users, err := ReadUsers(path)
	if err != nil {
		return nil, fmt.Errorf("NATS users file: %w", err)
	}
	u, ok := Find(users, role, epID)
	if !ok {
		return nil, noUser(path, role, epID)
	}
	return append(opts, nats.UserInfo(u.User, u.Password)), nil
}

// usersFile is the users file Login reads, "" for none.
func (l Login) usersFile() (string, error) {
	switch l.UsersFile {
	case None:
		return "", nil
	case "":
		if l.Default == "" {
			return "", nil
		}
		if _, err := os.Stat(l.Default); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", nil
			}
			return "", fmt.Errorf("NATS users file: %w", err)
		}
		return l.Default, nil
	}
	return l.UsersFile, nil
}

// caFile is the CA file Login trusts, "" for the system's roots. An
// explicit CA is read when connecting.
func (l Login) caFile() (string, error) {
	if l.CA != "" {
		return l.CA, nil
	}
	beside := l.Default
	if l.UsersFile != "" && l.UsersFile != None {
		beside = l.UsersFile
	}
	if beside == "" {
		return "", nil
	}
	path := filepath.Join(filepath.Dir(beside), TLSDir, CAFile)
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("NATS CA: %w", err)
	}
	return path, nil
}

// noUser says which user a users file lacks and how to add it.
func noUser(path, role, epID string) error {
	if role == schemas.NATSRoleEnforcement {
		return fmt.Errorf("NATS users file %s has no user for enforcement point %q: add it with talosd --nats-eps %s (or 'talosd nats-auth --nats-eps %s'), or pass --nats-user/--nats-password", path, epID, epID, epID)
	}
	return fmt.Errorf("NATS users file %s has no user with role %s; pass --nats-user/--nats-password", path, role)
}
