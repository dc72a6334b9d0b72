package natsauth

import (
	"crypto/x509"
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
		return fmt.Errorf("NATS users file %s has no user for enforcement point %q: %s, or pass --nats-user/--nats-password", path, epID, addEP(epID))
	}
	return fmt.Errorf("NATS users file %s has no user with role %s; pass --nats-user/--nats-password", path, role)
}

// addEP is how the user of enforcement point epID is added to talosd's
// users file.
func addEP(epID string) string {
	return fmt.Sprintf("add it with talosd --nats-eps %s (or 'talosd nats-auth --nats-eps %s')", epID, epID)
}

// Explain adds to err, from nats.Connect with the options of
// l.Options(role, epID), what a user needs to fix the two mistakes made
// most: a server certificate the client cannot verify because no CA was
// found (no users file here to find it beside), and a user the server
// refuses (which one was tried, and where talosd's users come from).
// Other errors are returned as they are; err stays in the chain.
func (l Login) Explain(err error, role, epID string) error {
	var unknownCA x509.UnknownAuthorityError
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return fmt.Errorf("%w: %s", err, l.refused(role, epID))
	case errors.As(err, &unknownCA):
		return fmt.Errorf("%w: %s", err, l.untrusted())
	}
	return err
}

// untrusted says why no CA verified the server's certificate.
func (l Login) untrusted() string {
	ca, _ := l.caFile()
	file, _ := l.usersFile()
	switch {
	case ca != "":
		return fmt.Sprintf("%s did not sign the server's certificate: pass --nats-ca with the CA of the talosd that runs this server (<data dir>/%s/%s)", ca, TLSDir, CAFile)
	case file == "" && l.UsersFile == "" && l.Default != "":
		return fmt.Sprintf("there is no ./%s here, nor %s/%s beside it: pass --nats-auth <data dir>/%s of the talosd that runs this server (its CA is beside it), or --nats-ca <data dir>/%s/%s",
			l.Default, TLSDir, CAFile, filepath.Base(l.Default), TLSDir, CAFile)
	case file != "":
		return fmt.Sprintf("there is no %s beside %s: pass --nats-ca with the CA that signed the server's certificate (<data dir>/%s/%s of talosd)", filepath.Join(TLSDir, CAFile), file, TLSDir, CAFile)
	}
	return fmt.Sprintf("the system's roots do not trust it: pass --nats-ca with the CA that signed it (<data dir>/%s/%s of talosd)", TLSDir, CAFile)
}

// refused says which user the server refused and where talosd's users
// come from.
func (l Login) refused(role, epID string) string {
	from := "NATS users are those talosd writes to <data dir>/nats-auth.json (pass it with --nats-auth)"
	if role == schemas.NATSRoleEnforcement {
		from += "; for enforcement point " + epID + ", " + addEP(epID)
	}
	path, _ := l.usersFile()
	switch {
	case HasUser(l.URL):
		return "the server refused the user in --nats-url; " + from
	case l.User != "":
		return fmt.Sprintf("the server refused --nats-user %s; %s", l.User, from)
	case path != "":
		user := "its user for role " + role
		if users, err := ReadUsers(path); err == nil {
			if u, ok := Find(users, role, epID); ok {
				user = "user " + u.User
			}
		}
		return fmt.Sprintf("the server refused %s of %s: is it the users file of the talosd that runs this server? %s", user, path, from)
	case l.UsersFile == "" && l.Default != "":
		return fmt.Sprintf("no user was given (there is no ./%s here); %s", l.Default, from)
	}
	return "no user was given; " + from
}
