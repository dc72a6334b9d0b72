package ingest

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/ingest/tracing"
)

// traceDecisions records each answered call of a batch as a span in the
// trace its envelope names (a sampled parent: trace_id and parent_span_id),
// from when the batch was taken to when its answer was sent. Calls whose
// envelope names no sampled parent, and every call without a tracer, cost
// nothing here.
func (w *Worker) traceDecisions(calls []*call, start time.Time) {
	if w.o.Tracer == nil {
		return
	}
	end := time.Now()
	for _, c := range calls {
		if c.done || c.dec == nil || c.p == nil {
			continue
		}
		sc, ok := tracing.Remote(c.p.TraceParent())
		if !ok {
			continue
		}
		d := &c.dec.Decision
		r := &c.out.Receipt
		ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
		_, span := w.o.Tracer.Start(ctx, "execute_tool "+r.ToolName,
			trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(
				attribute.String("gen_ai.operation.name", "execute_tool"),
				attribute.String("gen_ai.tool.name", r.ToolName),
				attribute.String("gen_ai.tool.call.id", r.ToolCallID),
				attribute.String("talos.phase", d.Phase),
				attribute.String("talos.decision", d.Decision),
				attribute.StringSlice("talos.reason_codes", d.ReasonCodes),
				attribute.String("talos.receipt_id", d.ReceiptID),
				attribute.String("talos.chain_id", c.chain.ID()),
				attribute.String("talos.ep_id", r.EPID),
				attribute.String("talos.server_id", r.ServerID),
			))
		span.End(trace.WithTimestamp(end))
	}
}
