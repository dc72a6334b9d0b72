package tracing

import (
	"context"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// bounded admits an ended span to the batch processor only while fewer
// than limit spans are on their way to the exporter (queued or being
// exported), so the batch processor's queue of the same size never fills
// and never blocks; a span that does not fit is dropped and counted. A
// decision therefore never waits on an exporter.
type bounded struct {
	next     sdktrace.SpanProcessor
	c        *counts
	limit    int64
	inFlight atomic.Int64
}

func (b *bounded) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) {}

func (b *bounded) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if b.inFlight.Add(1) > b.limit {
		b.inFlight.Add(-1)
		b.c.dropped.Inc()
		return
	}
	b.next.OnEnd(s)
}

func (b *bounded) Shutdown(ctx context.Context) error   { return b.next.Shutdown(ctx) }
func (b *bounded) ForceFlush(ctx context.Context) error { return b.next.ForceFlush(ctx) }

// counting counts what the exporter took or refused, and releases those
// spans' places in the bounded queue.
type counting struct {
	sdktrace.SpanExporter
	c *counts
}

func (e *counting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.c.failed.Add(float64(len(spans)))
	} else {
		e.c.exported.Add(float64(len(spans)))
	}
	e.c.inFlight.Add(-int64(len(spans)))
	return err
}
