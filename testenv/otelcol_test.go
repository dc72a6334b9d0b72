//go:build unix

package testenv_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/testenv"
)

// TestOTelCollectorReceivesSpans exports a parent and a child span with the
// OpenTelemetry SDK over each OTLP protocol, configured only by the
// collector's Env as a child process would be, and reads them back from
// the collector: ids, parent link, kind, service, status and every
// attribute type, and a planted value in Raw.
func TestOTelCollectorReceivesSpans(t *testing.T) {
	c := testenv.StartOTelCollector(t)
	for _, tc := range []struct {
		protocol, service string
	}{
		{"http/protobuf", "testenv-otlp-http"},
		{"grpc", "testenv-otlp-grpc"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			for _, kv := range c.Env(tc.protocol) {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			planted := "planted-" + randomHex(t)
			parent, child := exportTwoSpans(t, tc.protocol, tc.service, planted)

			spans := c.WaitSpans(t, 20*time.Second, func(spans []testenv.Span) bool {
				return len(ofService(spans, tc.service)) >= 2
			})
			got := ofService(spans, tc.service)
			if len(got) != 2 {
				t.Fatalf("%d spans of %s, want 2: %v", len(got), tc.service, got)
			}
			gotParent, gotChild := byName(t, got, "call"), byName(t, got, "decide")
			checkSpan(t, gotParent, parent, "", int(trace.SpanKindServer), map[string]any{"talos.tool": "echo"})
			checkSpan(t, gotChild, child, parent.SpanID().String(), int(trace.SpanKindClient), map[string]any{
				"talos.secret":  planted,
				"talos.rules":   int64(42),
				"talos.allowed": true,
				"talos.dry_run": false,
				"talos.reasons": []any{"REG_OK", "DOC_OK"},
			})
			// OTLP's status codes are 0 unset, 1 ok, 2 error (the SDK's codes
			// number them otherwise).
			if gotParent.Status != 0 || gotChild.Status != 2 || gotChild.StatusMessage != "denied" {
				t.Errorf("status: parent %d, child %d %q; want 0, 2 \"denied\"",
					gotParent.Status, gotChild.Status, gotChild.StatusMessage)
			}
			if gotChild.StartNanos < gotParent.StartNanos || gotChild.EndNanos > gotParent.EndNanos || gotChild.StartNanos == 0 {
				t.Errorf("times: child %d..%d is not inside parent %d..%d",
					gotChild.StartNanos, gotChild.EndNanos, gotParent.StartNanos, gotParent.EndNanos)
			}
			if !bytes.Contains(c.Raw(t), []byte(planted)) {
				t.Errorf("Raw does not hold the planted value %s", planted)
			}
		})
	}
}

// exportTwoSpans sends a server span "call" and its client child "decide"
// (status error) through a TracerProvider of service whose exporter reads
// the environment, and shuts it down, which flushes them.
func exportTwoSpans(t *testing.T, protocol, service, planted string) (parent, child trace.SpanContext) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var exp sdktrace.SpanExporter
	var err error
	if protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	tr := tp.Tracer("github.com/talos-audit/talos/testenv")

	callCtx, call := tr.Start(ctx, "call", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("talos.tool", "echo")))
	_, decide := tr.Start(callCtx, "decide", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("talos.secret", planted),
		attribute.Int("talos.rules", 42),
		attribute.Bool("talos.allowed", true),
		attribute.Bool("talos.dry_run", false),
		attribute.StringSlice("talos.reasons", []string{"REG_OK", "DOC_OK"}),
	))
	decide.SetStatus(codes.Error, "denied")
	decide.End()
	call.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatalf("export over %s: %v", protocol, err)
	}
	return call.SpanContext(), decide.SpanContext()
}

func checkSpan(t *testing.T, got testenv.Span, want trace.SpanContext, parentID string, kind int, attrs map[string]any) {
	t.Helper()
	if got.TraceID != want.TraceID().String() || got.SpanID != want.SpanID().String() || got.ParentSpanID != parentID {
		t.Errorf("%s: trace %s span %s parent %q; want trace %s span %s parent %q", got.Name,
			got.TraceID, got.SpanID, got.ParentSpanID, want.TraceID(), want.SpanID(), parentID)
	}
	if got.Kind != kind {
		t.Errorf("%s: kind %d, want %d", got.Name, got.Kind, kind)
	}
	if got.Scope != "github.com/talos-audit/talos/testenv" {
		t.Errorf("%s: scope %q", got.Name, got.Scope)
	}
	if !reflect.DeepEqual(got.Attrs, attrs) {
		t.Errorf("%s: attributes\n got  %#v\n want %#v", got.Name, got.Attrs, attrs)
	}
}

func ofService(spans []testenv.Span, service string) []testenv.Span {
	var out []testenv.Span
	for _, s := range spans {
		if s.Service == service {
			out = append(out, s)
		}
	}
	return out
}

func byName(t *testing.T, spans []testenv.Span, name string) testenv.Span {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q in %v", name, spans)
	return testenv.Span{}
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
