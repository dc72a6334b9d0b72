// Package tracing gives Talos's processes OpenTelemetry traces: one
// provider per process, configured by the standard OTEL_* environment
// variables and off unless they name an exporter, whose spans never slow a
// decision (a bounded queue; a span that does not fit is dropped and
// counted).
//
// Trace context crosses Talos three ways: in an MCP request's
// params._meta (traceparent, tracestate), as the MCP conventions of
// OpenTelemetry propose; in a tool call envelope, whose trace_id is the W3C
// trace id written as a UUID and whose parent_span_id is the sending span's
// id (set only when that span is sampled); and from there into the
// worker's decision span and the receipt's trace_id.
package tracing

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// QueueSize is the most spans a process holds for export; one more is
// dropped (talos_trace_spans_total{outcome="dropped"}).
const QueueSize = 8192

// Configured reports whether the environment asks for traces: an OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
// or OTEL_TRACES_EXPORTER=otlp, and neither OTEL_SDK_DISABLED=true nor
// OTEL_TRACES_EXPORTER=none.
func Configured() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Provider is a process's tracer. Its zero value (and the Provider of
// Setup when traces are off) is a working no-op: spans carry a parent's
// context along but record nothing.
type Provider struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	spans  *prometheus.CounterVec
}

// Setup returns the process's Provider. service is service.name unless
// OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names another; the
// exporter's endpoint, headers, certificate and timeout come from the
// OTEL_EXPORTER_OTLP_* variables, its protocol from
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
// (http/protobuf, the default, or grpc). The span counters go into reg
// (nil: none).
func Setup(ctx context.Context, service, version string, reg prometheus.Registerer) (*Provider, error) {
	if !Configured() {
		return &Provider{}, nil
	}
	exp, err := exporter(ctx)
	if err != nil {
		return nil, err
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", service)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	counts := newCounts()
	if reg != nil {
		reg.MustRegister(counts.vec)
	}
	proc := &bounded{
		next:  sdktrace.NewBatchSpanProcessor(&counting{SpanExporter: exp, c: counts}, sdktrace.WithMaxQueueSize(QueueSize)),
		c:     counts,
		limit: QueueSize,
	}
	counts.inFlight = &proc.inFlight
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(proc))
	return &Provider{tp: tp, tracer: tp.Tracer("github.com/talos-audit/talos"), spans: counts.vec}, nil
}

// exporter is the OTLP exporter the environment names.
func exporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.ToLower(strings.TrimSpace(proto)) {
	case "", "http/protobuf":
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP/HTTP exporter: %w", err)
		}
		return exp, nil
	case "grpc":
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP/gRPC exporter: %w", err)
		}
		return exp, nil
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q: want grpc or http/protobuf (http/json is not supported)", proto)
	}
}

// Register puts the span counters (talos_trace_spans_total) into reg, for
// a Provider set up without one; nothing when traces are off.
func (p *Provider) Register(reg prometheus.Registerer) {
	if p.Enabled() && reg != nil {
		reg.MustRegister(p.spans)
	}
}

// Enabled reports whether spans are exported.
func (p *Provider) Enabled() bool { return p != nil && p.tp != nil }

// Tracer is the process's tracer (a no-op one when traces are off).
func (p *Provider) Tracer() trace.Tracer {
	if !p.Enabled() {
		return noop.NewTracerProvider().Tracer("")
	}
	return p.tracer
}

// Shutdown exports what is queued (until ctx ends) and stops.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	return p.tp.Shutdown(ctx)
}

// Close exports what is queued, waiting at most timeout, and stops.
func (p *Provider) Close(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = p.Shutdown(ctx)
}

// propagator reads and writes W3C trace context (traceparent, tracestate).
var propagator = propagation.TraceContext{}

// Meta is an MCP params._meta map as a propagation carrier.
type Meta map[string]any

// Get returns the string value of key ("" if absent or not a string).
func (m Meta) Get(key string) string {
	s, _ := m[key].(string)
	return s
}

// Set sets key.
func (m Meta) Set(key, value string) { m[key] = value }

// Keys lists the keys.
func (m Meta) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// Extract returns ctx with the remote span context meta carries, if any.
func Extract(ctx context.Context, meta map[string]any) context.Context {
	if meta == nil {
		return ctx
	}
	return propagator.Extract(ctx, Meta(meta))
}

// Inject writes ctx's span context into meta (which must not be nil);
// nothing when ctx has none.
func Inject(ctx context.Context, meta map[string]any) {
	propagator.Inject(ctx, Meta(meta))
}

// UUID writes a trace id as a UUID (8-4-4-4-12 lowercase hex): the form
// of an envelope's and a receipt's trace_id.
func UUID(id trace.TraceID) string {
	h := hex.EncodeToString(id[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// FromUUID reads a trace_id written as a UUID; false when it is not one
// or is all zeros.
func FromUUID(s string) (trace.TraceID, bool) {
	var id trace.TraceID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, false
	}
	h := s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(id[:], []byte(strings.ToLower(h))); err != nil {
		return id, false
	}
	return id, id.IsValid()
}

// Remote is the sampled remote span context an envelope names: its
// trace_id (a UUID) and its parent_span_id (16 lowercase hex digits, set
// by an enforcement point only for a sampled span); false when the
// envelope names none.
func Remote(traceID, parentSpanID string) (trace.SpanContext, bool) {
	tid, ok := FromUUID(traceID)
	if !ok || len(parentSpanID) != 16 {
		return trace.SpanContext{}, false
	}
	sid, err := trace.SpanIDFromHex(parentSpanID)
	if err != nil || strings.ToLower(parentSpanID) != parentSpanID {
		return trace.SpanContext{}, false
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}), true
}

// Envelope is what an enforcement point writes into a call's envelope for
// the span in ctx: the trace_id (as a UUID) and, when the span is sampled,
// its id as parent_span_id. ok is false when ctx has no span context.
func Envelope(ctx context.Context) (traceID, parentSpanID string, ok bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", "", false
	}
	if sc.IsSampled() {
		parentSpanID = sc.SpanID().String()
	}
	return UUID(sc.TraceID()), parentSpanID, true
}

// counts are the span counters of /metrics.
type counts struct {
	vec                       *prometheus.CounterVec
	exported, dropped, failed prometheus.Counter
	inFlight                  *atomic.Int64
}

func newCounts() *counts {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "talos_trace_spans_total",
		Help: "Spans ended, by outcome: exported, dropped (the export queue was full) or failed (the exporter refused them).",
	}, []string{"outcome"})
	return &counts{vec: vec, exported: vec.WithLabelValues("exported"), dropped: vec.WithLabelValues("dropped"), failed: vec.WithLabelValues("failed")}
}
