package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/talos-audit/talos/ingest/jwtauth"
)

// HTTPOptions configure the streamable HTTP mode (CSP MUST 2).
type HTTPOptions struct {
	Addr       string
	Principals []*Principal
	// TLS serves HTTPS (LoadTLS). Nil is plain HTTP, allowed only with
	// InsecurePlainHTTP on a loopback address (CheckListen).
	TLS               *tls.Config
	InsecurePlainHTTP bool
	// JWT verifies bearer tokens that are not a principal's static token;
	// nil: static tokens only.
	JWT      *jwtauth.Verifier
	Refusals RefusalLimits
}

// LoadTLS is the server TLS configuration of a certificate (chain) and its
// key, PEM files: TLS 1.2 at least.
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// CheckListen refuses a plain-HTTP listener anywhere but on a loopback
// address, and there unless insecure says it is meant (TLS-01): bearer
// tokens must not cross a network in the clear.
func CheckListen(addr string, useTLS, insecure bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if useTLS {
		if insecure {
			return errors.New("--insecure-plain-http and --tls-cert exclude each other")
		}
		return nil
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	switch {
	case !loopback:
		return fmt.Errorf("--listen %s: HTTP mode needs --tls-cert and --tls-key (plain HTTP is allowed only on a loopback address, with --insecure-plain-http)", addr)
	case !insecure:
		return fmt.Errorf("--listen %s: HTTP mode needs --tls-cert and --tls-key, or --insecure-plain-http on this loopback address", addr)
	}
	return nil
}

// ListenHTTP serves streamable HTTP (HTTPS with o.TLS) at o.Addr until ctx
// ends, then shuts the server down, waiting up to 5 s. Every request to
// /mcp must carry a bearer token that selects a principal (authenticator);
// each principal has its own MCP handler, so its sessions, and the tools
// they list, are its own: a session id presented with another principal's
// token is not found. /healthz answers 503 while NATS is unreachable;
// /metrics has the gateway's counters.
func (g *Gateway) ListenHTTP(ctx context.Context, o HTTPOptions) error {
	if err := CheckListen(o.Addr, o.TLS != nil, o.InsecurePlainHTTP); err != nil {
		return err
	}
	ix, err := indexPrincipals(o.Principals)
	if err != nil {
		return err
	}
	handlers := make(map[string]http.Handler, len(o.Principals))
	for _, p := range o.Principals {
		s := g.Server(p)
		handlers[p.Name] = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	}
	auth := &authenticator{ix: ix, jwt: o.JWT, handlers: handlers, refusals: newRefusals(g, o.Refusals, g.authRef), log: g.log}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !g.Connected() {
			http.Error(w, "no connection to Talos: calls are denied", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(g.metrics, promhttp.HandlerOpts{}))
	mux.Handle("/mcp", auth)
	srv := &http.Server{Addr: o.Addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: o.TLS}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return err
	}
	scheme := "https"
	if o.TLS == nil {
		scheme = "http"
		g.log.Warn("serving plain HTTP on a loopback address (--insecure-plain-http): for local use only")
	}
	g.log.Info("serving streamable HTTP", "url", scheme+"://"+ln.Addr().String()+"/mcp", "principals", len(o.Principals), "jwt", o.JWT != nil)
	errc := make(chan error, 1)
	go func() {
		if o.TLS != nil {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	}
}
