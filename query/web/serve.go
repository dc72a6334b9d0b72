package web

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
	"github.com/talos-audit/talos/receipts/verify"
)

// LoadOrCreateToken returns the access token kept in the file at path,
// creating the file (32 random bytes in hex, mode 0600) when it is
// missing; two processes creating it at once end up with the same token.
// An empty file is an error naming it; a file other users may read is
// logged. Errors never include the token.
func LoadOrCreateToken(path string, log *slog.Logger) (string, error) {
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
			continue // another process created it first: read theirs
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

// CheckpointInclusion is an Options.Inclusion that builds the receipt's
// inclusion proof against the signed checkpoint covering it and checks it
// with keys (query.ProveReceipt). A receipt no checkpoint covers yet is
// ErrPending; a proof that fails is not ok, with the reason as detail.
func CheckpointInclusion(conn driver.Conn, database string, keys verify.KeySet) func(ctx context.Context, receiptID string) (bool, string, error) {
	return func(ctx context.Context, receiptID string) (bool, string, error) {
		proof, res, err := query.ProveReceipt(ctx, conn, database, receiptID, keys)
		switch {
		case errors.Is(err, query.ErrNoCheckpoint):
			return false, "", fmt.Errorf("%w: the chain's next checkpoint will cover it", ErrPending)
		case err != nil:
			return false, err.Error(), nil
		}
		return true, fmt.Sprintf("leaf %d of %d under checkpoint %d of chain %s (seq %d..%d, Merkle root %.16s…, signed by %s): inclusion proof verified",
			proof.LeafIndex, proof.TreeSize, res.CheckpointSeq, res.ChainID, res.FromSeq, res.ToSeq, res.RootHash, res.CheckpointKID), nil
	}
}

// Dashboard is a dashboard handler bound to its listener: URL is final
// before it serves.
type Dashboard struct {
	ln   net.Listener
	h    http.Handler
	conn driver.Conn
}

// Listen builds the dashboard of o (NewHandler, with CheckpointInclusion
// when o.Inclusion is nil) and binds addr. Serve then serves it and closes
// o.Conn; on an error Listen closes o.Conn itself.
func Listen(o Options, addr string) (*Dashboard, error) {
	if o.Inclusion == nil && o.Conn != nil {
		o.Inclusion = CheckpointInclusion(o.Conn, o.Database, o.Keys)
	}
	h, err := NewHandler(o)
	if err == nil {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return &Dashboard{ln: ln, h: h, conn: o.Conn}, nil
		}
		err = fmt.Errorf("web: listen on %s: %w", addr, err)
	}
	if o.Conn != nil {
		o.Conn.Close()
	}
	return nil, err
}

// Addr is the address the dashboard listens on.
func (d *Dashboard) Addr() string { return d.ln.Addr().String() }

// Serve serves the dashboard until ctx ends (see Serve), then closes its
// ClickHouse connection.
func (d *Dashboard) Serve(ctx context.Context) error {
	defer d.conn.Close()
	return Serve(ctx, d.ln, d.h)
}

// Serve serves h on ln until ctx ends, with timeouts that let a page's
// queries (QueryTimeout) finish, then shuts the server down, giving
// in-flight requests 2 s. It returns nil after a shutdown, else the error
// that stopped the server.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: QueryTimeout + 10*time.Second, IdleTimeout: 2 * time.Minute}
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
}
