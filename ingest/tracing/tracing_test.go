package tracing

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestUUIDRoundTrip(t *testing.T) {
	id, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	u := UUID(id)
	if u != "4bf92f35-77b3-4da6-a3ce-929d0e0e4736" {
		t.Fatalf("UUID = %s", u)
	}
	back, ok := FromUUID(u)
	if !ok || back != id {
		t.Fatalf("FromUUID(%s) = %v, %v", u, back, ok)
	}
	for _, bad := range []string{"", "00000000-0000-0000-0000-000000000000", "4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f35-77b3-4da6-a3ce-929d0e0e473x"} {
		if _, ok := FromUUID(bad); ok {
			t.Errorf("FromUUID(%q) accepted", bad)
		}
	}
}

func TestRemoteNeedsASpanID(t *testing.T) {
	const tid = "4bf92f35-77b3-4da6-a3ce-929d0e0e4736"
	sc, ok := Remote(tid, "00f067aa0ba902b7")
	if !ok || !sc.IsSampled() || !sc.IsRemote() || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("Remote = %v, %v", sc, ok)
	}
	// parent_span_id is free text for other enforcement points: only a
	// W3C span id in lowercase hex names a parent.
	for _, bad := range []string{"", "span-1", "00F067AA0BA902B7", "0000000000000000", "00f067aa0ba902b"} {
		if _, ok := Remote(tid, bad); ok {
			t.Errorf("Remote(%q) accepted", bad)
		}
	}
	if _, ok := Remote("not-a-uuid", "00f067aa0ba902b7"); ok {
		t.Error("Remote accepted a trace_id that is no UUID")
	}
}

func TestMetaCarriesTraceContext(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	meta := map[string]any{"progressToken": 7}
	Inject(trace.ContextWithSpanContext(context.Background(), sc), meta)
	if meta["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("traceparent = %v", meta["traceparent"])
	}
	ctx := Extract(context.Background(), meta)
	traceID, parent, ok := Envelope(ctx)
	if !ok || traceID != "4bf92f35-77b3-4da6-a3ce-929d0e0e4736" || parent != "00f067aa0ba902b7" {
		t.Fatalf("Envelope = %q %q %v", traceID, parent, ok)
	}
	// An unsampled span's context travels, but names no parent to record under.
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
	if _, parent, ok := Envelope(trace.ContextWithSpanContext(context.Background(), unsampled)); !ok || parent != "" {
		t.Fatalf("unsampled: parent %q ok %v", parent, ok)
	}
	if _, _, ok := Envelope(Extract(context.Background(), map[string]any{"traceparent": 5})); ok {
		t.Fatal("a traceparent that is no string was taken")
	}
}

func TestConfiguredFollowsTheEnvironment(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
	if Configured() {
		t.Fatal("configured with no variable set")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	if !Configured() {
		t.Fatal("an endpoint does not turn traces on")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if Configured() {
		t.Fatal("OTEL_TRACES_EXPORTER=none does not turn traces off")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if Configured() {
		t.Fatal("OTEL_SDK_DISABLED=true does not turn traces off")
	}
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := Setup(context.Background(), "test", "", nil); err == nil {
		t.Fatal("an unsupported protocol was accepted")
	}
}

// stuck is an exporter that holds every export until released.
type stuck struct {
	release chan struct{}
	mu      sync.Mutex
	got     int
}

func (s *stuck) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	<-s.release
	s.mu.Lock()
	s.got += len(spans)
	s.mu.Unlock()
	return nil
}

func (s *stuck) Shutdown(context.Context) error { return nil }

// TestFullQueueDropsAndCounts: while the exporter is stuck, spans beyond
// the queue's limit are dropped at once (never waited for) and counted.
func TestFullQueueDropsAndCounts(t *testing.T) {
	exp := &stuck{release: make(chan struct{})}
	c := newCounts()
	const limit = 4
	b := &bounded{c: c, limit: limit}
	b.next = sdktrace.NewBatchSpanProcessor(&counting{SpanExporter: exp, c: c}, sdktrace.WithMaxQueueSize(limit), sdktrace.WithMaxExportBatchSize(limit))
	c.inFlight = &b.inFlight
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	tr := tp.Tracer("test")
	for range 10 {
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	if got := testutil.ToFloat64(c.dropped); got != 10-limit {
		t.Fatalf("dropped %v, want %d", got, 10-limit)
	}
	close(exp.release)
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if exp.got != limit || testutil.ToFloat64(c.exported) != limit {
		t.Fatalf("exported %d (counted %v), want %d", exp.got, testutil.ToFloat64(c.exported), limit)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.vec)
	if n, err := testutil.GatherAndCount(reg, "talos_trace_spans_total"); err != nil || n != 3 {
		t.Fatalf("talos_trace_spans_total series %d, %v", n, err)
	}
}
