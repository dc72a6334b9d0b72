package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/testenv"
)

// The secrets the traced call carries: one in its arguments, one in the
// upstream's result. Neither may reach an exported span.
const (
	argSecret    = "AKIAQTRACELEAKARG0042"
	resultSecret = "ghp_TraceLeakResult0000000000000000000042"
)

// tracerFor is a tracer exporting to the collector as service.
func tracerFor(t *testing.T, col *testenv.OTelCollector, service string) (trace.Tracer, *sdktrace.TracerProvider) {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(col.HTTPEndpoint()+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("talos-test"), tp
}

// tracedUpstream is an MCP server over streamable HTTP whose one tool,
// lookup, continues the trace context of params._meta in a span of its
// own and answers with resultSecret.
func tracedUpstream(t *testing.T, col *testenv.OTelCollector) string {
	t.Helper()
	tr, _ := tracerFor(t, col, "test-upstream")
	srv := mcp.NewServer(&mcp.Implementation{Name: "traced", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "lookup", Description: "Looks a query up.", InputSchema: map[string]any{
		"type": "object", "properties": map[string]any{"query": map[string]any{"type": "string"}, "api_key": map[string]any{"type": "string"}},
	}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx = tracing.Extract(ctx, req.Params.Meta)
		_, span := tr.Start(ctx, "tools/call lookup", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("mcp.method.name", "tools/call"), attribute.String("gen_ai.tool.name", "lookup")))
		defer span.End()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found it; token " + resultSecret}}}, nil
	})
	h := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(h.Close)
	return h.URL + "/mcp"
}

// TestTraceFollowsACallThroughTalos (issue 23, must-shows 1 and 2): one
// tools/call from a traced client through the gateway is one trace in the
// collector: the client's spans, the gateway's MCP server and client
// spans, the worker's decision span and the upstream's span, linked parent
// to child; the receipt names the trace id; and neither the secret in the
// arguments nor the one in the result is in anything exported.
func TestTraceFollowsACallThroughTalos(t *testing.T) {
	col := testenv.StartOTelCollector(t)
	// talosd exports over OTLP/gRPC, the gateway over OTLP/HTTP: each
	// process reads the OTEL_* variables it starts with.
	exportWith := func(protocol string) {
		for _, kv := range col.Env(protocol) {
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
		}
	}
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	up := tracedUpstream(t, col)

	registry := t.TempDir()
	writeJSON(t, filepath.Join(registry, "traced.json"), map[string]any{
		"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "traced", "server_version": "1",
		"tools": []map[string]any{{"tool_name": "lookup", "tool_class": "read", "is_document_op": false,
			"trust_level": "verified", "risk_category": "LOW", "subagent_access": "full"}},
	})
	exportWith("grpc")
	s := startStackRegistry(t, registry)
	exportWith("http/protobuf")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := s.gatewaySession(ctx, "--ep-id", "traced-ep", "--upstream", "traced="+up)

	tr, tp := tracerFor(t, col, "test-client")
	turn, root := tr.Start(ctx, "agent turn")
	cctx, client := tr.Start(turn, "tools/call lookup", trace.WithSpanKind(trace.SpanKindClient))
	meta := map[string]any{}
	tracing.Inject(cctx, meta)
	res, err := g.cs.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Meta: meta,
		Arguments: map[string]any{"query": "weather", "api_key": argSecret}})
	client.End()
	root.End()
	if err != nil {
		t.Fatalf("the traced call failed: %v", err)
	}
	if !strings.Contains(text(res), resultSecret) {
		t.Fatalf("the upstream's result did not come back: %q", text(res))
	}
	_ = tp.ForceFlush(ctx)
	traceID := root.SpanContext().TraceID().String()
	toolCallID, _ := res.Meta["dev.talos/tool_call_id"].(string)
	receiptID, _ := res.Meta["dev.talos/receipt_id"].(string)

	var spans []testenv.Span
	// find is the trace's span of service, name and kind (and, for the
	// worker's decisions, of phase).
	find := func(service, name string, kind int, phase ...string) *testenv.Span {
		for i := range spans {
			sp := &spans[i]
			if sp.TraceID == traceID && sp.Service == service && sp.Name == name && sp.Kind == kind &&
				(len(phase) == 0 || sp.Attrs["talos.phase"] == phase[0]) {
				return sp
			}
		}
		return nil
	}
	const internal, server, clientKind = 1, 2, 3
	want := func() bool {
		return find("talos-mcp-gateway", "tools/call lookup", server) != nil &&
			find("talos-mcp-gateway", "tools/call lookup", clientKind) != nil &&
			find("talosd", "execute_tool lookup", internal, "pre") != nil &&
			find("talosd", "execute_tool lookup", internal, "post") != nil &&
			find("test-upstream", "tools/call lookup", server) != nil
	}
	spans = col.WaitSpans(t, 90*time.Second, func(got []testenv.Span) bool { spans = got; return want() })

	for _, sp := range spans {
		if sp.TraceID == traceID {
			t.Logf("span %s", sp)
		}
	}
	clientSpan := find("test-client", "tools/call lookup", clientKind)
	gwServer := find("talos-mcp-gateway", "tools/call lookup", server)
	gwClient := find("talos-mcp-gateway", "tools/call lookup", clientKind)
	decision := find("talosd", "execute_tool lookup", internal, "pre")
	post := find("talosd", "execute_tool lookup", internal, "post")
	upstream := find("test-upstream", "tools/call lookup", server)
	if clientSpan == nil {
		t.Fatal("the client's own span is not in the trace")
	}
	for _, link := range []struct {
		what          string
		child, parent *testenv.Span
	}{
		{"the gateway's server span under the client's span", gwServer, clientSpan},
		{"the worker's decision under the gateway's server span", decision, gwServer},
		{"the worker's record of the result under the gateway's server span", post, gwServer},
		{"the gateway's client span under its server span", gwClient, gwServer},
		{"the upstream's span under the gateway's client span", upstream, gwClient},
	} {
		if link.child.ParentSpanID != link.parent.SpanID {
			t.Errorf("%s: parent %s, want %s", link.what, link.child.ParentSpanID, link.parent.SpanID)
		}
	}
	for _, c := range []struct {
		sp    *testenv.Span
		attrs map[string]any
	}{
		{gwServer, map[string]any{"mcp.method.name": "tools/call", "gen_ai.tool.name": "lookup", "gen_ai.operation.name": "execute_tool",
			"network.transport": "pipe", "gen_ai.tool.call.id": toolCallID, "talos.decision": "allow", "talos.receipt_id": receiptID}},
		{gwClient, map[string]any{"mcp.method.name": "tools/call", "gen_ai.tool.name": "lookup", "network.transport": "tcp"}},
		{decision, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": toolCallID,
			"talos.decision": "allow", "talos.receipt_id": receiptID, "talos.phase": "pre", "talos.ep_id": "traced-ep"}},
	} {
		for k, v := range c.attrs {
			if got := c.sp.Attrs[k]; got != v {
				t.Errorf("%s (%s): %s = %v, want %v", c.sp.Name, c.sp.Service, k, got, v)
			}
		}
	}
	if id, _ := decision.Attrs["talos.chain_id"].(string); id == "" {
		t.Error("the decision span names no chain")
	}
	for _, sp := range []*testenv.Span{gwServer, gwClient} {
		if id, _ := sp.Attrs["jsonrpc.request.id"].(string); id == "" {
			t.Errorf("%s (kind %d) has no jsonrpc.request.id", sp.Name, sp.Kind)
		}
	}

	// The receipt names the trace: its trace_id is the trace id as a UUID.
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if r := decisionReceipt(t, ctx, conn, toolCallID); strings.ReplaceAll(r.TraceID, "-", "") != traceID {
		t.Errorf("the receipt's trace_id is %s, want the trace %s", r.TraceID, traceID)
	}

	// Must-show 2: nothing exported carries a planted secret.
	raw := col.Raw(t)
	if !strings.Contains(string(raw), toolCallID) {
		t.Fatal("the exported spans do not name the call: the scan below would prove nothing")
	}
	for _, secret := range []string{argSecret, resultSecret} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("a planted secret reached an exported span: %s", secret)
		}
	}
}
