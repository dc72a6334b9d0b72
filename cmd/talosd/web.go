package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/query/web"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
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
func startWeb(ctx context.Context, f *Flags, log *slog.Logger, key *receipts.PrivateKey) (*webRole, error) {
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
	keys := verify.KeySet{}
	switch {
	case key != nil:
		if keys, err = trustedSigners(f, key); err != nil {
			return nil, err
		}
	case len(f.TrustedKeys) > 0:
		if keys, err = verify.LoadTrustedKeys(f.TrustedKeys...); err != nil {
			return nil, fmt.Errorf("trusted keys: %w", err)
		}
	default:
		log.Warn("no --signing-key or --trusted-keys: receipt pages will show every signature as an unknown key")
	}
	var conn driver.Conn
	if err := retry(ctx, log, "connect ClickHouse "+f.ClickhouseAddr, func() error {
		// No database in the handshake: it may not exist yet (the sink
		// creates it); every query names it.
		c, err := query.Open(ctx, f.ClickhouseAddr, "")
		conn = c
		return err
	}); err != nil {
		return nil, err
	}
	h, err := web.NewHandler(web.Options{
		Conn: conn, Database: f.ClickhouseDatabase, Keys: keys, Token: token, Logger: log,
		Inclusion: web.CheckpointInclusion(conn, f.ClickhouseDatabase, keys),
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", f.WebAddr)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("web role: listen on --web-addr %s: %w", f.WebAddr, err)
	}
	addr := ln.Addr().String()
	log.Info("web role started", "url", "http://"+addr+"/", "clickhouse", f.ClickhouseAddr, "database", f.ClickhouseDatabase,
		"trusted_keys", len(keys), "token_from", tokenSource(f))
	return &webRole{
		URL: "http://" + addr + "/?token=" + token,
		run: func(ctx context.Context) error {
			defer conn.Close()
			return web.Serve(ctx, ln, h)
		},
	}, nil
}

// tokenSource says where the token came from, for the log (never the token).
func tokenSource(f *Flags) string {
	if f.WebToken != "" {
		return "--web-token"
	}
	return f.webTokenFile()
}
