package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
)

// stack is what a running daemon exposes to `talosd dev`.
type stack struct {
	NatsURL  string
	NC       *nats.Conn
	JS       jetstream.JetStream
	Registry *enforce.Registry
	// WebURL is the dashboard address with its ?token= (role web), for
	// talosd dev's banner only: never log it.
	WebURL string
}

var knownRoles = map[string]bool{"enforce": true, "sink": true, "control": true, "web": true}

func newLogger(f *Flags) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(f.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if f.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// core is what the enforce and control roles share: the bootstrap
// registry, the signing key, the engine over the registry, and the keys
// whose control events this process applies. All nil without those roles.
type core struct {
	reg     *enforce.Registry
	key     *receipts.PrivateKey
	engine  *enforce.Engine
	signers verify.KeySet
}

// runDaemon runs the configured roles until ctx ends. ready, if set, runs
// once every role has started.
//
// Shutdown order: cancel roles → wait for their goroutines (in-flight calls
// finish or are left for redelivery; the sink's open batch is abandoned
// un-acked) → stop the HTTP server → close the sink's ClickHouse connection
// → close the NATS connection → stop the embedded nats-server.
func runDaemon(ctx context.Context, f *Flags, ready func(context.Context, *stack) error) error {
	log := newLogger(f)
	for _, r := range f.Roles {
		if !knownRoles[r] {
			return usagef("unknown role %q (known: enforce, sink, control, web)", r)
		}
	}
	if f.Mode == "dev" {
		log.Warn("mode dev: unclassified tools are ALLOWED with warning TOOL_UNCLASSIFIED_ALLOWED_DEV; never use dev in production")
	}
	c, err := loadCore(f, log)
	if err != nil {
		return err
	}
	natsURL, creds, stopNATS, err := startNATS(f, log)
	if err != nil {
		return err
	}
	defer stopNATS()
	nc, err := connectNATS(f, log, natsURL, creds)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := retry(ctx, log, "create streams", func() error {
		return ingest.EnsureStreams(ctx, js, ingest.StreamOptions{Replicas: f.Replicas})
	}); err != nil {
		return err
	}
	if c.key != nil {
		if c.signers, err = trustedSigners(f, c.key); err != nil {
			return err
		}
	}
	g := newRoleGroup(ctx)
	defer g.cancel()
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	webURL, closeSink, err := startRoles(ctx, f, log, c, nc, js, metrics, g)
	defer closeSink()
	if err != nil {
		return err
	}
	srv := serveHTTP(f, log, metrics, nc)
	if ready != nil {
		if err := ready(g.ctx, &stack{NatsURL: natsURL, NC: nc, JS: js, Registry: c.reg, WebURL: webURL}); err != nil {
			g.stop()
			return err
		}
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-g.errc:
		log.Error("role failed", "err", runErr)
	}
	g.stop()
	if srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		scancel()
	}
	return runErr
}

// loadCore loads the registry and the signing key for the enforce and
// control roles and pins the registry in a new engine.
func loadCore(f *Flags, log *slog.Logger) (*core, error) {
	c := &core{}
	if !f.has("enforce") && !f.has("control") {
		return c, nil
	}
	if f.Registry == "" {
		return nil, usagef("the enforce and control roles need --registry (a manifest file or a directory of them: the bootstrap registry until a registry pin)")
	}
	if f.SigningKey == "" {
		return nil, usagef("the enforce and control roles need --signing-key (create one with 'talosctl keys gen --out NAME')")
	}
	var err error
	if c.reg, err = enforce.LoadRegistry(f.Registry); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if c.key, err = receipts.LoadPrivateKey(f.SigningKey); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	keepSigner(f, c.key, log)
	mode := enforce.ModeProd
	if f.Mode == "dev" {
		mode = enforce.ModeDev
	}
	if c.engine, err = enforce.New(enforce.Config{Mode: mode, Registry: c.reg}); err != nil {
		return nil, err
	}
	log.Info("registry pinned", "digest", c.reg.Digest(), "servers", len(c.reg.Manifests()))
	return c, nil
}

// startNATS prepares the NATS users file and, without --nats-url, starts
// the embedded nats-server admitting its users. It returns the URL to
// connect to, talosd's own credentials, and the server's shutdown (a no-op
// with --nats-url).
func startNATS(f *Flags, log *slog.Logger) (url string, creds []nats.Option, shutdown func(), err error) {
	a, err := f.prepareNATSAuth(log)
	if err != nil {
		return "", nil, nil, err
	}
	if creds, err = f.natsConnectOptions(a); err != nil {
		return "", nil, nil, err
	}
	if f.NatsURL != "" {
		return f.NatsURL, creds, func() {}, nil
	}
	host, port, err := splitHostPort(f.NatsListen)
	if err != nil {
		return "", nil, nil, usagef("--nats-listen: %v", err)
	}
	if port != 0 && !addrFree(f.NatsListen) {
		return "", nil, nil, fmt.Errorf("cannot listen on %s for the embedded nats-server: the address is in use "+
			"(another talosd or nats-server?). Join it with --nats-url nats://%s, or listen elsewhere with --nats-listen HOST:PORT", f.NatsListen, f.NatsListen)
	}
	ns, err := natsserver.Start(natsserver.Options{Dir: filepath.Join(f.DataDir, "nats"), Host: host, Port: port, ServerName: "talosd-" + workerID(f), Users: natsserver.Users(a)})
	if err != nil {
		return "", nil, nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	log.Info("embedded nats-server with JetStream", "url", ns.URL(), "store", filepath.Join(f.DataDir, "nats"), "users", f.natsAuthPath())
	return ns.URL(), creds, ns.Shutdown, nil
}

// connectNATS is talosd's own connection: it reconnects forever and logs
// disconnects, reconnects and a final close.
func connectNATS(f *Flags, log *slog.Logger, url string, creds []nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append(creds,
		nats.Name("talosd "+f.instance()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
		nats.ClosedHandler(func(c *nats.Conn) {
			if err := c.LastError(); err != nil { // e.g. refused credentials: nats.go gives up
				log.Error("nats connection closed for good; restart talosd once fixed", "err", err)
			}
		}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	return nc, nil
}

// roleGroup owns the roles' goroutines: each runs under ctx, and the first
// error of one that fails before ctx ends is sent on errc.
type roleGroup struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errc   chan error
}

func newRoleGroup(ctx context.Context) *roleGroup {
	g := &roleGroup{errc: make(chan error, 4)}
	g.ctx, g.cancel = context.WithCancel(ctx)
	return g
}

func (g *roleGroup) start(name string, run func(context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := run(g.ctx); err != nil && g.ctx.Err() == nil {
			g.errc <- fmt.Errorf("%s: %w", name, err)
		}
	}()
}

// stop cancels the roles and waits for their goroutines.
func (g *roleGroup) stop() {
	g.cancel()
	g.wg.Wait()
}

// startRoles starts the configured roles in g: enforce, control, sink, then
// web (after the sink, which creates the database). closeSink closes the
// sink's ClickHouse connection; call it after g has stopped, also when err
// is not nil.
func startRoles(ctx context.Context, f *Flags, log *slog.Logger, c *core, nc *nats.Conn, js jetstream.JetStream,
	metrics *prometheus.Registry, g *roleGroup) (webURL string, closeSink func(), err error) {
	closeSink = func() {}
	var en *enforceRole
	if f.has("enforce") {
		if en, err = startEnforce(ctx, f, log, c, nc, js); err != nil {
			return "", closeSink, err
		}
		registerEnforceMetrics(metrics, en.enforcer)
		g.start("enforce", en.enforcer.Run)
	}
	if f.has("control") {
		run, err := startControl(ctx, f, log.With("role", "control"), nc, js, c, en)
		if err != nil {
			return "", closeSink, err
		}
		g.start("control", run)
	}
	if f.has("sink") {
		run, conn, err := startSink(ctx, f, log, js, metrics)
		if err != nil {
			return "", closeSink, err
		}
		closeSink = func() { conn.Close() }
		g.start("sink", run)
	}
	if f.has("web") {
		w, err := startWeb(ctx, f, log.With("role", "web"), c.key)
		if err != nil {
			return "", closeSink, err
		}
		webURL = w.URL
		g.start("web", w.run)
	}
	return webURL, closeSink, nil
}

// enforceRole is the prepared enforce role and what the control role of
// the same process reads from it.
type enforceRole struct {
	enforcer *ingest.Enforcer
	ledger   *ingest.Ledger
	state    func() *enforce.State
	follower *ingest.ControlFollower
}

// startEnforce prepares the enforce role: its hash chains (4 x GOMAXPROCS
// by default, ids new on every start: ingest.NewWorkerChains), the decider with the checks of
// enforceOptions, and the worker.
func startEnforce(ctx context.Context, f *Flags, log *slog.Logger, c *core, nc *nats.Conn, js jetstream.JetStream) (*enforceRole, error) {
	chains, base, err := ingest.NewWorkerChains(workerID(f), f.chains(), c.key)
	if err != nil {
		return nil, usagef("--instance %q: %v", f.instance(), err)
	}
	opts, err := enforceOptions(ctx, f, log, js)
	if err != nil {
		return nil, err
	}
	ledger := opts.Ledger.(*ingest.Ledger)
	dec, err := enforce.NewDecider(c.engine, opts)
	if err != nil {
		return nil, err
	}
	enf, err := ingest.NewEnforcer(nc, js, dec, ingest.EnforcerOptions{
		WorkerID: workerID(f),
		Worker: ingest.WorkerOptions{
			Chains:      chains,
			Source:      "talos://enforce/" + f.instance(),
			AckWait:     f.AckWait,
			Checkpoints: f.checkpoints(),
		},
		Keys:              c.signers,
		HeartbeatInterval: f.HeartbeatInterval,
		RegistryDigest:    func() string { return dec.State().Registry().Digest() },
		Logger:            log.With("role", "enforce"),
	})
	if err != nil {
		return nil, err
	}
	log.Info("enforce role started", "worker_id", workerID(f), "chains", len(chains), "chain_prefix", base, "signer_kid", c.key.KID, "mode", f.Mode)
	return &enforceRole{enforcer: enf, ledger: ledger, state: dec.State, follower: enf.Follower()}, nil
}

// startSink prepares the sink role: a ClickHouse connection with the
// database migrated (retried until ClickHouse answers) and the sink loop.
// The caller closes conn once run has returned.
func startSink(ctx context.Context, f *Flags, log *slog.Logger, js jetstream.JetStream, metrics *prometheus.Registry) (run func(context.Context) error, conn driver.Conn, err error) {
	if f.ClickhouseAddr == "" {
		return nil, nil, usagef("the sink role needs --clickhouse-addr HOST:PORT")
	}
	if err := retry(ctx, log, "connect ClickHouse "+f.ClickhouseAddr, func() error {
		c, err := query.Open(ctx, f.ClickhouseAddr, "") // the database may not exist yet
		if err != nil {
			return err
		}
		if err := query.Migrate(ctx, c, f.ClickhouseDatabase); err != nil {
			_ = c.Close()
			return err
		}
		conn = c
		return nil
	}); err != nil {
		return nil, nil, err
	}
	writer := query.NewSinkWriter(conn, f.ClickhouseDatabase)
	s, err := ingest.NewSink(js, writer, ingest.SinkOptions{
		BatchRows: f.BatchRows, BatchAge: f.BatchAge, AckWait: f.AckWait, Logger: log.With("role", "sink"),
	})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "talos_sink_rows_total", Help: "Audit records written to ClickHouse by this sink.",
	}, func() float64 { return float64(writer.Rows()) }))
	log.Info("sink role started", "clickhouse", f.ClickhouseAddr, "database", f.ClickhouseDatabase)
	return s.Run, conn, nil
}

// serveHTTP serves /healthz, /metrics and, with --pprof, /debug/pprof on
// --http-addr; nil when there is none or it cannot listen (logged, not
// fatal).
func serveHTTP(f *Flags, log *slog.Logger, metrics *prometheus.Registry, nc *nats.Conn) *http.Server {
	if f.HTTPAddr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	if f.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if nc.Status() != nats.CONNECTED {
			http.Error(w, "nats: "+nc.Status().String(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, err := net.Listen("tcp", f.HTTPAddr)
	if err != nil {
		log.Warn("http listener not started", "addr", f.HTTPAddr, "err", err)
		return nil
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("http", "addr", ln.Addr().String(), "paths", "/healthz /metrics")
	return srv
}

// retry runs fn until it succeeds or ctx ends, logging each failure.
func retry(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	backoff := 200 * time.Millisecond
	for {
		err := fn()
		if err == nil {
			return nil
		}
		log.Warn(what+" failed; retrying", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
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

func splitHostPort(addr string) (string, int, error) {
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
