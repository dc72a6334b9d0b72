package gateway

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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/schemas"
)

// CodeDenied is the JSON-RPC error code of a tools/call the gateway refuses,
// with data {decision, reason_codes, tool_call_id, receipt_id, details}.
// The CSP sample uses -32003, but the MCP Go SDK (and so its clients)
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
	MetaToolCallID = "dev.talos/tool_call_id"
	MetaReceiptID  = "dev.talos/receipt_id"
)

// unroutedServer is the server_id of a call to a tool no upstream offers:
// it is still published, so the worker denies it with a receipt.
const unroutedServer = "unrouted"

// Denial is the data of a refused call's JSON-RPC error.
type Denial struct {
	Decision    string   `json:"decision"`
	ReasonCodes []string `json:"reason_codes"`
	ToolCallID  string   `json:"tool_call_id"`
	ReceiptID   string   `json:"receipt_id,omitempty"`
	Details     []string `json:"details,omitempty"`
}

func deny(d Denial) error {
	data, _ := json.Marshal(d)
	msg := "talos: denied (" + strings.Join(d.ReasonCodes, ", ") + ")"
	if d.ReceiptID != "" {
		msg += "; receipt " + d.ReceiptID
	}
	return &jsonrpc.Error{Code: CodeDenied, Message: msg, Data: data}
}

// pending is one tools/call, prompts/get or resources/read on its way
// through Talos.
type pending struct {
	p     *Principal
	ss    *mcp.ServerSession // the client session; nil in some tests
	extra *mcp.RequestExtra  // the HTTP request's, if any
	token any                // the client's progress token; nil if none
	meta  mcp.Meta           // the request's _meta
	// method is the envelope's mcp_method ("" for tools/call), name its
	// tool_name and server its server_id (unroutedServer if no upstream
	// offers it).
	method, name, server string
	routed               bool
	def                  string // tools: the definition the caller was shown (tool_definition_sha256)
	args                 json.RawMessage
	pre                  *schemas.ToolCall
	raw                  []byte // pre, as published
	// local is the gateway's own refusal (enforce.Discovery.CheckCall);
	// nil when it has no objection.
	local       []string
	localDetail string
	// cred is the upstream credential of the call (credential).
	cred credential.Credential
	log  *slog.Logger
	// upstream runs the allowed call on its upstream, on the client
	// session's relay r: its result, and whether it succeeded.
	upstream func(ctx context.Context, r *relay) (res mcp.Result, ok bool, err error)
	// parent is, for a server's request of the client, the call it was
	// made during (serverreq.go); record, if set, is what the post event
	// records of a result instead of the result itself.
	parent callInfo
	record func(mcp.Result) any
	// decided is how long the decision took (StageDecision).
	decided time.Duration
}

// call runs one tools/call through Talos: pre → decision (→ approval) →
// upstream → post.
func (g *Gateway) call(ctx context.Context, p *Principal, req *mcp.CallToolRequest) (mcp.Result, error) {
	return g.run(ctx, g.toolCall(p, req))
}

// toolCall is a tools/call to decide, with the gateway's own verdict on it.
func (g *Gateway) toolCall(p *Principal, req *mcp.CallToolRequest) *pending {
	params := req.Params
	c := &pending{p: p, ss: req.Session, extra: req.Extra, token: params.GetProgressToken(), meta: params.Meta,
		name: params.Name, server: unroutedServer, args: params.Arguments}
	g.mu.Lock()
	ut, routed := g.byName[params.Name]
	ut = g.current(ut)
	g.mu.Unlock()
	if !routed {
		c.local, c.localDetail = []string{schemas.CodeToolHidden, schemas.CodeUnknownTool}, "no upstream offers this tool"
		return c
	}
	c.server, c.routed, c.def = ut.server, true, ut.def
	c.local, c.localDetail = g.o.Discovery.CheckCall(p.Viewer, ut.server, params.Name, nonNull(c.args))
	if drift, why := ut.drift(g.o.Registry); drift {
		// The definition the caller was shown differs from the registry's
		// pin (DENY_TOOL_DRIFT, OWASP MCP03): the worker denies it, and so
		// does the gateway.
		c.local = append(c.local, schemas.CodeDenyToolDrift)
		c.localDetail = strings.TrimPrefix(c.localDetail+"; "+why, "; ")
	}
	c.upstream = func(ctx context.Context, r *relay) (mcp.Result, bool, error) {
		res, err := r.callTool(ctx, ut.server, &mcp.CallToolParams{Name: ut.tool.Name, Arguments: c.args}, c.token, c.def)
		if err != nil {
			return nil, false, err
		}
		return res, !res.IsError, nil
	}
	return c
}

// nonNull is args, or {} when absent or null.
func nonNull(args json.RawMessage) json.RawMessage {
	if len(args) == 0 || string(args) == "null" {
		return json.RawMessage(`{}`)
	}
	return args
}

// run has Talos decide c, then forwards it, parks it for a human, or
// denies it.
func (g *Gateway) run(ctx context.Context, c *pending) (mcp.Result, error) {
	if err := g.prepare(ctx, c); err != nil {
		return nil, err
	}
	client, err := g.admit(c)
	if err != nil {
		return nil, err
	}
	// An approval can only follow the decision, but listen first so none
	// is missed. An approval names the call with this gateway's ep_id
	// (<ep_id>:<tool_call_id>): another enforcement point's call with the
	// same tool_call_id is not this one.
	target := schemas.EPCallID(g.o.EPID, c.pre.ToolCallID)
	wait := g.appr.Expect(target)
	defer g.appr.Forget(target)
	d, err := g.decide(ctx, client, c)
	if err != nil {
		return nil, err
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("talos.decision", d.Decision),
		attribute.StringSlice("talos.reason_codes", d.ReasonCodes), attribute.String("talos.receipt_id", d.ReceiptID))
	return g.resolve(ctx, c, d, wait)
}

// prepare builds the call's signed pre envelope (carrying the definition
// the caller was shown, which the worker compares with the registry's pin)
// and obtains its upstream credential.
func (g *Gateway) prepare(ctx context.Context, c *pending) error {
	c.args = nonNull(c.args)
	pre, err := g.envelope(ctx, c.p, g.sessionOf(c.ss), c)
	if err != nil {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "talos: " + err.Error()}
	}
	c.pre = pre
	pre.ToolDefinitionSHA256 = c.def
	if c.parent.toolCallID != "" {
		pre.ParentToolCallID, pre.TraceID = c.parent.toolCallID, c.parent.traceID
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("gen_ai.tool.call.id", pre.ToolCallID))
	g.credential(ctx, c)
	c.log = g.log.With("tool_call_id", pre.ToolCallID, "server", c.server, "tool", c.name, "principal", c.p.Name)
	if c.method != "" {
		c.log = c.log.With("mcp_method", c.method)
	}
	c.raw, err = json.Marshal(pre)
	return err
}

// admit refuses, with a post event saying why, a call NATS would refuse
// (too large) or that cannot reach Talos now (fail closed).
func (g *Gateway) admit(c *pending) (*ep.Client, error) {
	pre := c.pre
	if limit := g.maxEnvelope(); len(c.raw) > limit {
		// NATS would refuse it: record the refusal with the arguments
		// left out (their size and hash say what was refused).
		sum := sha256.Sum256(c.args)
		g.fail(c.p, pre, schemas.CodeDenyPayloadTooLarge, fmt.Sprintf("arguments of %d bytes (sha256 %s) exceed the envelope limit %d", len(c.args), hex.EncodeToString(sum[:]), limit), true)
		c.log.Warn("call denied: envelope too large", "bytes", len(c.raw))
		return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeDenyPayloadTooLarge}, ToolCallID: pre.ToolCallID,
			Details: []string{fmt.Sprintf("the call is %d bytes; this enforcement point sends at most %d", len(c.raw), limit)}})
	}
	client := g.ingestClient()
	if client == nil || g.nc.Status() != nats.CONNECTED || g.out.Full() {
		g.fail(c.p, pre, schemas.CodeEnforcementUnavailable, "no connection to Talos", false)
		c.log.Warn("call denied: Talos unreachable (fail closed)")
		return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeEnforcementUnavailable}, ToolCallID: pre.ToolCallID,
			Details: []string{"the gateway has no connection to Talos; every call is denied until it returns"}})
	}
	return client, nil
}

// decide publishes the pre envelope and waits for its decision; none in
// time, or no publish, is a deny.
func (g *Gateway) decide(ctx context.Context, client *ep.Client, c *pending) (*schemas.Decision, error) {
	pre := c.pre
	dctx, cancel := context.WithTimeout(ctx, g.o.DecisionTimeout)
	start := time.Now()
	d, err := client.SendHashed(dctx, schemas.PhasePre, pre.ServerID, pre.ToolCallID, pre.RequestHash, c.raw)
	cancel()
	if err == nil {
		c.decided = time.Since(start)
		observe(g.stages.decision, c.decided)
	}
	switch {
	case errors.Is(err, ep.ErrNoDecision):
		g.fail(c.p, pre, schemas.CodeDecisionTimeout, "no decision within "+g.o.DecisionTimeout.String(), false)
		c.log.Warn("call denied: no decision in time (fail closed)")
		return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeDecisionTimeout}, ToolCallID: pre.ToolCallID})
	case err != nil:
		g.fail(c.p, pre, schemas.CodeEnforcementUnavailable, "publish failed", false)
		c.log.Warn("call denied: cannot publish to Talos (fail closed)", "err", err)
		return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeEnforcementUnavailable}, ToolCallID: pre.ToolCallID})
	}
	return d, nil
}

// resolve acts on the worker's decision and the gateway's own verdict:
// forward, wait for a human, or deny.
func (g *Gateway) resolve(ctx context.Context, c *pending, d *schemas.Decision, wait <-chan ep.Resolution) (mcp.Result, error) {
	codes := union(d.ReasonCodes, c.local)
	details := d.Details
	if c.localDetail != "" {
		details = append(slices.Clone(details), "gateway: "+c.localDetail)
	}
	switch d.Decision {
	case schemas.DecisionDeny:
		g.registryMismatch(d)
		c.log.Info("call denied", "codes", codes, "receipt_id", d.ReceiptID)
		return nil, deny(Denial{Decision: d.Decision, ReasonCodes: codes, ToolCallID: c.pre.ToolCallID, ReceiptID: d.ReceiptID, Details: details})
	case schemas.DecisionRequireApproval:
		if len(c.local) == 0 {
			return g.awaitApproval(ctx, c, d, wait)
		}
	case schemas.DecisionAllow:
		if len(c.local) == 0 {
			return g.forward(ctx, c, d.ReceiptID)
		}
	}
	// The worker did not deny, but the gateway does (a hidden tool or
	// action): say so in the post event.
	g.fail(c.p, c.pre, c.local[len(c.local)-1], c.localDetail, false)
	c.log.Info("call denied by the gateway", "codes", codes)
	return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: codes, ToolCallID: c.pre.ToolCallID, ReceiptID: d.ReceiptID, Details: details})
}

// registryMismatch says plainly, once per registry Talos enforces, that a
// denial REGISTRY_VERSION_MISMATCH is not about the call: this gateway's
// --registry is not the registry the workers enforce (their --registry
// or its registry.pin), so every call is denied until the two agree. The
// gateway cannot read the pin (its NATS user reads no more of
// TALOS_CONTROL than approvals), so the first such denial tells.
func (g *Gateway) registryMismatch(d *schemas.Decision) {
	if !slices.Contains(d.ReasonCodes, schemas.CodeRegistryVersionMismatch) {
		return
	}
	if _, seen := g.mismatched.LoadOrStore(d.RegistryDigest, true); seen {
		return
	}
	g.log.Error("Talos enforces another registry than this gateway's --registry: every call is denied REGISTRY_VERSION_MISMATCH until they agree; start the gateway with the registry talosd enforces (talosctl registry show names a pinned one; without a pin, talosd's --registry)",
		"gateway_registry_digest", g.o.Registry.Digest(), "enforced_registry_digest", d.RegistryDigest)
}

// awaitApproval parks a require_approval call until `talosctl approve` or
// `reject` resolves it, the approval timeout passes, or the client leaves.
func (g *Gateway) awaitApproval(ctx context.Context, c *pending, d *schemas.Decision, wait <-chan ep.Resolution) (mcp.Result, error) {
	pre, log := c.pre, c.log
	log.Warn("call awaits approval", "approve", "talosctl approve "+pre.ToolCallID, "reject", "talosctl reject "+pre.ToolCallID+" --reason ...", "timeout", g.o.ApprovalTimeout)
	notify(ctx, c.ss, "Talos: this call needs a human approval: talosctl approve "+pre.ToolCallID)
	select {
	case a := <-wait:
		if a.Verb != schemas.VerbApprove {
			g.fail(c.p, pre, schemas.CodeApprovalRejected, "rejected by "+a.Actor, false)
			log.Info("call rejected", "by", a.Actor, "control_receipt", a.ReceiptID)
			return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeApprovalRejected}, ToolCallID: pre.ToolCallID,
				ReceiptID: a.ReceiptID, Details: []string{"rejected by " + a.Actor}})
		}
		log.Info("call approved", "by", a.Actor, "control_receipt", a.ReceiptID)
		return g.forward(ctx, c, d.ReceiptID)
	case <-time.After(g.o.ApprovalTimeout):
		g.fail(c.p, pre, schemas.CodeApprovalTimeout, "no approval within "+g.o.ApprovalTimeout.String(), false)
		log.Warn("call denied: no approval in time")
		return nil, deny(Denial{Decision: schemas.DecisionDeny, ReasonCodes: []string{schemas.CodeApprovalTimeout, schemas.CodeApprovalRequired},
			ToolCallID: pre.ToolCallID, ReceiptID: d.ReceiptID})
	case <-ctx.Done():
		g.fail(c.p, pre, schemas.CodeApprovalTimeout, "the client cancelled while the call awaited approval", false)
		return nil, ctx.Err()
	}
}

// forward runs an allowed call on its upstream and reports it.
func (g *Gateway) forward(ctx context.Context, c *pending, receiptID string) (mcp.Result, error) {
	if c.cred.Token != "" {
		ctx = credential.WithToken(ctx, c.cred.Token)
	}
	started := time.Now()
	res, ok, err := c.upstream(withCall(ctx, c.pre), g.relayOf(c.p, c.ss))
	ended := time.Now()
	observe(g.stages.upstream, ended.Sub(started))
	if err != nil {
		post, perr := ep.SignedPost(c.pre, nil, false, started, ended, c.p.Signer)
		if perr == nil {
			post.Error = &schemas.CallError{Code: "UPSTREAM_ERROR", Kind: "upstream"}
			if errors.Is(err, errSessionDrift) {
				post.Error = &schemas.CallError{Code: schemas.CodeDenyToolDrift, Kind: "denied", Message: err.Error()}
			}
			g.out.Send(post)
		}
		observe(g.stages.post, time.Since(ended))
		c.log.Warn("upstream call failed", "err", err)
		return nil, err
	}
	var recorded any = res
	if c.record != nil {
		recorded = c.record(res)
	}
	post, err := ep.SignedPost(c.pre, recorded, ok, started, ended, c.p.Signer)
	if err != nil {
		c.log.Warn("post event not built", "err", err)
	} else {
		g.out.Send(post)
	}
	posted := time.Now()
	observe(g.stages.post, posted.Sub(ended))
	c.log.Info("call forwarded", "ok", ok, "ms", ended.Sub(started).Milliseconds(),
		"decision", c.decided.Round(time.Microsecond), "post", posted.Sub(ended).Round(time.Microsecond))
	// Tell the client which audit record this is (after the post event
	// was built from the upstream's own result).
	return stamped(res, c.pre.ToolCallID, receiptID), nil
}

// stamped is a copy of res whose _meta names its tool_call_id and the
// receipt of its pre decision.
func stamped(res mcp.Result, toolCallID, receiptID string) mcp.Result {
	ids := func(m mcp.Meta) mcp.Meta {
		out := maps.Clone(m)
		if out == nil {
			out = mcp.Meta{}
		}
		out[MetaToolCallID], out[MetaReceiptID] = toolCallID, receiptID
		return out
	}
	switch r := res.(type) {
	case *mcp.CallToolResult:
		out := *r
		out.Meta = ids(r.Meta)
		return &out
	case *mcp.GetPromptResult:
		out := *r
		out.Meta = ids(r.Meta)
		return &out
	case *mcp.ReadResourceResult:
		out := *r
		out.Meta = ids(r.Meta)
		return &out
	}
	return res
}

// fail reports a call the gateway refused on its own. Without the
// arguments (too large to send), the request is reduced to the tool name.
func (g *Gateway) fail(p *Principal, pre *schemas.ToolCall, code, message string, dropArgs bool) {
	now := time.Now()
	src := pre
	if dropArgs {
		c := *pre
		c.Request = schemas.Request{Name: pre.Request.Name, Arguments: json.RawMessage(`{}`)}
		c.RequestHash = ""
		src = &c
	}
	post, err := ep.SignedPost(src, nil, false, now, now, p.Signer)
	if err != nil {
		g.log.Error("post event not built", "tool_call_id", pre.ToolCallID, "err", err)
		return
	}
	post.Error = &schemas.CallError{Code: code, Kind: "denied", Message: message}
	g.out.Send(post)
}

// envelope builds and signs the pre envelope of call pc. Without a
// capability the envelope still carries its request_hash. The trace
// context of ctx, if any, becomes its trace_id and parent_span_id.
func (g *Gateway) envelope(ctx context.Context, p *Principal, session string, pc *pending) (*schemas.ToolCall, error) {
	server, tool := pc.server, pc.name
	c, err := ep.NewCall(g.o.EPID, server, tool, pc.args)
	if err != nil {
		return nil, err
	}
	c.MCPMethod = pc.method
	if traceID, parent, ok := tracing.Envelope(ctx); ok {
		c.TraceID, c.ParentSpanID = traceID, parent
	}
	c.SessionID = session
	c.Actor = schemas.Actor{Kind: "agent", AgentID: p.AgentID}
	c.RegistryDigest = g.o.Registry.Digest()
	c.WorkspaceRoot = g.o.Workspaces[server]
	if us, ok := g.o.UpstreamSandboxes[server]; ok {
		c.UpstreamSandbox = &us
	}
	if t, ok := g.o.Registry.LookupMethod(server, pc.method, tool); ok && (t.ToolClass == schemas.ClassWrite || t.ActionPointer != "") {
		c.IdempotencyKey = c.ToolCallID
		if k, ok := pc.meta[idempotencyMeta].(string); ok && k != "" && len(k) <= 256 {
			c.IdempotencyKey = k
		}
	}
	if p.Signer != nil {
		if err := p.Signer.Sign(c); err != nil {
			return nil, err
		}
	} else if err := ep.HashRequest(c); err != nil {
		return nil, fmt.Errorf("arguments cannot be canonicalised: %w", err)
	}
	return c, nil
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
func (g *Gateway) sessionOf(ss *mcp.ServerSession) string {
	if ss != nil {
		if id := ss.ID(); id != "" {
			return id
		}
	}
	return g.o.StdioSession
}

// notify tells the client, as a log message, what the call waits for.
func notify(ctx context.Context, ss *mcp.ServerSession, msg string) {
	if ss == nil {
		return
	}
	_ = ss.Log(ctx, &mcp.LoggingMessageParams{Level: "warning", Logger: "talos", Data: msg})
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
