package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// CodeDenied is the JSON-RPC error code of a tools/call the gateway refuses,
// with data {decision, reason_codes, tool_call_id, receipt_id, details}.
// Seed 003's sample uses -32003, but the MCP Go SDK (and so its clients)
// reads -32003 as "client is closing" and drops the session; -32030 is in
// the implementation-defined server range and collides with nothing known.
const CodeDenied = -32030

// idempotencyMeta is the _meta key a client may set to give a write call
// its idempotency key; without it the tool_call_id is used (each call is
// then its own key, so a retried MCP request is not recognised as one).
const idempotencyMeta = "dev.talos/idempotency_key"

// _meta keys of a forwarded call's result: its tool_call_id and the
// receipt of its pre decision, so a client can find its audit record.
const (
	metaToolCallID = "dev.talos/tool_call_id"
	metaReceiptID  = "dev.talos/receipt_id"
)

// denial is the data of a refused call's JSON-RPC error.
type denial struct {
	Decision    string   `json:"decision"`
	ReasonCodes []string `json:"reason_codes"`
	ToolCallID  string   `json:"tool_call_id"`
	ReceiptID   string   `json:"receipt_id,omitempty"`
	Details     []string `json:"details,omitempty"`
}

func deny(d denial) error {
	data, _ := json.Marshal(d)
	msg := "talos: denied (" + strings.Join(d.ReasonCodes, ", ") + ")"
	if d.ReceiptID != "" {
		msg += "; receipt " + d.ReceiptID
	}
	return &jsonrpc.Error{Code: CodeDenied, Message: msg, Data: data}
}

// call runs one tools/call through Talos: pre → decision (→ approval) →
// upstream → post.
func (g *Gateway) call(ctx context.Context, p *principal, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	params := req.Params
	args := params.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	ut, routed := g.byName[params.Name]
	server := unroutedServer
	if routed {
		server = ut.server
	}
	pre, err := g.envelope(p, g.sessionOf(req), server, params.Name, args, params.Meta)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "talos: " + err.Error()}
	}
	var local []string
	var localDetail string
	if routed {
		local, localDetail = g.o.Access.checkCall(p, server, params.Name, args)
	} else {
		local, localDetail = []string{schemas.CodeToolHidden, schemas.CodeUnknownTool}, "no upstream offers this tool"
	}
	log := g.log.With("tool_call_id", pre.ToolCallID, "server", server, "tool", params.Name, "principal", p.name)

	raw, err := json.Marshal(pre)
	if err != nil {
		return nil, err
	}
	if limit := g.maxEnvelope(); len(raw) > limit {
		// NATS would refuse it: record the refusal with the arguments
		// left out (their size and hash say what was refused).
		sum := sha256.Sum256(args)
		g.fail(p, pre, schemas.CodeDenyPayloadTooLarge, fmt.Sprintf("arguments of %d bytes (sha256 %s) exceed the envelope limit %d", len(args), hex.EncodeToString(sum[:]), limit), true)
		log.Warn("call denied: envelope too large", "bytes", len(raw))
		return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeDenyPayloadTooLarge}, ToolCallID: pre.ToolCallID,
			Details: []string{fmt.Sprintf("the call is %d bytes; this enforcement point sends at most %d", len(raw), limit)}})
	}
	client := g.ingestClient()
	if client == nil || g.nc.Status() != nats.CONNECTED || g.out.full() {
		g.fail(p, pre, schemas.CodeEnforcementUnavailable, "no connection to Talos", false)
		log.Warn("call denied: Talos unreachable (fail closed)")
		return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeEnforcementUnavailable}, ToolCallID: pre.ToolCallID,
			Details: []string{"the gateway has no connection to Talos; every call is denied until it returns"}})
	}

	// An approval can only follow the decision, but listen first so none
	// is missed.
	wait := g.appr.expect(pre.ToolCallID)
	defer g.appr.forget(pre.ToolCallID)
	dctx, cancel := context.WithTimeout(ctx, g.o.DecisionTimeout)
	d, err := client.Send(dctx, schemas.PhasePre, server, pre.ToolCallID, raw)
	cancel()
	switch {
	case errors.Is(err, ingest.ErrNoDecision):
		g.fail(p, pre, schemas.CodeDecisionTimeout, "no decision within "+g.o.DecisionTimeout.String(), false)
		log.Warn("call denied: no decision in time (fail closed)")
		return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeDecisionTimeout}, ToolCallID: pre.ToolCallID})
	case err != nil:
		g.fail(p, pre, schemas.CodeEnforcementUnavailable, "publish failed", false)
		log.Warn("call denied: cannot publish to Talos (fail closed)", "err", err)
		return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeEnforcementUnavailable}, ToolCallID: pre.ToolCallID})
	}
	codes := union(d.ReasonCodes, local)
	details := d.Details
	if localDetail != "" {
		details = append(slices.Clone(details), "gateway: "+localDetail)
	}
	switch d.Decision {
	case schemas.DecisionDeny:
		log.Info("call denied", "codes", codes, "receipt_id", d.ReceiptID)
		return nil, deny(denial{Decision: d.Decision, ReasonCodes: codes, ToolCallID: pre.ToolCallID, ReceiptID: d.ReceiptID, Details: details})
	case schemas.DecisionRequireApproval:
		if len(local) > 0 {
			break
		}
		log.Warn("call awaits approval", "approve", "talosctl approve "+pre.ToolCallID, "reject", "talosctl reject "+pre.ToolCallID+" --reason ...", "timeout", g.o.ApprovalTimeout)
		notify(ctx, req, "Talos: this call needs a human approval: talosctl approve "+pre.ToolCallID)
		select {
		case a := <-wait:
			if a.verb != schemas.VerbApprove {
				g.fail(p, pre, schemas.CodeApprovalRejected, "rejected by "+a.actor, false)
				log.Info("call rejected", "by", a.actor, "control_receipt", a.receiptID)
				return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeApprovalRejected}, ToolCallID: pre.ToolCallID,
					ReceiptID: a.receiptID, Details: []string{"rejected by " + a.actor}})
			}
			log.Info("call approved", "by", a.actor, "control_receipt", a.receiptID)
			return g.forward(ctx, p, pre, d.ReceiptID, ut, args, log)
		case <-time.After(g.o.ApprovalTimeout):
			g.fail(p, pre, schemas.CodeApprovalTimeout, "no approval within "+g.o.ApprovalTimeout.String(), false)
			log.Warn("call denied: no approval in time")
			return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeApprovalTimeout, schemas.CodeApprovalRequired},
				ToolCallID: pre.ToolCallID, ReceiptID: d.ReceiptID})
		case <-ctx.Done():
			g.fail(p, pre, schemas.CodeApprovalTimeout, "the client cancelled while the call awaited approval", false)
			return nil, ctx.Err()
		}
	case schemas.DecisionAllow:
		if len(local) == 0 {
			return g.forward(ctx, p, pre, d.ReceiptID, ut, args, log)
		}
	}
	// The worker did not deny, but the gateway does (a hidden tool or
	// action): say so in the post event.
	g.fail(p, pre, local[len(local)-1], localDetail, false)
	log.Info("call denied by the gateway", "codes", codes)
	return nil, deny(denial{Decision: schemas.DecisionDeny, ReasonCodes: codes, ToolCallID: pre.ToolCallID, ReceiptID: d.ReceiptID, Details: details})
}

// forward runs an allowed call on its upstream and reports it.
func (g *Gateway) forward(ctx context.Context, p *principal, pre *schemas.ToolCall, receiptID string, ut upstreamTool, args json.RawMessage, log *slog.Logger) (*mcp.CallToolResult, error) {
	up := g.upstreamOf(ut.server)
	started := time.Now()
	res, err := up.session.CallTool(ctx, &mcp.CallToolParams{Name: ut.tool.Name, Arguments: args})
	ended := time.Now()
	if err != nil {
		post, perr := g.postOf(p, pre, nil, false, started, ended)
		if perr == nil {
			post.Error = &schemas.CallError{Code: "UPSTREAM_ERROR", Kind: "upstream"}
			g.out.send(post)
		}
		log.Warn("upstream call failed", "err", err)
		return nil, err
	}
	post, err := g.postOf(p, pre, res, !res.IsError, started, ended)
	if err != nil {
		log.Warn("post event not built", "err", err)
	} else {
		g.out.send(post)
	}
	log.Info("call forwarded", "ok", !res.IsError, "ms", ended.Sub(started).Milliseconds())
	// Tell the client which audit record this is (after the post event
	// was built from the upstream's own result).
	out := *res
	out.Meta = maps.Clone(res.Meta)
	if out.Meta == nil {
		out.Meta = mcp.Meta{}
	}
	out.Meta[metaToolCallID] = pre.ToolCallID
	out.Meta[metaReceiptID] = receiptID
	return &out, nil
}

// fail reports a call the gateway refused on its own. Without the
// arguments (too large to send), the request is reduced to the tool name.
func (g *Gateway) fail(p *principal, pre *schemas.ToolCall, code, message string, dropArgs bool) {
	now := time.Now()
	src := pre
	if dropArgs {
		c := *pre
		c.Request = schemas.Request{Name: pre.Request.Name, Arguments: json.RawMessage(`{}`)}
		c.RequestHash = ""
		src = &c
	}
	post, err := g.postOf(p, src, nil, false, now, now)
	if err != nil {
		g.log.Error("post event not built", "tool_call_id", pre.ToolCallID, "err", err)
		return
	}
	post.Error = &schemas.CallError{Code: code, Kind: "denied", Message: message}
	g.out.send(post)
}

// postOf builds and signs the post envelope of pre; a nil result (the
// call did not run, or failed upstream) leaves result out.
func (g *Gateway) postOf(p *principal, pre *schemas.ToolCall, result *mcp.CallToolResult, ok bool, started, ended time.Time) (*schemas.ToolCall, error) {
	post, err := ingest.PostOf(pre, result, ok, started, ended)
	if err != nil {
		return nil, err
	}
	if result == nil {
		post.Result = nil
	}
	if p.signer != nil {
		if err := p.signer.Sign(post); err != nil {
			return nil, err
		}
	}
	return post, nil
}

// envelope builds and signs the pre envelope of a call.
func (g *Gateway) envelope(p *principal, session, server, tool string, args json.RawMessage, meta mcp.Meta) (*schemas.ToolCall, error) {
	c, err := ingest.NewCall(g.o.EPID, server, tool, args)
	if err != nil {
		return nil, err
	}
	c.SessionID = session
	c.Actor = schemas.Actor{Kind: "agent", AgentID: p.agentID}
	c.RegistryDigest = g.o.Registry.Digest()
	if t, ok := g.o.Registry.Lookup(server, tool); ok && (t.ToolClass == schemas.ClassWrite || t.ActionPointer != "") {
		c.IdempotencyKey = c.ToolCallID
		if k, ok := meta[idempotencyMeta].(string); ok && k != "" && len(k) <= 256 {
			c.IdempotencyKey = k
		}
	}
	if p.signer != nil {
		if err := p.signer.Sign(c); err != nil {
			return nil, err
		}
	} else {
		canon, err := receipts.MarshalCanonical(c.Request)
		if err != nil {
			return nil, fmt.Errorf("arguments cannot be canonicalised: %w", err)
		}
		sum := sha256.Sum256(canon)
		c.RequestHash = hex.EncodeToString(sum[:])
	}
	return c, nil
}

func (g *Gateway) upstreamOf(server string) *upstream {
	for _, u := range g.ups {
		if u.spec.ServerID == server {
			return u
		}
	}
	return nil
}

// maxEnvelope is the largest pre envelope the gateway sends.
func (g *Gateway) maxEnvelope() int {
	if g.o.MaxEnvelopeBytes > 0 {
		return g.o.MaxEnvelopeBytes
	}
	if mp := g.nc.MaxPayload(); mp > 128<<10 {
		return int(mp) - 64<<10
	}
	return 1 << 20
}

// sessionOf is the session_id of a downstream session: the streamable
// HTTP session id, or the gateway's own id for its stdio session.
func (g *Gateway) sessionOf(req *mcp.CallToolRequest) string {
	if req.Session != nil {
		if id := req.Session.ID(); id != "" {
			return id
		}
	}
	return g.o.StdioSession
}

// notify tells the client, as a log message, what the call waits for.
func notify(ctx context.Context, req *mcp.CallToolRequest, msg string) {
	if req.Session == nil {
		return
	}
	_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "warning", Logger: "talos", Data: msg})
}

// union is a's codes followed by b's not already in a.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, c := range b {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
