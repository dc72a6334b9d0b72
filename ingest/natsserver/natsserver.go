// Package natsserver runs an embedded nats-server with JetStream in this
// process: the server talosd starts when no --nats-url is given, and the one
// the tests start through testenv. It listens on the host and port it is
// given (127.0.0.1 and a free port by default), with its store in a directory
// the caller names or a temporary one. Users turns a NATS users file
// (package natsauth) into the users it admits; with TLS set (package
// natstls) it admits only clients that speak TLS. Cluster joins it to other
// nodes over routes (what testenv's three-node cluster is made of).
package natsserver

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natstls"
)

// DefaultMaxPayload is the largest message the embedded server accepts.
const DefaultMaxPayload = 8 << 20

// Options configure Start. The zero value is a JetStream server on a
// random loopback port with its store in a new temporary directory.
type Options struct {
	// Dir is the JetStream store directory. Empty means a temporary directory
	// that Shutdown removes.
	Dir string
	// Host is the listen address (default 127.0.0.1).
	Host string
	// Port is the client port; 0 means a random free port.
	Port int
	// ServerName names the server (default: "talos-embedded").
	ServerName string
	// MaxPayload overrides DefaultMaxPayload when positive.
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
	// TLS is the certificate the server presents; every client must then
	// speak TLS, and one that does not is refused. Nil means no TLS.
	TLS *natstls.Server
	// Cluster makes the server a node of a NATS cluster (JetStream
	// clustered: streams and buckets of several replicas). Nil: one node.
	Cluster *ClusterOptions
}

// ClusterOptions join a server to a NATS cluster. Every node names the same
// cluster and a distinct ServerName; JetStream needs at least a majority of
// the nodes up to elect its leaders.
type ClusterOptions struct {
	// Name is the cluster's name (required).
	Name string
	// Port is the route port, on Options.Host; 0 means a random free port
	// (then no other node can name it in Routes before it runs).
	Port int
	// Routes are the route URLs (nats-route://host:port) of the nodes to
	// join; a node's own URL among them is ignored, so every node may be
	// given the same list.
	Routes []string
}

// ErrAddrInUse is what Start's error wraps when the fixed port it was given
// is taken (by another talosd or nats-server, say): the server could not
// listen there, and nats-server would only time out.
var ErrAddrInUse = errors.New("address in use")

// ParseAddr splits a listen address HOST:PORT into Options.Host and
// Options.Port.
func ParseAddr(addr string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return h, n, nil
}

// addrFree reports whether a TCP listener could bind addr now.
func addrFree(addr string) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// takenPorts names the fixed ports of opts that srv does not listen on
// and that something else holds.
func takenPorts(srv *server.Server, opts Options) []string {
	host := cmp.Or(opts.Host, "127.0.0.1")
	var taken []string
	check := func(port int, listening bool) {
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		if port > 0 && !listening && !addrFree(addr) {
			taken = append(taken, addr)
		}
	}
	check(opts.Port, srv.Addr() != nil)
	if opts.Cluster != nil {
		check(opts.Cluster.Port, srv.ClusterAddr() != nil)
	}
	return taken
}

// Server is a running embedded nats-server with JetStream.
type Server struct {
	srv     *server.Server
	tempDir string // removed by Shutdown when we created it
}

// Start starts an embedded nats-server with JetStream on 127.0.0.1 and
// returns once it accepts clients and JetStream is enabled. A fixed Port
// (or cluster Port) that is taken fails at once with ErrAddrInUse, and so
// does, once the server is found not ready, one taken between that check
// and the server's listen.
func Start(opts Options) (*Server, error) {
	ports := []int{opts.Port}
	if opts.Cluster != nil {
		ports = append(ports, opts.Cluster.Port)
	}
	for _, p := range ports {
		addr := net.JoinHostPort(cmp.Or(opts.Host, "127.0.0.1"), strconv.Itoa(p))
		if p > 0 && !addrFree(addr) {
			return nil, fmt.Errorf("natsserver: listen on %s: %w", addr, ErrAddrInUse)
		}
	}
	n := &Server{}
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "talos-nats-*")
		if err != nil {
			return nil, fmt.Errorf("natsserver: nats store dir: %w", err)
		}
		dir, n.tempDir = d, d
	}
	sopts, err := serverOptions(opts, dir)
	if err != nil {
		n.removeTemp()
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	ready := opts.ReadyTimeout
	if ready <= 0 {
		ready = 10 * time.Second
	}
	srv, err := server.NewServer(sopts)
	if err != nil {
		n.removeTemp()
		return nil, fmt.Errorf("natsserver: nats server: %w", err)
	}
	if opts.Logs {
		srv.ConfigureLogger()
	}
	n.srv = srv
	srv.Start()
	if !srv.ReadyForConnections(ready) {
		err := fmt.Errorf("natsserver: nats server not ready after %s", ready)
		// A port that was free a moment before Start may have been taken
		// since, before the server could listen there: say so.
		if taken := takenPorts(srv, opts); len(taken) > 0 {
			err = fmt.Errorf("natsserver: listen on %s: %w", strings.Join(taken, ", "), ErrAddrInUse)
		}
		n.Shutdown()
		return nil, err
	}
	if !srv.JetStreamEnabled() {
		n.Shutdown()
		return nil, errors.New("natsserver: nats server started without JetStream")
	}
	return n, nil
}

// serverOptions are nats-server's options for opts, with the JetStream
// store in dir.
func serverOptions(opts Options, dir string) (*server.Options, error) {
	host := cmp.Or(opts.Host, "127.0.0.1")
	port := opts.Port
	if port == 0 {
		port = -1 // nats-server: pick a random port
	}
	maxPayload := opts.MaxPayload
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}
	sopts := &server.Options{
		ServerName: cmp.Or(opts.ServerName, "talos-embedded"),
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		MaxPayload: maxPayload,
		NoSigs:     true,
		NoLog:      !opts.Logs,
		Users:      opts.Users,
	}
	if opts.TLS != nil {
		cfg, err := opts.TLS.Config(host)
		if err != nil {
			return nil, err
		}
		sopts.TLSConfig = cfg
	}
	if c := opts.Cluster; c != nil {
		if err := clusterOptions(sopts, c, opts.TLS); err != nil {
			return nil, err
		}
	}
	return sopts, nil
}

// clusterOptions sets the cluster and routes of sopts. With TLS the routes
// are mutual TLS: each node presents its certificate and requires one
// chaining to the generated CA (an operator's certificate has no CA known
// here, so it cannot secure routes).
func clusterOptions(sopts *server.Options, c *ClusterOptions, t *natstls.Server) error {
	if c.Name == "" {
		return errors.New("cluster: a name is required")
	}
	port := c.Port
	if port == 0 {
		port = -1
	}
	sopts.Cluster = server.ClusterOpts{Name: c.Name, Host: sopts.Host, Port: port}
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return fmt.Errorf("cluster route %q: %w", r, err)
		}
		sopts.Routes = append(sopts.Routes, u)
	}
	if t == nil {
		return nil
	}
	if t.CA() == "" {
		return errors.New("cluster: TLS routes need the generated CA (natstls.Server.Dir), not an operator's certificate")
	}
	pem, err := os.ReadFile(t.CA())
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("cluster: no certificate in %s", t.CA())
	}
	cfg := sopts.TLSConfig.Clone()
	cfg.RootCAs, cfg.ClientCAs, cfg.ClientAuth = pool, pool, tls.RequireAndVerifyClientCert
	sopts.Cluster.TLSConfig, sopts.Cluster.TLSTimeout = cfg, 2
	return nil
}

// URL is the client URL: nats://<host>:<port>, tls://… when the server
// requires TLS; a server listening on every address (0.0.0.0, ::) is
// reached on 127.0.0.1.
func (n *Server) URL() string {
	u, err := url.Parse(n.srv.ClientURL())
	if err != nil {
		return n.srv.ClientURL()
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		u.Host = net.JoinHostPort("127.0.0.1", u.Port())
	}
	return u.String()
}

// NATS is the embedded server itself, for callers that need its internals.
func (n *Server) NATS() *server.Server { return n.srv }

// NoTLS is the nats.Connect option, after nats.InProcessServer, that
// keeps an in-process connection from starting TLS, which a CA option or
// a tls:// URL asks for: the server requires TLS of network clients only.
func NoTLS(o *nats.Options) error {
	o.Secure, o.TLSConfig = false, nil
	for i, u := range o.Servers {
		o.Servers[i] = strings.Replace(u, "tls://", "nats://", 1)
	}
	return nil
}

// Shutdown stops the server, waits for it, and removes the store directory
// if Start created it. It is safe to call more than once.
func (n *Server) Shutdown() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
	n.removeTemp()
}

func (n *Server) removeTemp() {
	if n.tempDir != "" {
		os.RemoveAll(n.tempDir)
		n.tempDir = ""
	}
}

// Users are the users of a NATS users file for Options.Users, each limited
// to its role's permissions; nil for a nil file (no authentication).
func Users(a *natsauth.File) []*server.User {
	if a == nil {
		return nil
	}
	users := make([]*server.User, 0, len(a.Users))
	for _, u := range a.Users {
		p := natsauth.RolePermissions(u)
		users = append(users, &server.User{Username: u.User, Password: u.Password, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
			Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
		}})
	}
	return users
}
