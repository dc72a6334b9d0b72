package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// A server's requests of the client (sampling/createMessage,
// elicitation/create, roots/list) are recorded by Talos, linked to the call during
// which the server made them (issue 21): before the gateway asks the
// client, it publishes a pre envelope with mcp_method the method,
// tool_name the method, the request's params as its arguments (which the
// worker redacts and hashes) and parent_tool_call_id and trace_id the
// call's; the worker checks it against the incident state only (a kill
// switch or quarantine refuses it: the server gets the denial, the client
// is never asked). The post event records the client's answer as its
// hash alone ({sha256}, and an elicitation's action), never its content.

// callInfo names a call being forwarded: what a server request made while
// serving it is linked to.
type callInfo struct{ toolCallID, traceID string }

type callKey struct{}

// withCall is ctx carrying the call of pre, which forward gives the
// upstream request it makes, so that the relay's context of that request
// (relay.context) names the call.
func withCall(ctx context.Context, pre *schemas.ToolCall) context.Context {
	return context.WithValue(ctx, callKey{}, callInfo{pre.ToolCallID, pre.TraceID})
}

// callOf is the call ctx serves, if any.
func callOf(ctx context.Context) (callInfo, bool) {
	c, ok := ctx.Value(callKey{}).(callInfo)
	return c, ok
}

// serverRequest has Talos record (and check) the request method that
// serverID made of r's client while serving one of its requests (ctx is
// the upstream's), then asks the client with ask, under the context of
// the client's request the server is serving.
func (g *Gateway) serverRequest(ctx context.Context, r *relay, serverID, method string, params any, ask func(context.Context) (mcp.Result, error)) (mcp.Result, error) {
	cctx := r.context(serverID, ctx)
	args, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	p := r.principal()
	if p == nil {
		p = &Principal{}
	}
	c := &pending{p: p, ss: r.client(), method: method, name: method, server: serverID, args: args, record: answerDigest}
	c.parent, _ = callOf(cctx)
	c.upstream = func(context.Context, *relay) (mcp.Result, bool, error) {
		res, err := ask(cctx)
		if err != nil {
			return nil, false, err
		}
		return res, true, nil
	}
	return g.run(cctx, c)
}

// answerDigest is what a post event records of the client's answer to a
// server request: the hex sha256 of its RFC 8785 form, and an
// elicitation's action; nil when there is none.
func answerDigest(res mcp.Result) any {
	if res == nil {
		return nil
	}
	b, err := json.Marshal(res)
	if err == nil {
		b, err = jsonkit.Canonicalize(b)
	}
	if err != nil {
		return map[string]string{"sha256": ""}
	}
	sum := sha256.Sum256(b)
	out := map[string]string{"sha256": hex.EncodeToString(sum[:])}
	if e, ok := res.(*mcp.ElicitResult); ok {
		out["action"] = e.Action
	}
	return out
}
