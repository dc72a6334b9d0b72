package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The MCP SDK's middleware sees a request's method and params but not its
// JSON-RPC id, which an MCP span records as jsonrpc.request.id. On the
// server side the gateway's transports (idTransport, idHandler) copy the
// id of each request they read into params._meta under metaRequestID,
// where traceServer takes it out again; on the client side idTransport
// writes it on the span of the context the request is sent with.
const metaRequestID = "dev.talos/jsonrpc.request.id"

// maxTaggedBody is the largest HTTP request body idHandler reads to tag;
// a larger one is served untagged.
const maxTaggedBody = 8 << 20

// idTransport, on a server's side, tags the requests it reads
// (tagRequestID); on a client's, it records the id of each request it
// writes on the span of the request's context.
type idTransport struct {
	mcp.Transport
	server bool
}

func (t idTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if t.server {
		return serverIDConn{c}, nil
	}
	return clientIDConn{c}, nil
}

type serverIDConn struct{ mcp.Connection }

func (c serverIDConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if r, ok := m.(*jsonrpc.Request); ok {
		tagRequestID(r)
	}
	return m, err
}

type clientIDConn struct{ mcp.Connection }

func (c clientIDConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if r, ok := m.(*jsonrpc.Request); ok && r.ID.IsValid() {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(attribute.String("jsonrpc.request.id", idString(r.ID.Raw())))
		}
	}
	return c.Connection.Write(ctx, m)
}

// idHandler tags the JSON-RPC request of each POST body before next
// serves it (streamable HTTP carries one message per POST).
func idHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxTaggedBody+1))
		if err != nil || len(body) > maxTaggedBody {
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
			next.ServeHTTP(w, r)
			return
		}
		if msg, err := jsonrpc.DecodeMessage(body); err == nil {
			if req, ok := msg.(*jsonrpc.Request); ok && req.ID.IsValid() && tagRequestID(req) {
				if b, err := jsonrpc.EncodeMessage(req); err == nil {
					body = b
				}
			}
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// tagRequestID copies a request's id into its params._meta under
// metaRequestID (replacing any the client set); false when it has no id
// or its params are not an object. The other members keep their bytes.
func tagRequestID(r *jsonrpc.Request) bool {
	if !r.ID.IsValid() {
		return false
	}
	params := map[string]json.RawMessage{}
	if len(r.Params) > 0 && string(r.Params) != "null" {
		if err := json.Unmarshal(r.Params, &params); err != nil || params == nil {
			return false
		}
	}
	meta := map[string]json.RawMessage{}
	if m, ok := params["_meta"]; ok && string(m) != "null" {
		if err := json.Unmarshal(m, &meta); err != nil || meta == nil {
			return false
		}
	}
	id, err := json.Marshal(idString(r.ID.Raw()))
	if err != nil {
		return false
	}
	meta[metaRequestID] = id
	if params["_meta"], err = json.Marshal(meta); err != nil {
		return false
	}
	b, err := json.Marshal(params)
	if err != nil {
		return false
	}
	r.Params = b
	return true
}

// takeRequestID removes metaRequestID from meta and returns it ("" if
// absent).
func takeRequestID(meta map[string]any) string {
	id, _ := meta[metaRequestID].(string)
	delete(meta, metaRequestID)
	return id
}

// idString writes a JSON-RPC id (a string or a number) as a string.
func idString(v any) string {
	switch id := v.(type) {
	case string:
		return id
	case int64:
		return strconv.FormatInt(id, 10)
	case float64:
		return strconv.FormatFloat(id, 'f', -1, 64)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}
