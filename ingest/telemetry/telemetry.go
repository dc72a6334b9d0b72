// Package telemetry is what talosd tells its operators over HTTP
// (DESIGN.md §4, --http-addr): Prometheus metrics of the enforce worker,
// its control follower, the sink and the forwarder, and the /healthz,
// /metrics and, on request, /debug/pprof endpoints.
package telemetry

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/talos-audit/talos/ingest"
)

// NewRegistry is a Prometheus registry with the Go runtime and process
// collectors; the roles add theirs.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// RegisterEnforcer adds the metrics of an enforce worker and its control
// follower: calls decided, the control sequence applied, the control lag,
// control events refused, and whether the worker has caught up.
func RegisterEnforcer(reg prometheus.Registerer, e *ingest.Enforcer) {
	w, fol := e.Worker(), e.Follower()
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "talos_enforce_calls_total", Help: "Calls decided and acked by this worker.",
		}, func() float64 { return float64(w.Handled()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "talos_control_applied_seq", Help: "Last TALOS_CONTROL sequence this worker applied.",
		}, func() float64 { return float64(fol.Applied()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "talos_control_lag", Help: "Control events known but not yet applied by this worker.",
		}, func() float64 { return float64(fol.Last() - min(fol.Last(), fol.Applied())) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "talos_control_rejected_total", Help: "Control events this worker refused to apply (bad signature or sequence).",
		}, func() float64 { return float64(fol.Rejected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "talos_control_caught_up", Help: "1 while the worker is current with TALOS_CONTROL and decides calls (0 before its replay, and after a reconnect until it has read the tail again).",
		}, func() float64 {
			if fol.Current() {
				return 1
			}
			return 0
		}),
	)
}

// RegisterSinkRows adds talos_sink_rows_total, the audit records the sink
// has written to ClickHouse, as rows reports them.
func RegisterSinkRows(reg prometheus.Registerer, rows func() uint64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "talos_sink_rows_total", Help: "Audit records written to ClickHouse by this sink.",
	}, func() float64 { return float64(rows()) }))
}

// Options configure Serve.
type Options struct {
	// Addr is the listen address; empty serves nothing.
	Addr string
	// Metrics is what /metrics exposes.
	Metrics prometheus.Gatherer
	// NATS is the connection /healthz reports on: 503 unless it is
	// connected.
	NATS *nats.Conn
	// Pprof also serves /debug/pprof (profiling; keep Addr private).
	Pprof bool
	// Routes are more handlers by pattern (the transparency log's tiles).
	Routes map[string]http.Handler
	Logger *slog.Logger
}

// Handler serves /healthz, /metrics, the Routes and, with Pprof,
// /debug/pprof: CPU and heap profiles, and execution traces
// (/debug/pprof/trace?seconds=N), which show where goroutines wait.
func Handler(o Options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(o.Metrics, promhttp.HandlerOpts{}))
	for pattern, h := range o.Routes {
		mux.Handle(pattern, h)
	}
	if o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s := o.NATS.Status(); s != nats.CONNECTED {
			http.Error(w, "nats: "+s.String(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Serve serves Handler on o.Addr in a goroutine that ends when the caller
// shuts the returned server down. It returns nil when o.Addr is empty or
// cannot be listened on: that is logged, not fatal, because the daemon's
// work does not depend on it.
func Serve(o Options) *http.Server {
	if o.Addr == "" {
		return nil
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		log.Warn("http listener not started", "addr", o.Addr, "err", err)
		return nil
	}
	srv := &http.Server{Handler: Handler(o), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("http", "addr", ln.Addr().String(), "paths", "/healthz /metrics")
	return srv
}
