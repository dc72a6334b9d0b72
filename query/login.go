package query

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The ClickHouse users of a Talos deployment (DESIGN.md §3, ClickHouse
// users): each component logs in as the least it needs.
const (
	// AdminUser runs the migrations (DDL) and, on a server with SQL user
	// management, creates the other two.
	AdminUser = "default"
	// WriterUser is the sink's: it inserts.
	WriterUser = "talos_writer"
	// ReaderUser is the web dashboard's and talosctl's: it reads.
	ReaderUser = "talos_reader"
)

// TLS is how a connection protects itself. The zero value is plain TCP.
type TLS struct {
	// Enabled connects over TLS (to the server's tcp_port_secure, usually
	// 9440). It is implied by every other field.
	Enabled bool
	// CAFile holds the PEM certificates that may sign the server's; empty:
	// the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// a server that asks for one; both or neither.
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry; empty:
	// the host of the address.
	ServerName string
}

func (t TLS) on() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Config is the client TLS configuration for a server at addr (TLS 1.2 or
// later, the server's certificate always verified), or nil for plain TCP.
// With several addresses (Addrs) and no ServerName, each server's
// certificate is verified against the host it was dialled by. It reads
// the files; errors name the file, never its contents.
func (t TLS) Config(addr string) (*tls.Config, error) {
	if !t.on() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if cfg.ServerName == "" && !strings.Contains(addr, ",") {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("query: clickhouse CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("query: clickhouse CA %s: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("query: a clickhouse client certificate needs both its certificate and its key file")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("query: clickhouse client certificate %s: %w", t.CertFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Endpoint is one ClickHouse login: where, as whom, over what. Open
// reads its files each time, so a rotated password or certificate file
// is picked up by the next connection.
type Endpoint struct {
	// Addr is the host:port of the native protocol, or several,
	// comma-separated: the replicas of a cluster, tried in order when a
	// connection is opened (Addrs).
	Addr string
	User string // empty: AdminUser
	// Password, or PasswordFile: a file whose first line is the password
	// (at most one of the two).
	Password, PasswordFile string
	TLS                    TLS
}

// user is the login name, AdminUser when none is set.
func (e Endpoint) user() string {
	if e.User == "" {
		return AdminUser
	}
	return e.User
}

// password is Password, or the first line of PasswordFile.
func (e Endpoint) password() (string, error) {
	if e.PasswordFile == "" {
		return e.Password, nil
	}
	if e.Password != "" {
		return "", fmt.Errorf("query: clickhouse user %s: a password and a password file; give one", e.user())
	}
	b, err := os.ReadFile(e.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("query: clickhouse user %s: password file: %w", e.user(), err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimRight(line, "\r"), nil
}

// Addrs are the addresses of Addr, in order. A connection goes to the
// first that answers; when a server is lost, its connections fail and
// the next ones go to the next that answers.
func (e Endpoint) Addrs() []string {
	var out []string
	for _, a := range strings.Split(e.Addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Check reads what Open would (the password file, the TLS files) without
// connecting: a flag mistake shows at start, not as endless retries.
func (e Endpoint) Check() error {
	if _, err := e.password(); err != nil {
		return err
	}
	_, err := e.TLS.Config(e.Addr)
	return err
}

// Open connects as e and pings the server. database may be "" (the
// server's default database), which is what Migrate needs when the Talos
// database does not exist yet; every query names its database anyway.
func (e Endpoint) Open(ctx context.Context, database string) (driver.Conn, error) {
	return e.open(ctx, database, nil)
}

// open is Open with settings sent with every query.
func (e Endpoint) open(ctx context.Context, database string, settings clickhouse.Settings) (driver.Conn, error) {
	if database != "" && !ValidName(database) {
		return nil, fmt.Errorf("query: invalid database name %q", database)
	}
	password, err := e.password()
	if err != nil {
		return nil, err
	}
	tlsConfig, err := e.TLS.Config(e.Addr)
	if err != nil {
		return nil, err
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:            e.Addrs(),
		Auth:            clickhouse.Auth{Database: database, Username: e.user(), Password: password},
		Settings:        settings,
		TLS:             tlsConfig,
		DialTimeout:     DialTimeout,
		MaxOpenConns:    MaxOpenConns,
		MaxIdleConns:    MaxIdleConns,
		ConnMaxLifetime: ConnMaxLifetime,
	})
	if err != nil {
		return nil, fmt.Errorf("query: open %s as %s: %w", e.Addr, e.user(), err)
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("query: ping %s as %s: %w%s", e.Addr, e.user(), err, handshakeHint(err, database, e.user()))
	}
	return conn, nil
}

// handshakeHint explains the handshake errors of the commonest connection
// mistakes, "" for any other error: an address that answers HTTP (a first
// byte 'H', packet 72) or does not answer the native protocol's hello at
// all (ClickHouse's own HTTP port waits for a request line), and a
// connection the server closes during the handshake, which it does when
// the database does not exist or the user may not use it.
func handshakeHint(err error, database, user string) string {
	const native = "talosctl and talosd speak ClickHouse's native protocol, on port 9000 by default (9440 with TLS), not its HTTP port (8123)"
	msg := err.Error()
	unanswered := strings.Contains(msg, "handshake: failed to read packet")
	switch {
	case strings.Contains(msg, "[handshake] unexpected packet [72]"):
		return " (this looks like an HTTP port: " + native + ")"
	case unanswered && errors.Is(err, os.ErrDeadlineExceeded):
		return " (the server did not answer the handshake: " + native + ")"
	case unanswered && errors.Is(err, io.EOF) && database != "":
		return fmt.Sprintf(" (the server closed the connection: database %s may not exist, or user %s may not access it)", database, user)
	}
	return ""
}
