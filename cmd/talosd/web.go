package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/ingest/forward"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/query/web"
	"github.com/talos-audit/talos/receipts"
)

// webTokenFile is the dashboard token file: --web-token-file, or
// web.token under the data dir.
func (f *Flags) webTokenFile() string {
	if f.WebTokenFile != "" {
		return f.WebTokenFile
	}
	return filepath.Join(f.DataDir, "web.token")
}

// webToken returns the dashboard token: --web-token (TALOS_WEB_TOKEN), or
// the token file's (web.LoadOrCreateToken). Errors never include the token.
func webToken(f *Flags, log *slog.Logger) (string, error) {
	if f.WebToken != "" {
		return f.WebToken, nil
	}
	return web.LoadOrCreateToken(f.webTokenFile(), log)
}

// webRole is the prepared web role: its listener is bound, so URL is final.
type webRole struct {
	// URL is the dashboard address with ?token=, for `talosd dev` to
	// print to the local user; it is never logged.
	URL string
	run func(context.Context) error
}

// startWeb prepares the web role: the token, the trusted keys for the
// receipt pages (this instance's key and --trusted-keys), a read-only
// ClickHouse connection, and the listener on --web-addr. Its run serves
// until ctx ends, then shuts the server down (in-flight requests get 2 s)
// and closes the connection.
//
// fwd, if set, gives the incidents page the forward role's destinations.
func startWeb(ctx context.Context, f *Flags, log *slog.Logger, key *receipts.PrivateKey, fwd *forward.Watcher) (*webRole, error) {
	if f.ClickhouseAddr == "" {
		return nil, usagef("the web role needs --clickhouse-addr HOST:PORT")
	}
	token, err := webToken(f, log)
	if err != nil {
		return nil, err
	}
	if !web.ValidToken(token) {
		return nil, usagef("--web-token / TALOS_WEB_TOKEN / %s: %v", f.webTokenFile(), web.ErrBadToken)
	}
	keys, err := trustedSigners(f, key)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		log.Warn("no --signing-key or --trusted-keys: receipt pages will show every signature as an unknown key")
	}
	var conn driver.Conn
	if err := retry.Do(ctx, log, "connect ClickHouse "+f.ClickhouseAddr, func() error {
		conn, err = f.Reader().Open(ctx, "") // the sink creates the database; queries name it
		return err
	}); err != nil {
		return nil, err
	}
	o := web.Options{Conn: conn, Database: f.ClickhouseDatabase, Keys: keys, Token: token, Logger: log}
	if fwd != nil {
		o.Forwarding = fwd.Statuses
	}
	d, err := web.Listen(o, f.WebAddr)
	if err != nil {
		return nil, fmt.Errorf("web role: %w", err)
	}
	from := f.webTokenFile() // where the token came from, for the log (never the token)
	if f.WebToken != "" {
		from = "--web-token"
	}
	log.Info("web role started", "url", "http://"+d.Addr()+"/", "clickhouse", f.ClickhouseAddr, "database", f.ClickhouseDatabase, "user", f.ClickhouseReaderUser,
		"trusted_keys", len(keys), "token_from", from)
	return &webRole{URL: "http://" + d.Addr() + "/?token=" + token, run: d.Serve}, nil
}
