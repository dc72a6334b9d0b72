// Package gateway is Talos's enforcement point for MCP: it sits between
// an MCP client and one or more upstream MCP servers. tools/list shows each
// principal only what the registry and its capability allow
// (enforce.Discovery); every tools/call is published to Talos as a signed
// pre envelope, decided by a worker (allow, deny, require_approval),
// forwarded only when allowed or approved, and reported afterwards through
// the post outbox with its result and timing (spooled to disk under
// Options.SpoolDir until JetStream has it). Without an answer from Talos
// the call is denied (fail closed). A tool whose definition drifted from
// its registry pin is hidden and denied (drift.go, OWASP MCP03). The rest
// of MCP (prompts, resources, completion, logging, progress, cancellation,
// and sampling, elicitation and roots/list asked of the client) is relayed
// per client session (relay.go, features.go), and a definition an
// upstream lists that cannot be served is hidden (mcpup.WithRejected).
// No request is answered before the gateway is first connected to Talos.
//
// cmd/talos-mcp-gateway fills a Config from its flags; Prepare validates
// it and composes the parts (registry, principals, HTTPOptions, upstream
// specs, credentials, NATS options, Workspaces, sandboxes) into a Setup,
// whose errors that are the operator's wrap ErrUsage. Then the upstreams
// (Setup.ConnectUpstreams), the Gateway (Setup.New), Start, and
// Setup.Serve over stdio or ListenHTTP; Close at exit drains the outbox
// and closes the upstreams, Setup.Close the sandboxes after them.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/jspub"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Options configure a Gateway. Zero values mean the defaults in New.
type Options struct {
	EPID     string
	Registry *enforce.Registry
	// Discovery is the exfiltration guard; its Registry is set from
	// Registry.
	Discovery       enforce.Discovery
	DecisionTimeout time.Duration // default 5 s
	ApprovalTimeout time.Duration // default 2 min
	// MaxEnvelopeBytes bounds a pre envelope; larger calls are denied
	// locally (NATS would refuse them). Default: the server's max payload
	// less 64 KiB.
	MaxEnvelopeBytes int
	// StdioSession is the session_id of calls from the stdio session
	// (default stdio-<uuid>, new each start).
	StdioSession string
	// Workspaces is the workspace the gateway serves per server_id (an
	// absolute, clean path), sent as every envelope's workspace_root: the
	// root preflight confines path arguments to when the registry defers
	// to the enforcement point (CSP MUST 7, VAL-03).
	Workspaces map[string]string
	Logger     *slog.Logger
	Version    string
	// Credentials broker the upstream credential of each call (CSP MUST
	// 5); nil: every server is mode none. Give ConnectUpstreams the same.
	Credentials *credential.Broker
	// SpoolDir is where the two outboxes keep what waits for NATS, in
	// SpoolPosts and SpoolReports (ep.OpenOutbox), so that a gateway
	// killed while NATS is down sends it at its next start; "": in
	// memory only.
	SpoolDir string
	// RelayUngoverned offers the upstreams' resource subscriptions and
	// completions, relayed without a decision or a receipt (Talos does not
	// decide them); false: neither is offered. Prompts and resources are
	// decided like tools and offered either way.
	RelayUngoverned bool
	// TrustedKeys are talosd's public keys: an approve or reject event
	// releases a parked call only if one of them signed it, and a
	// decision is taken only if one of them signed its receipt. None:
	// parked calls are denied when their wait times out (fail closed), and
	// decisions are taken on their request hash alone.
	TrustedKeys verify.KeySet
	// Tracing records MCP server spans for what clients send and MCP
	// client spans for what goes upstream (give ConnectUpstreams the
	// same); nil or disabled: none, though a client's trace context still
	// reaches Talos and the upstream.
	Tracing *tracing.Provider
	// UpstreamSandboxes is how each stdio upstream runs (CSP MUST 8), by
	// server_id, sent as its calls' upstream_sandbox; a server not in it
	// (an HTTP upstream) is sent none.
	UpstreamSandboxes map[string]schemas.UpstreamSandbox
}

// The spool directories of the gateway's outboxes, under Options.SpoolDir.
const (
	SpoolPosts   = "posts"   // post events: calls that ran, or that the gateway refused
	SpoolReports = "reports" // reports of refused requests and tool drift
)

// Gateway is the enforcement point between MCP clients and upstream MCP
// servers: every tools/call is published to Talos, decided by a worker,
// forwarded only on allow (or a human approval), and reported after it ran.
type Gateway struct {
	o      Options
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	client *ep.Client
	out    *ep.Outbox
	appr   *ep.Approvals
	// refused carries the reports of refused HTTP requests
	// (refusals), apart from out so they can never deny a call.
	refused *ep.Outbox
	metrics *prometheus.Registry
	authRef *prometheus.CounterVec // talos_gateway_auth_refusals_total
	// driftRef counts drifted tool definitions
	// (talos_gateway_tool_drift_total), and drifted holds the
	// server/tool/live-hash keys already reported (reportDrift; g.mu).
	driftRef *prometheus.CounterVec
	drifted  map[string]bool
	driftOut reportOutbox // g.refused
	// stages times each decided request's way through the gateway
	// (talos_gateway_stage_seconds; stage.go).
	stages stages

	ups   []*Upstream
	creds *credential.Broker

	// Shutdown order: Close cancels the approval follower and the upstream
	// watchers (Start) and waits for them, drains the outbox, then closes
	// the upstream sessions.
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// ready is closed once the gateway is first connected to Talos (its
	// decision subscription made); until then no request is answered
	// (waitReady).
	ready     chan struct{}
	readyOnce sync.Once

	// stdio says the one client session is served over stdio (Setup.Serve):
	// it relays over the upstreams' own sessions (shared). Otherwise each
	// client session has a relay of its own (relays; relayMu), closed when
	// it ends. progress routes the progress tokens of forwarded requests
	// (mapProgress).
	stdio    bool
	shared   *relay
	relayMu  sync.Mutex
	relays   map[*mcp.ServerSession]*relay
	progress sync.Map

	// mu guards the fields below and the upstreams' tools. Tool lists
	// change when an upstream announces a new one (refresh).
	mu     sync.Mutex
	byName map[string]upstreamTool // downstream tool name → its upstream tool
	// features routes prompts, resources and templates (features.go).
	features featureRoutes
	servers  map[string]*mcp.Server // principal name → its server
	served   map[string]*Principal  // principal name → the principal
	// sessionDrift holds, by server_id and tool name (driftKey), a
	// definition that drifted from its pin as listed by an upstream
	// session made for one HTTP client (sessionTools): the tool is then
	// drifted for every client, for the gateway's life.
	sessionDrift map[string]upstreamTool
	// mismatched holds the registry digests Talos enforced in a
	// REGISTRY_VERSION_MISMATCH denial, each logged once
	// (registryMismatch).
	mismatched sync.Map
}

// New builds a gateway over connected upstreams and a NATS connection
// (which may still be reconnecting: calls are denied until it is up).
func New(o Options, nc *nats.Conn, ups []*Upstream) (*Gateway, error) {
	if !schemas.ValidID(o.EPID) {
		return nil, fmt.Errorf("ep_id %q must match %s", o.EPID, schemas.IDPattern)
	}
	if o.Registry == nil {
		return nil, errors.New("a registry is required")
	}
	if o.DecisionTimeout <= 0 {
		o.DecisionTimeout = 5 * time.Second
	}
	if o.ApprovalTimeout <= 0 {
		o.ApprovalTimeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.StdioSession == "" {
		o.StdioSession = "stdio-" + uuid.NewString()
	}
	js, err := jspub.New(nc)
	if err != nil {
		return nil, err
	}
	o.Discovery.Registry = o.Registry
	if o.Credentials == nil {
		o.Credentials = credential.New(nil, credential.Options{})
	}
	g := &Gateway{o: o, log: o.Logger, nc: nc, js: js, ups: ups, creds: o.Credentials, servers: map[string]*mcp.Server{}, served: map[string]*Principal{}, ready: make(chan struct{})}
	g.appr = ep.NewApprovals(js, ep.ApprovalOptions{Keys: o.TrustedKeys, Logger: o.Logger})
	if err := g.openOutboxes(); err != nil {
		return nil, err
	}
	g.metrics = prometheus.NewRegistry()
	g.authRef = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "talos_gateway_auth_refusals_total",
		Help: "HTTP requests refused for want of valid credentials, by reason, and whether Talos was told (receipted) or the refusal limits left it out."},
		[]string{"reason", "receipted"})
	g.driftRef = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "talos_gateway_tool_drift_total",
		Help: "Tool definitions seen drifted from their registry pin, once per tool and live definition hash."},
		[]string{"server_id", "tool"})
	g.stages = newStages()
	g.metrics.MustRegister(g.authRef, g.driftRef, g.stages.vec)
	o.Tracing.Register(g.metrics)
	g.drifted, g.driftOut, g.sessionDrift = map[string]bool{}, g.refused, map[string]upstreamTool{}
	g.byName = route(o.Registry, ups, o.Logger)
	g.features = routeFeatures(ups)
	if !o.RelayUngoverned {
		g.log.Info("upstream resource subscriptions and completions are not offered: Talos does not decide them (--relay-ungoverned relays them undecided)")
	}
	g.relays, g.shared = map[*mcp.ServerSession]*relay{}, newRelay(g, nil, false)
	for _, u := range ups {
		g.shared.sessions[u.spec.ServerID] = u.session
		u.peer.Store(g.shared)
	}
	g.reportDrift(g.byName) // queued now, sent once Start connects the outbox
	return g, nil
}

// openOutboxes opens the outboxes, spooled under o.SpoolDir when set.
func (g *Gateway) openOutboxes() error {
	sub := func(name string) string {
		if g.o.SpoolDir == "" {
			return ""
		}
		return filepath.Join(g.o.SpoolDir, name)
	}
	var err error
	if g.out, err = ep.OpenOutbox(g.log, sub(SpoolPosts)); err != nil {
		return err
	}
	if g.refused, err = ep.OpenOutbox(g.log, sub(SpoolReports)); err != nil {
		g.out.Drain(0)
		return err
	}
	return nil
}

// route maps downstream tool names to upstream tools. Names are one flat
// namespace: on a clash a protected tool (built_in, or from an internal
// server) wins; otherwise the first upstream listed keeps the name and the
// clash is logged.
func route(reg *enforce.Registry, ups []*Upstream, log *slog.Logger) map[string]upstreamTool {
	byName := map[string]upstreamTool{}
	for _, u := range ups {
		for _, ut := range u.tools {
			t := ut.tool
			cur, taken := byName[t.Name]
			if !taken {
				byName[t.Name] = ut
				continue
			}
			if rt, ok := reg.Lookup(u.spec.ServerID, t.Name); ok && enforce.Protected(rt) {
				if ct, ok := reg.Lookup(cur.server, t.Name); !ok || !enforce.Protected(ct) {
					byName[t.Name] = ut
					continue
				}
			}
			log.Warn("tool name offered by two upstreams; the first keeps it",
				"tool", t.Name, "kept", cur.server, "hidden", u.spec.ServerID)
		}
	}
	return byName
}

// Start connects the gateway to Talos: the approval follower, the decision
// subscription and the post outbox. The subscription is in place when it
// returns if NATS is reachable; while it is not, calls are denied
// (ENFORCEMENT_UNAVAILABLE) and Start keeps trying in the background.
func (g *Gateway) Start(ctx context.Context) {
	g.out.Start(g.js)
	g.refused.Start(g.js)
	wctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.appr.Run(wctx)
	}()
	for _, u := range g.ups {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.watch(wctx, u)
		}()
	}
	// Decisions are subscribed to only once the approval follower knows
	// where it reads from, so no call is parked before its approval could
	// be read. When NATS is up that is before Start returns, so the first
	// call finds the client; otherwise keep trying in the background (calls
	// are denied, fail closed, until then).
	if g.nc.IsConnected() {
		select {
		case <-g.appr.Ready():
		case <-time.After(5 * time.Second):
		}
	}
	if g.approvalsReady() && g.subscribe() {
		return
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if g.approvalsReady() && g.subscribe() {
				return
			}
		}
	}()
}

// approvalsReady reports whether the approval follower knows where it
// reads from (ep.Approvals.Ready; the follower logs why it waits).
func (g *Gateway) approvalsReady() bool {
	select {
	case <-g.appr.Ready():
		return true
	default:
		return false
	}
}

// subscribe makes the enforcement-point client (its decision subscription).
func (g *Gateway) subscribe() bool {
	c, err := ep.NewClientWithOptions(g.nc, g.js, g.o.EPID, ep.ClientOptions{Keys: g.o.TrustedKeys})
	if err != nil {
		g.log.Warn("waiting for NATS to subscribe to decisions", "err", err)
		return false
	}
	g.mu.Lock()
	g.client = c
	g.mu.Unlock()
	g.readyOnce.Do(func() { close(g.ready) })
	return true
}

// Ready is closed once the gateway is first connected to Talos: from
// then on its MCP servers answer requests.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// waitReady holds each request a client sends until the gateway is first
// connected to Talos (Ready), so that no request, the handshake included,
// is answered before a call can be decided: a client waits on its
// initialize rather than have its first call refused
// ENFORCEMENT_UNAVAILABLE. A request whose client leaves first ends with
// its context; notifications pass at once. A later loss of the connection
// denies calls as before.
func (g *Gateway) waitReady(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if !strings.HasPrefix(method, "notifications/") {
			select {
			case <-g.ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return next(ctx, method, req)
	}
}

// Close stops the approval follower and the upstream watchers, waits (up
// to wait) for queued post events to reach Talos, then closes the
// upstream sessions. Close the NATS connection after it.
func (g *Gateway) Close(wait time.Duration) {
	if g.cancel != nil {
		g.cancel()
	}
	// The client sessions of HTTP mode end, and with them their relays'
	// upstream sessions.
	g.relayMu.Lock()
	for ss := range g.relays {
		_ = ss.Close()
	}
	g.relayMu.Unlock()
	g.wg.Wait()
	g.undelivered("post events", g.out, g.out.Drain(wait))
	g.undelivered("reports of refused requests", g.refused, g.refused.Drain(wait/2))
	CloseUpstreams(g.ups)
}

// undelivered logs the n events of out not delivered before exit: kept
// in its spool for the next start, or lost with the process.
func (g *Gateway) undelivered(what string, out *ep.Outbox, n int) {
	switch {
	case n == 0:
	case out.Dir() != "":
		g.log.Warn(what+" not delivered to Talos before exit; kept in the spool for the next start", "count", n, "spool", out.Dir())
	default:
		g.log.Error(what+" not delivered to Talos before exit", "count", n)
	}
}

// Tools is how many downstream tool names the gateway routes.
func (g *Gateway) Tools() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byName)
}

// Connected reports whether the NATS connection to Talos is up.
func (g *Gateway) Connected() bool { return g.nc.IsConnected() }

func (g *Gateway) ingestClient() *ep.Client {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.client
}

// Server is the MCP server one principal sees: only the tools discovery
// lets it see, with action enums narrowed, and every tools/call (visible
// or not) handled by the gateway.
func (g *Gateway) Server(p *Principal) *mcp.Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.servers[p.Name]; s != nil {
		return s
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "talos-mcp-gateway", Version: g.o.Version}, g.serverOptions(p))
	for _, name := range sortedKeys(g.byName) {
		if t, ok := g.listed(p, name); ok {
			s.AddTool(t, g.unreached(p))
		}
	}
	g.offerFeatures(s, p, featureRoutes{}, g.features)
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch r := req.(type) {
			case *mcp.CallToolRequest:
				return g.call(ctx, p, r)
			case *mcp.GetPromptRequest:
				return g.run(ctx, g.promptCall(p, r))
			case *mcp.ReadResourceRequest:
				return g.run(ctx, g.resourceCall(p, r))
			case *mcp.ServerRequest[*mcp.SetLoggingLevelParams]:
				// The session keeps the level for what the gateway logs to
				// it; the upstreams get it too.
				res, err := next(ctx, method, req)
				if err == nil {
					g.relayOf(p, r.Session).setLevel(ctx, r.Params.Level)
				}
				return res, err
			}
			return next(ctx, method, req)
		}
	})
	s.AddReceivingMiddleware(g.waitReady)
	s.AddReceivingMiddleware(g.traceServer) // outermost: added last
	g.servers[p.Name] = s
	g.served[p.Name] = p
	return s
}

// unreached is the tool handler of p's server; the middleware handles
// every tools/call, so it is not reached.
func (g *Gateway) unreached(p *Principal) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := g.call(ctx, p, req)
		if err != nil {
			return nil, err
		}
		return res.(*mcp.CallToolResult), nil
	}
}

// listed is the tool name as p's tools/list shows it, with its action
// enum narrowed to the actions open to p; false when p does not see it,
// or when its definition drifted from its registry pin (OWASP MCP03).
// Call it with g.mu held.
func (g *Gateway) listed(p *Principal, name string) (*mcp.Tool, bool) {
	ut, ok := g.byName[name]
	if !ok {
		return nil, false
	}
	ut = g.current(ut)
	if drift, why := ut.drift(g.o.Registry); drift {
		g.log.Debug("tool hidden", "principal", p.Name, "server", ut.server, "tool", name, "why", why)
		return nil, false
	}
	v := g.o.Discovery.See(p.Viewer, ut.server, name)
	if v.Hidden {
		g.log.Debug("tool hidden", "principal", p.Name, "server", ut.server, "tool", name, "why", v.Detail)
		return nil, false
	}
	t := *ut.tool
	if v.Actions != nil {
		schema, err := mcpup.FilterActionEnum(rawSchema(t.InputSchema), v.Tool.ActionPointer, v.Actions)
		if err != nil {
			g.log.Warn("cannot narrow the action enum; tool hidden", "tool", name, "err", err)
			return nil, false
		}
		t.InputSchema = schema
		t.Description = strings.TrimSpace(t.Description + " (actions open to you: " + strings.Join(v.Actions, ", ") + ")")
	}
	if t.InputSchema == nil {
		t.InputSchema = json.RawMessage(`{"type":"object"}`)
	}
	return &t, true
}

// rawSchema is an upstream tool's input schema as JSON.
func rawSchema(s any) json.RawMessage {
	if r, ok := s.(json.RawMessage); ok {
		return r
	}
	b, _ := json.Marshal(s)
	return b
}
