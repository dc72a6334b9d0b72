package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultNATSMaxPayload is the largest message the embedded server accepts.
const DefaultNATSMaxPayload = 8 << 20

// NATSOptions configure StartNATS. The zero value is a JetStream server on a
// random loopback port with its store in a new temporary directory.
type NATSOptions struct {
	// Dir is the JetStream store directory. Empty means a temporary directory
	// that Shutdown removes.
	Dir string
	// Host is the listen address (default 127.0.0.1).
	Host string
	// Port is the client port; 0 means a random free port.
	Port int
	// ServerName names the server (default: "talos-embedded").
	ServerName string
	// MaxPayload overrides DefaultNATSMaxPayload when positive.
	MaxPayload int32
	// ReadyTimeout bounds the wait for the server to accept clients
	// (default 10 s).
	ReadyTimeout time.Duration
	// Logs sends the server's log to stderr (off by default).
	Logs bool
	// Users are the only clients the server accepts, each limited to its
	// Permissions. Nil means no authentication: any client may connect and
	// use every subject.
	Users []*server.User
}

// NATS is a running embedded nats-server with JetStream.
type NATS struct {
	srv     *server.Server
	tempDir string // removed by Shutdown when we created it
}

// StartNATS starts an embedded nats-server with JetStream on 127.0.0.1 and
// returns once it accepts clients and JetStream is enabled.
func StartNATS(opts NATSOptions) (*NATS, error) {
	n := &NATS{}
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "talos-nats-*")
		if err != nil {
			return nil, fmt.Errorf("testenv: nats store dir: %w", err)
		}
		dir, n.tempDir = d, d
	}
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := opts.Port
	if port == 0 {
		port = -1 // nats-server: pick a random port
	}
	name := opts.ServerName
	if name == "" {
		name = "talos-embedded"
	}
	maxPayload := opts.MaxPayload
	if maxPayload <= 0 {
		maxPayload = DefaultNATSMaxPayload
	}
	ready := opts.ReadyTimeout
	if ready <= 0 {
		ready = 10 * time.Second
	}
	sopts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		MaxPayload: maxPayload,
		NoSigs:     true,
		NoLog:      !opts.Logs,
		Users:      opts.Users,
	}
	srv, err := server.NewServer(sopts)
	if err != nil {
		n.removeTemp()
		return nil, fmt.Errorf("testenv: nats server: %w", err)
	}
	if opts.Logs {
		srv.ConfigureLogger()
	}
	n.srv = srv
	srv.Start()
	if !srv.ReadyForConnections(ready) {
		n.Shutdown()
		return nil, fmt.Errorf("testenv: nats server not ready after %s", ready)
	}
	if !srv.JetStreamEnabled() {
		n.Shutdown()
		return nil, errors.New("testenv: nats server started without JetStream")
	}
	return n, nil
}

// URL is the client URL, nats://127.0.0.1:<port>.
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Server is the embedded server, for tests that need its internals.
func (n *NATS) Server() *server.Server { return n.srv }

// Shutdown stops the server, waits for it, and removes the store directory
// if StartNATS created it. It is safe to call more than once.
func (n *NATS) Shutdown() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
	n.removeTemp()
}

func (n *NATS) removeTemp() {
	if n.tempDir != "" {
		os.RemoveAll(n.tempDir)
		n.tempDir = ""
	}
}

// NATSForTest starts an embedded server stored in t.TempDir() and shuts it
// down when the test ends.
func NATSForTest(t testing.TB) *NATS {
	t.Helper()
	n, err := StartNATS(NATSOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n
}
