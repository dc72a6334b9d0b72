package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/forward"
	"github.com/talos-audit/talos/ingest/jspub"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/ingest/telemetry"
	"github.com/talos-audit/talos/ingest/tlog"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// stack is what a running daemon exposes to `talosd dev`.
type stack struct {
	NatsURL string
	NC      *nats.Conn
	JS      jetstream.JetStream
	// Registry is the registry the enforce role enforces, once it has
	// replayed TALOS_CONTROL.
	Registry registryState
	// WebURL is the dashboard address with its ?token= (role web), for
	// talosd dev's banner only: never log it.
	WebURL string
}

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
	tracing *tracing.Provider
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
	if f.InsecurePlaintext {
		log.Warn("NATS in PLAINTEXT (--insecure-nats-plaintext): anyone on the network path reads the calls; only to measure what TLS costs")
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
	nc, err := nats.Connect(natsURL, append(creds, ingest.DaemonConnOptions("talosd "+f.instance(), log)...)...)
	if err != nil {
		return fmt.Errorf("connect %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jspub.New(nc)
	if err != nil {
		return err
	}
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{Replicas: f.Replicas, Setup: retry.SetupOptions{Log: log}}); err != nil {
		return err
	}
	if c.key != nil {
		if c.signers, err = trustedSigners(f, c.key); err != nil {
			return err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(rctx)
	stop := func() { cancel(); _ = g.Wait() }
	metrics := telemetry.NewRegistry()
	if c.tracing, err = tracing.Setup(ctx, "talosd", "", metrics); err != nil {
		stop()
		return err
	}
	defer c.tracing.Close(5 * time.Second)
	webURL, en, closeSink, err := startRoles(gctx, f, log, c, nc, js, metrics, roleStarter(g, gctx, log))
	defer closeSink()
	if err != nil {
		stop()
		return err
	}
	srv := telemetry.Serve(telemetry.Options{Addr: f.HTTPAddr, Metrics: metrics, NATS: nc, Pprof: f.Pprof, Logger: log, Routes: f.RoleFlags.Routes(f.has("log"), f.DataDir)})
	// enforcedRegistry fails only when gctx ends: the roles are stopping.
	if reg, err := enforcedRegistry(gctx, f, log, c, en); err == nil && ready != nil {
		if err := ready(gctx, &stack{NatsURL: natsURL, NC: nc, JS: js, Registry: reg, WebURL: webURL}); err != nil {
			stop()
			return err
		}
	}
	<-gctx.Done()
	if ctx.Err() != nil {
		log.Info("shutting down")
	}
	cancel()
	runErr := g.Wait()
	if srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		scancel()
	}
	return runErr
}

// roleStarter runs each role in g under ctx. The first role to fail while
// ctx lasts is logged and ends the others (g cancels ctx); errors of roles
// stopping because ctx ended are not failures.
func roleStarter(g *errgroup.Group, ctx context.Context, log *slog.Logger) func(string, func(context.Context) error) {
	return func(name string, run func(context.Context) error) {
		g.Go(func() error {
			err := run(ctx)
			if err == nil || ctx.Err() != nil {
				return nil
			}
			err = fmt.Errorf("%s: %w", name, err)
			log.Error("role failed", "err", err)
			return err
		})
	}
}

// loadCore loads the bootstrap registry and the signing key for the
// enforce and control roles and builds an engine over the registry (a
// registry pin in TALOS_CONTROL overrides it: enforcedRegistry).
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
	log.Info("bootstrap registry loaded", "registry", f.Registry, "digest", c.reg.Digest(), "servers", len(c.reg.Manifests()))
	return c, nil
}

// pretouchHeap is ingest.PretouchHeap, once per process: talosd dev starts
// it while ClickHouse starts, and startNATS waits for it. It returns the
// bytes touched and how long that took.
var pretouchHeap = sync.OnceValues(func() (uint64, time.Duration) {
	began := time.Now()
	n := ingest.PretouchHeap()
	return n, time.Since(began)
})

// startNATS prepares the NATS users file and, without --nats-url, starts
// the embedded nats-server admitting its users. It returns the URL to
// connect to, talosd's own credentials, and the server's shutdown (a no-op
// with --nats-url).
func startNATS(f *Flags, log *slog.Logger) (url string, creds []nats.Option, shutdown func(), err error) {
	a, err := f.prepareNATSAuth(log)
	if err != nil {
		return "", nil, nil, err
	}
	if creds, err = f.natsLogin().Options(schemas.NATSRoleWorker, ""); err != nil {
		return "", nil, nil, err
	}
	if f.NatsURL != "" {
		return f.NatsURL, creds, func() {}, nil
	}
	host, port, err := natsserver.ParseAddr(f.NatsListen)
	if err != nil {
		return "", nil, nil, usagef("--nats-listen: %v", err)
	}
	if f.HeapPretouch {
		if n, took := pretouchHeap(); n > 0 {
			log.Info("heap pretouched", "mib", n>>20, "took", took.Round(time.Millisecond))
		}
	}
	ns, err := natsserver.Start(natsserver.Options{Dir: filepath.Join(f.DataDir, "nats"), Host: host, Port: port, ServerName: "talosd-" + workerID(f), Users: natsserver.Users(a), TLS: f.Server(f.DataDir)})
	if errors.Is(err, natsserver.ErrAddrInUse) {
		return "", nil, nil, fmt.Errorf("cannot listen on %s for the embedded nats-server: the address is in use "+
			"(another talosd or nats-server?). Join it with --nats-url nats://%s, or listen elsewhere with --nats-listen HOST:PORT", f.NatsListen, f.NatsListen)
	}
	if err != nil {
		return "", nil, nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	log.Info("embedded nats-server with JetStream", "url", ns.URL(), "store", filepath.Join(f.DataDir, "nats"), "users", f.natsAuthPath())
	// This process's own roles reach the server in process: no socket, and
	// no TLS, which guards the network only (and costs the server a record
	// and a write per buffered chunk it sends).
	return ns.URL(), append(creds, nats.InProcessServer(ns.NATS()), natsserver.NoTLS), ns.Shutdown, nil
}

// startRoles starts the configured roles in g: enforce, control, sink, then
// web (after the sink, which creates the database). en is the enforce
// role, nil without one. closeSink closes the sink's ClickHouse
// connection; call it after g has stopped, also when err is not nil.
func startRoles(ctx context.Context, f *Flags, log *slog.Logger, c *core, nc *nats.Conn, js jetstream.JetStream,
	metrics *prometheus.Registry, start func(string, func(context.Context) error)) (webURL string, en *ingest.EnforceRole, closeSink func(), err error) {
	closeSink = func() {}
	if f.has("enforce") {
		if en, err = startEnforce(ctx, f, log, c, nc, js); err != nil {
			return "", nil, closeSink, err
		}
		telemetry.RegisterEnforcer(metrics, en.Enforcer)
		start("enforce", en.Run)
	}
	if f.has("control") {
		run, err := startControl(ctx, f, log.With("role", "control"), nc, js, c, en, metrics)
		if err != nil {
			return "", nil, closeSink, err
		}
		start("control", run)
	}
	if f.has("sink") {
		run, conn, err := startSink(ctx, f, log, js, metrics)
		if err != nil {
			return "", nil, closeSink, err
		}
		closeSink = func() { conn.Close() }
		start("sink", run)
	}
	if f.has("forward") {
		fw, err := forward.Open(f.ForwardConfig, nc, js, forward.Options{Instance: f.instance(), AckWait: f.AckWait, Logger: log.With("role", "forward")})
		if err != nil {
			return "", nil, closeSink, usagef("%v", err)
		}
		telemetry.RegisterForwarder(metrics, fw)
		start("forward", fw.Run)
	}
	if f.has("log") {
		run, err := f.RoleFlags.Start(f.DataDir, f.instance(), js, tlog.RoleOptions{Logger: log.With("role", "log")}, metrics)
		if err != nil {
			return "", nil, closeSink, usagef("%v", err)
		}
		start("log", run)
	}
	if f.has("web") {
		fwd, err := forward.Watch(nc, js) // the destinations of every forward role, for the incidents page
		if err != nil {
			return "", nil, closeSink, err
		}
		w, err := startWeb(ctx, f, log.With("role", "web"), c.key, fwd)
		if err != nil {
			return "", nil, closeSink, err
		}
		webURL = w.URL
		start("web", w.run)
	}
	return webURL, en, closeSink, nil
}

// startEnforce prepares the enforce role (ingest.NewEnforceRole) with the
// checks of enforceChecks.
func startEnforce(ctx context.Context, f *Flags, log *slog.Logger, c *core, nc *nats.Conn, js jetstream.JetStream) (*ingest.EnforceRole, error) {
	checks, err := enforceChecks(f, log)
	if err != nil {
		return nil, err
	}
	en, err := ingest.NewEnforceRole(ctx, nc, js, ingest.EnforceRoleOptions{
		Instance: f.instance(), Key: c.key, Engine: c.engine, Chains: f.Chains, Checks: checks, Ledger: f.ledgerOptions(),
		AckWait: f.AckWait, Checkpoints: f.checkpoints(), Signers: c.signers, HeartbeatInterval: f.HeartbeatInterval,
		Tracing: c.tracing, Logger: log.With("role", "enforce"),
	})
	if errors.Is(err, ingest.ErrBadInstance) {
		return nil, usagef("--%v", err)
	}
	if err != nil {
		return nil, err
	}
	log.Info("enforce role started", "worker_id", en.WorkerID, "chains", en.Chains, "chain_prefix", en.ChainPrefix, "signer_kid", c.key.KID, "mode", f.Mode)
	return en, nil
}

// startSink prepares the sink role: a ClickHouse connection with the
// database migrated (retried until ClickHouse answers) and the sink loop.
// The caller closes conn once run has returned.
func startSink(ctx context.Context, f *Flags, log *slog.Logger, js jetstream.JetStream, metrics *prometheus.Registry) (run func(context.Context) error, conn driver.Conn, err error) {
	if f.ClickhouseAddr == "" {
		return nil, nil, usagef("the sink role needs --clickhouse-addr HOST:PORT")
	}
	if err := retry.Do(ctx, log, "connect ClickHouse "+f.ClickhouseAddr, func() error {
		conn, err = query.OpenMigrated(ctx, f.Logins(), f.ClickhouseDatabase, f.Cluster())
		return err
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
	telemetry.RegisterSinkRows(metrics, writer.Rows)
	log.Info("sink role started", "clickhouse", f.ClickhouseAddr, "database", f.ClickhouseDatabase, "user", f.ClickhouseUser)
	return s.Run, conn, nil
}
