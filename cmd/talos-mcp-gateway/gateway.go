package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/cmd/internal/mcpup"
	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/schemas"
)

// unroutedServer is the server_id of a call to a tool no upstream offers:
// it is still published, so the worker denies it with a receipt.
const unroutedServer = "unrouted"

// Options configure a Gateway. Zero values mean the defaults in New.
type Options struct {
	EPID            string
	Registry        *enforce.Registry
	Access          accessPolicy
	DecisionTimeout time.Duration // default 5 s
	ApprovalTimeout time.Duration // default 2 min
	// MaxEnvelopeBytes bounds a pre envelope; larger calls are denied
	// locally (NATS would refuse them). Default: the server's max payload
	// less 64 KiB.
	MaxEnvelopeBytes int
	// StdioSession is the session_id of calls from the stdio session
	// (default stdio-<uuid>, new each start).
	StdioSession string
	Logger       *slog.Logger
	Version      string
}

// upstreamTool is one tool an upstream server offers.
type upstreamTool struct {
	server string
	tool   *mcp.Tool
}

// upstream is one connected upstream server.
type upstream struct {
	spec    mcpup.Spec
	session *mcp.ClientSession
	tools   []*mcp.Tool
}

// Gateway is the enforcement point between MCP clients and upstream MCP
// servers: every tools/call is published to Talos, decided by a worker,
// forwarded only on allow (or a human approval), and reported after it ran.
type Gateway struct {
	o      Options
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	client *ingest.Client
	out    *outbox
	appr   *approvals

	ups    []*upstream
	byName map[string]upstreamTool // downstream tool name → its upstream tool

	mu      sync.Mutex
	servers map[string]*mcp.Server // principal name → its server
}

// New builds a gateway over connected upstreams and a NATS connection
// (which may still be reconnecting: calls are denied until it is up).
func New(o Options, nc *nats.Conn, ups []*upstream) (*Gateway, error) {
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
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	o.Access.reg = o.Registry
	g := &Gateway{o: o, log: o.Logger, nc: nc, js: js, ups: ups, byName: map[string]upstreamTool{}, servers: map[string]*mcp.Server{}}
	g.route()
	g.appr = newApprovals(nc, o.Logger)
	g.out = newOutbox(o.Logger)
	return g, nil
}

// route maps downstream tool names to upstream tools. Names are one flat
// namespace: on a clash a protected tool (built_in, or from an internal
// server) wins; otherwise the first upstream listed keeps the name and the
// clash is logged.
func (g *Gateway) route() {
	for _, u := range g.ups {
		for _, t := range u.tools {
			cur, taken := g.byName[t.Name]
			if !taken {
				g.byName[t.Name] = upstreamTool{server: u.spec.ServerID, tool: t}
				continue
			}
			if rt, ok := g.o.Registry.Lookup(u.spec.ServerID, t.Name); ok && enforce.Protected(rt) {
				if ct, ok := g.o.Registry.Lookup(cur.server, t.Name); !ok || !enforce.Protected(ct) {
					g.byName[t.Name] = upstreamTool{server: u.spec.ServerID, tool: t}
					continue
				}
			}
			g.log.Warn("tool name offered by two upstreams; the first keeps it",
				"tool", t.Name, "kept", cur.server, "hidden", u.spec.ServerID)
		}
	}
}

// Start connects the gateway to Talos: the decision subscription, the
// approval listener and the post outbox. It returns at once; while NATS is
// not reachable, calls are denied (ENFORCEMENT_UNAVAILABLE).
func (g *Gateway) Start(ctx context.Context) {
	g.out.start(g.js)
	g.appr.start()
	go func() {
		for ctx.Err() == nil {
			c, err := ingest.NewClient(g.nc, g.js, g.o.EPID)
			if err == nil {
				g.mu.Lock()
				g.client = c
				g.mu.Unlock()
				return
			}
			g.log.Warn("waiting for NATS to subscribe to decisions", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
}

// Close waits (up to wait) for queued post events to reach Talos, then
// closes the upstream sessions.
func (g *Gateway) Close(wait time.Duration) {
	if n := g.out.drain(wait); n > 0 {
		g.log.Error("post events not delivered to Talos before exit", "count", n)
	}
	for _, u := range g.ups {
		_ = u.session.Close()
	}
}

func (g *Gateway) ingestClient() *ingest.Client {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.client
}

// Server is the MCP server one principal sees: only the tools discovery
// lets it see, with action enums narrowed, and every tools/call (visible
// or not) handled by the gateway.
func (g *Gateway) Server(p *principal) *mcp.Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.servers[p.name]; s != nil {
		return s
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "talos-mcp-gateway", Version: g.o.Version}, &mcp.ServerOptions{
		Instructions: "Tool calls pass through Talos: each is decided, receipted and audited.",
	})
	for _, name := range sortedKeys(g.byName) {
		ut := g.byName[name]
		v := g.o.Access.see(p, ut.server, name)
		if v.hidden {
			g.log.Debug("tool hidden", "principal", p.name, "server", ut.server, "tool", name, "why", v.detail)
			continue
		}
		t := *ut.tool
		if v.actions != nil {
			if schema, err := mcpup.FilterActionEnum(rawSchema(t.InputSchema), v.tool.ActionPointer, v.actions); err == nil {
				t.InputSchema = schema
				t.Description = strings.TrimSpace(t.Description + " (actions open to you: " + strings.Join(v.actions, ", ") + ")")
			} else {
				g.log.Warn("cannot narrow the action enum; tool hidden", "tool", name, "err", err)
				continue
			}
		}
		if t.InputSchema == nil {
			t.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		s.AddTool(&t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return g.call(ctx, p, req) // not reached: the middleware handles tools/call
		})
	}
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" {
				return g.call(ctx, p, r)
			}
			return next(ctx, method, req)
		}
	})
	g.servers[p.name] = s
	return s
}

// rawSchema is an upstream tool's input schema as JSON.
func rawSchema(s any) json.RawMessage {
	if r, ok := s.(json.RawMessage); ok {
		return r
	}
	b, _ := json.Marshal(s)
	return b
}
