package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"

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
	JWT *jwtauth.Verifier
	// Keys, when set, is JWT's key set: ListenHTTP runs its refresher
	// (KeySet.Run) while it serves, and waits for it before returning.
	Keys     *jwtauth.KeySet
	Refusals RefusalLimits
}

// HTTPConfig is the HTTP mode as the gateway's operator configures it
// (talos-mcp-gateway's --listen, --tls-*, --jwt-*, --jwks-* and
// --auth-refusal-* flags); NewHTTPOptions validates it. Zero values mean
// the defaults of jwtauth and RefusalLimits.
type HTTPConfig struct {
	// Listen is the address served; "" is the stdio mode, where every
	// other field must be unset.
	Listen            string
	TLSCert, TLSKey   string // PEM files (LoadTLS)
	InsecurePlainHTTP bool   // plain HTTP on a loopback address (CheckListen)
	// JWTIssuer and JWTAudience are what a JWT's iss and aud must be; its
	// keys are the JWKS of JWKSFile or JWKSURL.
	JWTIssuer, JWTAudience string
	JWKSFile, JWKSURL      string
	JWTAlgorithms          []string
	JWTLeeway              time.Duration
	JWKSRefresh            time.Duration
	JWKSMaxStale           time.Duration
	// RefusalRate and RefusalBurst bound the refusals reported per source
	// address (RefusalLimits.PerSource, PerSourceBurst).
	RefusalRate  float64
	RefusalBurst int
}

// jwt reports whether any JWT setting is given.
func (c HTTPConfig) jwt() bool {
	return c.JWTIssuer != "" || c.JWTAudience != "" || c.JWKSFile != "" || c.JWKSURL != ""
}

// NewHTTPOptions validates c and composes the HTTP mode's options for
// principals (CSP MUST 2): nil for the stdio mode. TLS is loaded (LoadTLS)
// and the listener checked (CheckListen); without JWT settings every
// principal needs a static token. With them the JWKS is read once now
// (15 s at most): a JWKS file that cannot be read is an error, a JWKS URL
// that cannot be fetched yet is not (logged; the refresher, run by
// ListenHTTP, keeps trying and every JWT is refused meanwhile).
func NewHTTPOptions(c HTTPConfig, principals []*Principal, log *slog.Logger) (*HTTPOptions, error) {
	if c.Listen == "" {
		if c.TLSCert != "" || c.TLSKey != "" || c.InsecurePlainHTTP || c.jwt() {
			return nil, errors.New("--tls-*, --insecure-plain-http, --jwt-* and --jwks-* are for --listen (HTTP)")
		}
		return nil, nil
	}
	if log == nil {
		log = slog.Default()
	}
	o := &HTTPOptions{Addr: c.Listen, Principals: principals, InsecurePlainHTTP: c.InsecurePlainHTTP,
		Refusals: RefusalLimits{PerSource: rate.Limit(c.RefusalRate), PerSourceBurst: c.RefusalBurst}}
	if c.TLSCert != "" || c.TLSKey != "" {
		var err error
		if o.TLS, err = LoadTLS(c.TLSCert, c.TLSKey, log); err != nil {
			return nil, err
		}
	}
	if err := CheckListen(c.Listen, o.TLS != nil, c.InsecurePlainHTTP); err != nil {
		return nil, err
	}
	if !c.jwt() {
		for _, p := range principals {
			if p.TokenSHA256 == "" {
				return nil, fmt.Errorf("principal %s is reached by JWT only, but no --jwt-issuer/--jwks-* is given", p.Name)
			}
		}
		return o, nil
	}
	keys, err := jwtauth.NewKeySet(jwtauth.KeySetOptions{File: c.JWKSFile, URL: c.JWKSURL, Refresh: c.JWKSRefresh,
		MaxStale: c.JWKSMaxStale, Logger: log})
	if err != nil {
		return nil, err
	}
	if o.JWT, err = jwtauth.NewVerifier(jwtauth.Options{Issuer: c.JWTIssuer, Audience: c.JWTAudience,
		Algorithms: c.JWTAlgorithms, Leeway: c.JWTLeeway, Keys: keys}); err != nil {
		return nil, err
	}
	o.Keys = keys
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := keys.Refresh(ctx); err != nil {
		if c.JWKSFile != "" {
			return nil, fmt.Errorf("--jwks-file: %w", err)
		}
		log.Warn("JWKS not fetched yet: every JWT is refused until it is", "url", c.JWKSURL, "err", err)
	}
	return o, nil
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
// /metrics has the gateway's counters. With o.Keys, the key set's
// refresher runs beside the server; it is stopped and waited for before
// ListenHTTP returns.
func (g *Gateway) ListenHTTP(ctx context.Context, o HTTPOptions) error {
	if o.Keys != nil {
		kctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { o.Keys.Run(kctx) })
		defer wg.Wait()
		defer stop()
	}
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
		handlers[p.Name] = g.serverHandler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	}
	auth := &authenticator{ix: ix, jwt: o.JWT, handlers: handlers, refusals: newRefusals(g, o.Refusals, g.authRef), log: g.log}
	mux := g.opsMux()
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

// opsMux serves /healthz (200 while connected to Talos, else 503) and
// /metrics.
func (g *Gateway) opsMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !g.Connected() {
			http.Error(w, "no connection to Talos: calls are denied", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(g.metrics, promhttp.HandlerOpts{}))
	return mux
}

// serveOps serves opsMux on addr (the stdio mode's --metrics-addr) until
// stop is called.
func (g *Gateway) serveOps(addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: g.opsMux(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	g.log.Info("serving /metrics and /healthz", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
