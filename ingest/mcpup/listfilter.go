package mcpup

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// WithRejected has the session drop from every list it reads (tools/list,
// prompts/list, resources/list, resources/templates/list) each definition
// that cannot be served (Rejected), calling report with it, so that one bad
// definition neither fails the whole list nor reaches the caller.
func WithRejected(report func(Rejected)) Option {
	return func(o *options) { o.rejected = report }
}

// listKinds are the list methods listFilter checks: the result member
// holding the definitions, and how to check one.
var listKinds = map[string]struct {
	member string
	check  func(json.RawMessage) (kind, name string, err error)
}{
	"tools/list":               {"tools", checkRaw(KindTool, CheckTool, func(t *mcp.Tool) string { return t.Name })},
	"prompts/list":             {"prompts", checkRaw(KindPrompt, CheckPrompt, func(p *mcp.Prompt) string { return p.Name })},
	"resources/list":           {"resources", checkRaw(KindResource, CheckResource, func(r *mcp.Resource) string { return r.URI })},
	"resources/templates/list": {"resourceTemplates", checkRaw(KindResourceTemplate, CheckResourceTemplate, func(t *mcp.ResourceTemplate) string { return t.URITemplate })},
}

// checkRaw decodes one listed definition as T and checks it; a definition
// that does not decode is rejected with its "name" or "uri" if it has one.
func checkRaw[T any](kind string, check func(*T) error, name func(*T) string) func(json.RawMessage) (string, string, error) {
	return func(raw json.RawMessage) (string, string, error) {
		var v *T
		if err := json.Unmarshal(raw, &v); err != nil {
			var id struct {
				Name        any `json:"name"`
				URI         any `json:"uri"`
				URITemplate any `json:"uriTemplate"`
			}
			_ = json.Unmarshal(raw, &id)
			n := id.Name
			if kind == KindResource {
				n = id.URI
			} else if kind == KindResourceTemplate {
				n = id.URITemplate
			}
			if s, ok := n.(string); ok {
				return kind, s, errMalformed
			}
			if n == nil {
				return kind, "", errMalformed
			}
			return kind, jsonText(n), errMalformed
		}
		if v == nil {
			return kind, "", check(nil)
		}
		return kind, name(v), check(v)
	}
}

var errMalformed = malformed{}

type malformed struct{}

func (malformed) Error() string { return "malformed definition (does not decode as its MCP type)" }

// listFilter is a client transport whose connection filters list results
// (WithRejected).
type listFilter struct {
	mcp.Transport
	server string
	report func(Rejected)
}

func (t listFilter) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &filterConn{Connection: c, server: t.server, report: t.report, pending: map[jsonrpc.ID]string{}}, nil
}

// filterConn remembers the ids of the list requests it writes and filters
// their responses as it reads them.
type filterConn struct {
	mcp.Connection
	server string
	report func(Rejected)
	mu     sync.Mutex
	// pending maps the id of each list request written to its method,
	// until its response is read.
	pending map[jsonrpc.ID]string
}

func (c *filterConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if r, ok := m.(*jsonrpc.Request); ok && r.ID.IsValid() {
		if _, list := listKinds[r.Method]; list {
			c.mu.Lock()
			c.pending[r.ID] = r.Method
			c.mu.Unlock()
		}
	}
	return c.Connection.Write(ctx, m)
}

func (c *filterConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	r, ok := m.(*jsonrpc.Response)
	if err != nil || !ok || !r.ID.IsValid() {
		return m, err
	}
	c.mu.Lock()
	method, list := c.pending[r.ID]
	delete(c.pending, r.ID)
	c.mu.Unlock()
	if list && r.Error == nil && len(r.Result) > 0 {
		r.Result = c.filter(method, r.Result)
	}
	return m, nil
}

// filter is result without the definitions that cannot be served; a
// result whose list is not an array is left as it is (the SDK fails it).
func (c *filterConn) filter(method string, result json.RawMessage) json.RawMessage {
	k := listKinds[method]
	var obj map[string]json.RawMessage
	if json.Unmarshal(result, &obj) != nil {
		return result
	}
	var items []json.RawMessage
	if json.Unmarshal(obj[k.member], &items) != nil {
		return result
	}
	kept := make([]json.RawMessage, 0, len(items))
	for _, raw := range items {
		kind, name, err := k.check(raw)
		if err != nil {
			c.report(Rejected{ServerID: c.server, Kind: kind, Name: name, Reason: err.Error()})
			continue
		}
		kept = append(kept, raw)
	}
	if len(kept) == len(items) {
		return result
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return result
	}
	obj[k.member] = b
	if out, err := json.Marshal(obj); err == nil {
		return out
	}
	return result
}
