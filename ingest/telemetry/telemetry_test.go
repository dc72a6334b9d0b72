package telemetry_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/ingest/telemetry"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestHandler(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	reg := telemetry.NewRegistry()
	rows := uint64(42)
	telemetry.RegisterSinkRows(reg, func() uint64 { return rows })
	h := telemetry.Handler(telemetry.Options{Metrics: reg, NATS: nc})

	if code, body := get(t, h, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz connected: %d %q", code, body)
	}
	code, body := get(t, h, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "talos_sink_rows_total 42") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d, missing the sink rows or the Go collector:\n%s", code, body)
	}
	if code, _ := get(t, h, "/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/ without Pprof: %d, want 404", code)
	}
	nc.Close()
	if code, body := get(t, h, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "nats: CLOSED") {
		t.Fatalf("/healthz closed: %d %q", code, body)
	}
	if code, _ := get(t, h, "/debug/pprof/trace"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/trace without Pprof: %d, want 404", code)
	}
	withPprof := telemetry.Handler(telemetry.Options{Metrics: reg, NATS: nc, Pprof: true})
	if code, _ := get(t, withPprof, "/debug/pprof/"); code != http.StatusOK {
		t.Fatalf("/debug/pprof/ with Pprof: %d", code)
	}
	// An execution trace, for where a call waits (go tool trace).
	if code, body := get(t, withPprof, "/debug/pprof/trace?seconds=0.05"); code != http.StatusOK || !strings.HasPrefix(body, "go 1.") {
		t.Fatalf("/debug/pprof/trace with Pprof: %d, %.20q", code, body)
	}
}

func TestServe(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if srv := telemetry.Serve(telemetry.Options{Logger: log}); srv != nil {
		t.Fatal("Serve without Addr returned a server")
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if srv := telemetry.Serve(telemetry.Options{Addr: busy.Addr().String(), Metrics: telemetry.NewRegistry(), Logger: log}); srv != nil {
		_ = srv.Shutdown(context.Background())
		t.Fatal("Serve on a busy address returned a server")
	}
}
