package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// egressProxy is the only way out of a sandbox with an egress allowlist: an
// HTTP proxy on a Unix socket (bound into the sandbox) that connects to
// allowlisted host:port pairs and refuses everything else with 403 (CSP
// MUST 8, NET-01). It resolves names itself (or dials a pinned address);
// the sandbox has no DNS.
type egressProxy struct {
	server string            // server_id, for logs
	path   string            // the socket's host path
	allow  map[string]string // destination → the address dialled for it
	log    *slog.Logger
	ln     net.Listener
	srv    *http.Server
	done   chan struct{} // closed when Serve has returned

	mu      sync.Mutex
	closed  bool              // close has begun: no new tunnel
	tunnels map[net.Conn]bool // hijacked client ends of open tunnels
	wg      sync.WaitGroup    // one per open tunnel; close waits for it
}

// dialTimeout bounds the proxy's connection to an allowlisted destination.
const dialTimeout = 10 * time.Second

func (s *Sandbox) startProxy() error {
	dir, err := os.MkdirTemp("", "talos-sandbox-*")
	if err != nil {
		return err
	}
	s.dir = dir
	p := &egressProxy{server: s.cfg.ServerID, path: filepath.Join(dir, "egress.sock"), allow: map[string]string{},
		log: s.cfg.Logger, done: make(chan struct{}), tunnels: map[net.Conn]bool{}}
	for _, e := range s.cfg.Egress {
		dest, addr, _ := parseEgress(e) // validated
		p.allow[dest] = addr
	}
	s.preload = filepath.Join(dir, "node-preload.cjs")
	if err := os.WriteFile(s.preload, []byte(nodePreload), 0o444); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	if p.ln, err = net.Listen("unix", p.path); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(p.ln)
	}()
	s.proxy = p
	return nil
}

// close stops accepting, ends the open tunnels, and waits for Serve and
// every tunnel's goroutines to return. Shutdown order: listener and idle
// connections (srv.Close), then tunnels (their client ends closed here).
func (p *egressProxy) close() {
	_ = p.srv.Close()
	<-p.done
	p.mu.Lock()
	p.closed = true
	for c := range p.tunnels {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// ServeHTTP handles CONNECT host:port (tunnels, for TLS) and absolute-form
// requests (plain HTTP through a proxy). The destination is checked against
// the allowlist exactly as the client named it, and reached at its pinned
// address if it has one.
func (p *egressProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	dest := r.Host
	if r.Method != http.MethodConnect {
		if r.URL.Host == "" || r.URL.Scheme != "http" {
			http.Error(w, "talos sandbox: only CONNECT and absolute http:// requests are proxied", http.StatusBadRequest)
			return
		}
		dest = r.URL.Host
		if _, _, err := net.SplitHostPort(dest); err != nil {
			dest = net.JoinHostPort(dest, "80")
		}
	}
	hp, err := parseHostPort(dest)
	addr, ok := p.allow[hp]
	if err != nil || !ok {
		p.log.Warn("sandbox egress refused: not on the allowlist", "server_id", p.server, "destination", dest)
		http.Error(w, "talos sandbox: egress to "+dest+" is not on the allowlist", http.StatusForbidden)
		return
	}
	p.log.Info("sandbox egress", "server_id", p.server, "destination", hp, "address", addr)
	if r.Method == http.MethodConnect {
		p.tunnel(w, r, addr)
		return
	}
	p.forward(w, r, addr)
}

// tunnel connects to addr and splices the hijacked client connection to it.
func (p *egressProxy) tunnel(w http.ResponseWriter, r *http.Request, addr string) {
	up, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(r.Context(), "tcp", addr)
	if err != nil {
		http.Error(w, "talos sandbox: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = up.Close()
		http.Error(w, "talos sandbox: cannot tunnel", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = up.Close()
		_ = down.Close()
		return
	}
	p.tunnels[down] = true
	p.wg.Add(1)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.tunnels, down)
		p.mu.Unlock()
		p.wg.Done()
	}()
	if _, err := down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		_ = up.Close()
		_ = down.Close()
		return
	}
	splice(down, buf.Reader, up)
}

// forward sends one absolute-form request to addr (never through another
// proxy) and copies the response back.
func (p *egressProxy) forward(w http.ResponseWriter, r *http.Request, addr string) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	out.Header.Del("Proxy-Authorization")
	t := &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{Timeout: dialTimeout}).DialContext(ctx, "tcp", addr)
	}}
	defer t.CloseIdleConnections()
	resp, err := t.RoundTrip(out)
	if err != nil {
		http.Error(w, "talos sandbox: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// splice copies both ways until either side ends, then closes both. a's
// already-buffered bytes (ar) are read first.
func splice(a net.Conn, ar io.Reader, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(b, ar)
		closeWrite(b)
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(a, b)
		closeWrite(a)
	}()
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// InitCommand is the first argument that makes the gateway's executable run
// RunInit: `<exe> __talos-sandbox-init <listen> <socket> -- <argv>...`.
const InitCommand = "__talos-sandbox-init"

// RunInit is the sandbox's init for a server with an egress allowlist. It
// runs inside the sandbox: it listens on listen (the sandbox's loopback),
// relays each connection to the egress proxy's Unix socket, runs argv with
// this process's stdin, stdout, stderr and environment, passes SIGTERM and
// SIGINT on to it, and returns its exit status. args are what follows
// InitCommand.
func RunInit(args []string) int {
	if len(args) < 4 || args[2] != "--" {
		fmt.Fprintln(os.Stderr, "talos sandbox init: usage: "+InitCommand+" LISTEN SOCKET -- PROGRAM [ARGS...]")
		return 125
	}
	listen, socket, argv := args[0], args[1], args[3:]
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "talos sandbox init: egress relay:", err)
		return 125
	}
	go relay(ln, socket)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "talos sandbox init:", err)
		return 127
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	default:
		return 128 // killed by a signal
	}
}

// relay accepts until the process exits (the init owns ln for its whole
// life); each connection is spliced to a new connection to socket.
func relay(ln net.Listener, socket string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			up, err := net.Dial("unix", socket)
			if err != nil {
				_ = c.Close()
				return
			}
			splice(c, bufio.NewReader(c), up)
		}()
	}
}
