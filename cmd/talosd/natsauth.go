package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/talos-audit/talos/ingest/natsauth"
)

// natsAuthPath is the users file talosd uses: --nats-auth, by default
// <data-dir>/nats-auth.json; "" when --nats-auth is none.
func (f *Flags) natsAuthPath() string {
	switch f.NatsAuth {
	case natsauth.None:
		return ""
	case "":
		return filepath.Join(f.DataDir, "nats-auth.json")
	}
	return f.NatsAuth
}

// ensureNATSAuth is natsauth.Ensure of the users file with --nats-eps; a
// bad ep id is a usage error.
func (f *Flags) ensureNATSAuth(path string) (*natsauth.File, []string, error) {
	a, added, err := natsauth.Ensure(path, f.NatsEPs)
	if errors.Is(err, natsauth.ErrBadEPID) {
		return nil, nil, usagef("--nats-eps: %v", err)
	}
	return a, added, err
}

// prepareNATSAuth is natsauth.Prepare of the users file: created or
// completed for the embedded server, optional at its default path with
// --nats-url; nil when there is none to use.
func (f *Flags) prepareNATSAuth(log *slog.Logger) (*natsauth.File, error) {
	path := f.natsAuthPath()
	if path == "" && f.NatsURL == "" {
		log.Warn("NATS AUTHENTICATION IS OFF (--nats-auth none): any client that reaches the embedded nats-server "+
			"can publish control commands, forge decisions and read every enforcement point's traffic; never do this outside a test", "listen", f.NatsListen)
	}
	a, added, err := natsauth.Prepare(path, natsauth.PrepareOptions{Embedded: f.NatsURL == "", Optional: f.NatsAuth == "", EPs: f.NatsEPs})
	if errors.Is(err, natsauth.ErrBadEPID) {
		return nil, usagef("--nats-eps: %v", err)
	}
	if len(added) > 0 {
		log.Info("NATS users written", "file", path, "added", added)
	}
	return a, err
}

// natsLogin is how talosd and its demo traffic log in: with the embedded
// server, as the users file's user of the role (the file is there:
// prepareNATSAuth made it); with --nats-url, as natsauth.Login picks, the
// default users file being optional.
func (f *Flags) natsLogin() natsauth.Login {
	if f.NatsURL == "" {
		return natsauth.Login{UsersFile: cmp.Or(f.natsAuthPath(), natsauth.None), CA: f.EmbeddedCA(f.DataDir)}
	}
	l := natsauth.Login{URL: f.NatsURL, User: f.NatsUser, Password: f.NatsPassword, UsersFile: f.NatsAuth, CA: f.NatsCA}
	if f.NatsAuth == "" {
		l.Default = f.natsAuthPath()
	}
	return l
}

// natsAuthCmd is `talosd nats-auth`: create or complete the users file
// without starting anything, and optionally render it for nats-server.
type natsAuthCmd struct {
	Conf string `name:"conf" type:"path" help:"Also write a nats-server config file (mode 0600) with these users and their permissions, for an 'include' in nats.conf."`
}

func (c *natsAuthCmd) Run(f *Flags) error {
	path := f.natsAuthPath()
	if path == "" {
		return usagef("nats-auth: --nats-auth is none: there is no file to write")
	}
	a, added, err := f.ensureNATSAuth(path)
	if err != nil {
		return err
	}
	if c.Conf != "" {
		conf, err := a.ServerConf(filepath.Base(path))
		if err != nil {
			return fmt.Errorf("NATS auth file %s: %w", path, err)
		}
		if err := natsauth.WriteSecret(c.Conf, conf, false); err != nil {
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
