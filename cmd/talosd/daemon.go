package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
	"github.com/talos-audit/talos/schemas"
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

// runDaemon runs the configured roles until ctx ends. ready, if set, runs
// once every role has started.
//
// Shutdown order: cancel roles → wait for their goroutines (in-flight calls
// finish or are left for redelivery; the sink's open batch is abandoned
// un-acked) → stop the HTTP server → close the NATS connection → stop the
// embedded nats-server.
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

	var (
		reg    *enforce.Registry
		key    *receipts.PrivateKey
		engine *enforce.Engine
	)
	if f.has("enforce") || f.has("control") {
		if f.Registry == "" {
			return usagef("the enforce and control roles need --registry (a manifest file or a directory of them: the bootstrap registry until a registry pin)")
		}
		if f.SigningKey == "" {
			return usagef("the enforce and control roles need --signing-key (create one with 'talosctl keys gen --out NAME')")
		}
		var err error
		if reg, err = enforce.LoadRegistry(f.Registry); err != nil {
			return fmt.Errorf("registry: %w", err)
		}
		if key, err = receipts.LoadPrivateKey(f.SigningKey); err != nil {
			return fmt.Errorf("signing key: %w", err)
		}
		keepSigner(f, key, log)
		mode := enforce.ModeProd
		if f.Mode == "dev" {
			mode = enforce.ModeDev
		}
		if engine, err = enforce.New(enforce.Config{Mode: mode, Registry: reg}); err != nil {
			return err
		}
		log.Info("registry pinned", "digest", reg.Digest(), "servers", len(reg.Manifests()))
	}

	natsURL := f.NatsURL
	natsAuth, err := f.prepareNATSAuth(log)
	if err != nil {
		return err
	}
	natsCreds, err := f.natsConnectOptions(natsAuth)
	if err != nil {
		return err
	}
	if natsURL == "" {
		host, port, err := splitHostPort(f.NatsListen)
		if err != nil {
			return usagef("--nats-listen: %v", err)
		}
		if port != 0 && !addrFree(f.NatsListen) {
			return fmt.Errorf("cannot listen on %s for the embedded nats-server: the address is in use "+
				"(another talosd or nats-server?). Join it with --nats-url nats://%s, or listen elsewhere with --nats-listen HOST:PORT", f.NatsListen, f.NatsListen)
		}
		ns, err := natsserver.Start(natsserver.Options{Dir: filepath.Join(f.DataDir, "nats"), Host: host, Port: port, ServerName: "talosd-" + chainPrefix(f.instance()), Users: natsserver.Users(natsAuth)})
		if err != nil {
			return fmt.Errorf("embedded nats-server: %w", err)
		}
		defer ns.Shutdown()
		natsURL = ns.URL()
		log.Info("embedded nats-server with JetStream", "url", natsURL, "store", filepath.Join(f.DataDir, "nats"), "users", f.natsAuthPath())
	}
	nc, err := nats.Connect(natsURL, append(natsCreds,
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
		return fmt.Errorf("connect %s: %w", natsURL, err)
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

	roleCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	start := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(roleCtx); err != nil && roleCtx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var (
		signers  receipts.KeySet
		ledger   *ingest.Ledger
		state    func() *enforce.State
		follower *ingest.ControlFollower
	)
	if key != nil {
		if signers, err = trustedSigners(f, key); err != nil {
			return err
		}
	}
	if f.has("enforce") {
		boot := make([]byte, 4)
		_, _ = rand.Read(boot)
		base := chainPrefix(f.instance()) + "-" + hex.EncodeToString(boot)
		chains := make([]*receipts.Chain, f.chains())
		for i := range chains {
			id := base + "-" + strconv.Itoa(i)
			if !schemas.ValidID(id) {
				return usagef("chain id %q from --instance %q is not a valid subject token", id, f.instance())
			}
			chains[i] = receipts.NewChain(id, key)
		}
		opts, err := enforceOptions(ctx, f, log, js)
		if err != nil {
			return err
		}
		ledger = opts.Ledger.(*ingest.Ledger)
		dec, err := enforce.NewDecider(engine, opts)
		if err != nil {
			return err
		}
		enf, err := ingest.NewEnforcer(nc, js, dec, ingest.EnforcerOptions{
			WorkerID: workerID(f),
			Worker: ingest.WorkerOptions{
				Chains:      chains,
				Source:      "talos://enforce/" + f.instance(),
				Ledger:      ledger,
				AckWait:     f.AckWait,
				Checkpoints: f.checkpoints(),
			},
			Keys:              signers,
			HeartbeatInterval: f.HeartbeatInterval,
			RegistryDigest:    func() string { return dec.State().Registry().Digest() },
			Logger:            log.With("role", "enforce"),
		})
		if err != nil {
			return err
		}
		state, follower = dec.State, enf.Follower()
		registerEnforceMetrics(metrics, enf)
		log.Info("enforce role started", "worker_id", workerID(f), "chains", len(chains), "chain_prefix", base, "signer_kid", key.KID, "mode", f.Mode)
		start("enforce", enf.Run)
	}
	if f.has("control") {
		run, err := startControl(ctx, f, log.With("role", "control"), nc, js, key, engine, signers, ledger, state, follower)
		if err != nil {
			return err
		}
		start("control", run)
	}
	if f.has("sink") {
		if f.ClickhouseAddr == "" {
			return usagef("the sink role needs --clickhouse-addr HOST:PORT")
		}
		var conn driver.Conn
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
			return err
		}
		defer conn.Close()
		writer := query.NewSinkWriter(conn, f.ClickhouseDatabase)
		s, err := ingest.NewSink(js, writer, ingest.SinkOptions{
			BatchRows: f.BatchRows, BatchAge: f.BatchAge, AckWait: f.AckWait, Logger: log.With("role", "sink"),
		})
		if err != nil {
			return err
		}
		metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "talos_sink_rows_total", Help: "Audit records written to ClickHouse by this sink.",
		}, func() float64 { return float64(writer.Rows()) }))
		log.Info("sink role started", "clickhouse", f.ClickhouseAddr, "database", f.ClickhouseDatabase)
		start("sink", s.Run)
	}

	var webURL string
	if f.has("web") { // after the sink, which creates the database
		w, err := startWeb(ctx, f, log.With("role", "web"), key)
		if err != nil {
			return err
		}
		webURL = w.URL
		start("web", w.run)
	}

	var srv *http.Server
	if f.HTTPAddr != "" {
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
		} else {
			srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			log.Info("http", "addr", ln.Addr().String(), "paths", "/healthz /metrics")
		}
	}

	if ready != nil {
		if err := ready(roleCtx, &stack{NatsURL: natsURL, NC: nc, JS: js, Registry: reg, WebURL: webURL}); err != nil {
			cancel()
			wg.Wait()
			return err
		}
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-errc:
		log.Error("role failed", "err", runErr)
	}
	cancel()
	wg.Wait()
	if srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		scancel()
	}
	return runErr
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

var notToken = regexp.MustCompile(`[^a-z0-9_-]+`)

// chainPrefix turns an instance name into a subject-safe chain id prefix.
func chainPrefix(instance string) string {
	s := notToken.ReplaceAllString(strings.ToLower(instance), "-")
	s = strings.Trim(s, "-_")
	if s == "" {
		s = "talosd"
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return s
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
