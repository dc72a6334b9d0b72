package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
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
// the token file's content, creating the file (32 random bytes, hex, mode
// 0600) when it is missing. Errors never include the token.
func webToken(f *Flags, log *slog.Logger) (string, error) {
	if f.WebToken != "" {
		return f.WebToken, nil
	}
	path := f.webTokenFile()
	for attempt := 0; ; attempt++ {
		b, err := os.ReadFile(path)
		if err == nil {
			tok := strings.TrimSpace(string(b))
			if tok == "" {
				return "", fmt.Errorf("web token file %s is empty: delete it to have a new token created", path)
			}
			if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
				log.Warn("web token file is readable by other users; chmod 600 it", "file", path, "mode", st.Mode().Perm().String())
			}
			return tok, nil
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt > 0 {
			return "", fmt.Errorf("web token file: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return "", fmt.Errorf("web token file: %w", err)
		}
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return "", err
		}
		file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue // another talosd created it first: read theirs
		}
		if err != nil {
			return "", fmt.Errorf("web token file: %w", err)
		}
		_, werr := file.WriteString(hex.EncodeToString(raw) + "\n")
		if cerr := file.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			_ = os.Remove(path)
			return "", fmt.Errorf("web token file %s: %w", path, werr)
		}
		log.Info("created the web dashboard token", "file", path)
	}
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
	keys := receipts.KeySet{}
	switch {
	case key != nil:
		if keys, err = trustedSigners(f, key); err != nil {
			return nil, err
		}
	case len(f.TrustedKeys) > 0:
		if keys, err = receipts.LoadTrustedKeys(f.TrustedKeys...); err != nil {
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
		Inclusion: func(ctx context.Context, receiptID string) (bool, string, error) {
			return inclusion(ctx, conn, f.ClickhouseDatabase, receiptID, keys)
		},
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
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: web.QueryTimeout + 10*time.Second, IdleTimeout: 2 * time.Minute}
	log.Info("web role started", "url", "http://"+addr+"/", "clickhouse", f.ClickhouseAddr, "database", f.ClickhouseDatabase,
		"trusted_keys", len(keys), "token_from", tokenSource(f))
	return &webRole{
		URL: "http://" + addr + "/?token=" + token,
		run: func(ctx context.Context) error {
			defer conn.Close()
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			select {
			case err := <-served:
				return fmt.Errorf("web: %w", err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			<-served // http.ErrServerClosed
			return nil
		},
	}, nil
}

// inclusion is the receipt page's checkpoint line: the receipt's inclusion
// proof against the signed checkpoint that covers it, built and checked.
func inclusion(ctx context.Context, conn driver.Conn, database, receiptID string, keys receipts.KeySet) (bool, string, error) {
	proof, res, err := query.ProveReceipt(ctx, conn, database, receiptID, keys)
	switch {
	case errors.Is(err, query.ErrNoCheckpoint):
		return false, "", fmt.Errorf("%w: the chain's next checkpoint will cover it", web.ErrPending)
	case err != nil:
		return false, err.Error(), nil
	}
	return true, fmt.Sprintf("leaf %d of %d under checkpoint %d of chain %s (seq %d..%d, Merkle root %.16s…, signed by %s): inclusion proof verified",
		proof.LeafIndex, proof.TreeSize, res.CheckpointSeq, res.ChainID, res.FromSeq, res.ToSeq, res.RootHash, res.CheckpointKID), nil
}

// tokenSource says where the token came from, for the log (never the token).
func tokenSource(f *Flags) string {
	if f.WebToken != "" {
		return "--web-token"
	}
	return f.webTokenFile()
}
