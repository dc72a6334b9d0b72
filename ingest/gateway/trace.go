package gateway

import (
	"context"
	"maps"
	"net/http"
	"reflect"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/ingest/tracing"
)

// traceServer is the receiving middleware of a principal's MCP server: it
// continues the trace context a client sends in params._meta and, with
// traces on, records the request as an MCP server span (OpenTelemetry's
// MCP conventions: "{mcp.method.name} {target}", mcp.method.name,
// mcp.session.id, jsonrpc.request.id (from the transport: idTransport,
// idHandler), gen_ai.tool.name, gen_ai.prompt.name, mcp.resource.uri,
// network.transport, error.type). With traces off, the client's context
// still reaches the envelope (trace_id) and the upstream.
func (g *Gateway) traceServer(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		meta := metaOf(req)
		id := takeRequestID(meta)
		ctx = tracing.Extract(ctx, meta)
		if !g.o.Tracing.Enabled() {
			return next(ctx, method, req)
		}
		transport := "pipe"
		if x := req.GetExtra(); x != nil && x.Header != nil {
			transport = "tcp"
		}
		name, attrs := mcpSpan(method, req, transport)
		if id != "" {
			attrs = append(attrs, attribute.String("jsonrpc.request.id", id))
		}
		ctx, span := g.o.Tracing.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		res, err := next(ctx, method, req)
		endMCPSpan(span, res, err)
		return res, err
	}
}

// traceClient is the sending middleware of the gateway's upstream
// sessions: a request made while serving a traced one (a forwarded
// tools/call) carries the trace context in params._meta and, with traces
// on, is recorded as an MCP client span. Requests of no trace (the
// handshake, the tool-list polls) are sent as they are.
func traceClient(t *tracing.Provider, transport string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if !trace.SpanContextFromContext(ctx).IsValid() {
				return next(ctx, method, req)
			}
			var span trace.Span
			if t.Enabled() {
				name, attrs := mcpSpan(method, req, transport)
				ctx, span = t.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
				defer span.End()
			}
			if p := paramsOf(req); p != nil {
				meta := maps.Clone(p.GetMeta())
				if meta == nil {
					meta = map[string]any{}
				}
				tracing.Inject(ctx, meta)
				p.SetMeta(meta)
			}
			res, err := next(ctx, method, req)
			if span != nil {
				endMCPSpan(span, res, err)
			}
			return res, err
		}
	}
}

// mcpSpan is the name and attributes of an MCP span for method.
func mcpSpan(method string, req mcp.Request, transport string) (string, []attribute.KeyValue) {
	attrs := []attribute.KeyValue{attribute.String("mcp.method.name", method), attribute.String("network.transport", transport)}
	if s := req.GetSession(); s != nil && !reflect.ValueOf(s).IsNil() {
		if id := s.ID(); id != "" {
			attrs = append(attrs, attribute.String("mcp.session.id", id))
		}
	}
	name := method
	switch p := paramsOf(req).(type) {
	case *mcp.CallToolParamsRaw:
		name += " " + p.Name
		attrs = append(attrs, attribute.String("gen_ai.tool.name", p.Name), attribute.String("gen_ai.operation.name", "execute_tool"))
	case *mcp.CallToolParams:
		name += " " + p.Name
		attrs = append(attrs, attribute.String("gen_ai.tool.name", p.Name), attribute.String("gen_ai.operation.name", "execute_tool"))
	case *mcp.GetPromptParams:
		name += " " + p.Name
		attrs = append(attrs, attribute.String("gen_ai.prompt.name", p.Name))
	case *mcp.ReadResourceParams:
		attrs = append(attrs, attribute.String("mcp.resource.uri", p.URI))
	case *mcp.SubscribeParams:
		attrs = append(attrs, attribute.String("mcp.resource.uri", p.URI))
	case *mcp.UnsubscribeParams:
		attrs = append(attrs, attribute.String("mcp.resource.uri", p.URI))
	}
	return name, attrs
}

// endMCPSpan records how the request ended: a JSON-RPC error as error.type
// and rpc.response.status_code (its code), a tool result with isError as
// error.type tool_error.
func endMCPSpan(span trace.Span, res mcp.Result, err error) {
	if err != nil {
		kind := "_OTHER"
		if je, ok := err.(*jsonrpc.Error); ok {
			kind = strconv.FormatInt(je.Code, 10)
			span.SetAttributes(attribute.String("rpc.response.status_code", kind))
		}
		span.SetAttributes(attribute.String("error.type", kind))
		span.SetStatus(codes.Error, kind)
		return
	}
	if r, ok := res.(*mcp.CallToolResult); ok && r != nil && r.IsError {
		span.SetAttributes(attribute.String("error.type", "tool_error"))
		span.SetStatus(codes.Error, "tool_error")
	}
}

// serverTransport is t, tagging each request with its JSON-RPC id when
// traces are on.
func (g *Gateway) serverTransport(t mcp.Transport) mcp.Transport {
	if !g.o.Tracing.Enabled() {
		return t
	}
	return idTransport{Transport: t, server: true}
}

// serverHandler is h, tagging each request with its JSON-RPC id when
// traces are on.
func (g *Gateway) serverHandler(h http.Handler) http.Handler {
	if !g.o.Tracing.Enabled() {
		return h
	}
	return idHandler(h)
}

// paramsOf is a request's params; nil when it has none.
func paramsOf(req mcp.Request) mcp.Params {
	p := req.GetParams()
	if p == nil {
		return nil
	}
	if v := reflect.ValueOf(p); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil
	}
	return p
}

// metaOf is a request's params._meta (nil when it has none).
func metaOf(req mcp.Request) map[string]any {
	if p := paramsOf(req); p != nil {
		return p.GetMeta()
	}
	return nil
}
