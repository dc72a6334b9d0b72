package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
)

// relay is one client session's link to the upstreams: the upstream
// session each of its requests goes to, and the requests of its own that
// are being served, whose contexts carry what an upstream sends while
// serving one (progress, log messages, sampling, elicitation and roots/list
// requests) back to this client session, on the stream of the request that
// caused it.
//
// In stdio mode the one client session relays over the upstreams' own
// sessions, made at start (Gateway.shared, bound to the client session
// when it first sends a request). In HTTP mode every client session has
// upstream sessions of its own, made at its first request to each upstream
// and closed when it ends (relayOf), so what an upstream asks reaches
// the client whose request caused it and no other.
type relay struct {
	g   *Gateway
	p   *Principal
	own bool // the sessions were made for this relay and close with it

	dialMu sync.Mutex // held while a session is made (session)
	mu     sync.Mutex
	ss     *mcp.ServerSession // the client session; nil until one is bound
	closed bool               // close was called: no more sessions are made
	stop   chan struct{}      // closed by close: the sessions' watchers end
	// sessions maps server_id to its upstream session.
	sessions map[string]*mcp.ClientSession
	// inflight holds, per server_id, the contexts of this client's
	// requests being served by it, oldest first.
	inflight map[string][]*context.Context
	// level is the client's logging/setLevel, "" until it sets one; it is
	// passed on to each upstream session, also those made later.
	level mcp.LoggingLevel
}

// ErrNoClient: an upstream asked something of a client while no client
// session is bound to its session (HTTP mode's shared sessions, or stdio
// before the client's first request).
var ErrNoClient = errors.New("gateway: no client session to relay this to")

// relayOptions are the options of an upstream session of serverID whose
// server-to-client traffic goes to the client session of peer() (nil,
// or a relay with no client session: requests are refused with
// ErrNoClient, notifications dropped). changed, when set, is signalled on
// each list_changed notification.
func relayOptions(serverID string, peer func() *relay, changed chan struct{}) []mcpup.Option {
	client := func() (*relay, *mcp.ServerSession) {
		r := peer()
		if r == nil {
			return nil, nil
		}
		return r, r.client()
	}
	signal := func() {
		if changed == nil {
			return
		}
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	o := &mcp.ClientOptions{
		// What the gateway relays. A request the client itself cannot
		// answer (no sampling handler, no elicitation support, no roots)
		// fails there, and its error goes back to the upstream.
		Capabilities: mcpup.ClientCapabilities(),
		CreateMessageWithToolsHandler: func(ctx context.Context, req *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
			r, ss := client()
			if ss == nil {
				return nil, ErrNoClient
			}
			res, err := r.g.serverRequest(ctx, r, serverID, schemas.MethodSamplingCreateMessage, req.Params, func(cctx context.Context) (mcp.Result, error) {
				return ss.CreateMessageWithTools(cctx, req.Params)
			})
			if err != nil {
				return nil, err
			}
			return res.(*mcp.CreateMessageWithToolsResult), nil
		},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			r, ss := client()
			if ss == nil {
				return nil, ErrNoClient
			}
			res, err := r.g.serverRequest(ctx, r, serverID, schemas.MethodElicitationCreate, req.Params, func(cctx context.Context) (mcp.Result, error) {
				return ss.Elicit(cctx, req.Params)
			})
			if err != nil {
				return nil, err
			}
			return res.(*mcp.ElicitResult), nil
		},
		ElicitationCompleteHandler: func(ctx context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			if r, ss := client(); ss != nil {
				_ = ss.NotifyElicitationComplete(r.context(serverID, ctx), req.Params)
			}
		},
		ResourceUpdatedHandler: func(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			if r, ss := client(); ss != nil {
				_ = r.g.Server(r.p).ResourceUpdated(ctx, req.Params)
			}
		},
		ToolListChangedHandler:     func(context.Context, *mcp.ToolListChangedRequest) { signal() },
		PromptListChangedHandler:   func(context.Context, *mcp.PromptListChangedRequest) { signal() },
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { signal() },
	}
	return []mcpup.Option{mcpup.WithClientOptions(o), mcpup.WithReceivingMiddleware(rootsFromClient(serverID, client)),
		mcpup.WithTransport(inOrder(serverID, client))}
}

// rootsFromClient answers an upstream's roots/list with the client
// session's roots (the SDK's client would answer from a list of its own),
// recorded by Talos like sampling and elicitation: the roots a client
// names are paths of its machine, which an auditor may need to see were
// asked for, and when.
func rootsFromClient(serverID string, client func() (*relay, *mcp.ServerSession)) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != schemas.MethodRootsList {
				return next(ctx, method, req)
			}
			r, ss := client()
			if ss == nil {
				return nil, ErrNoClient
			}
			return r.g.serverRequest(ctx, r, serverID, schemas.MethodRootsList, req.GetParams(), func(cctx context.Context) (mcp.Result, error) {
				return ss.ListRoots(cctx, nil)
			})
		}
	}
}

// inOrder passes an upstream's progress and log messages on to the client
// session as its session reads them, so that those sent before an answer
// reach the client before the answer does (the SDK hands notifications to
// its handlers after it has delivered later responses).
func inOrder(serverID string, client func() (*relay, *mcp.ServerSession)) func(mcp.Transport) mcp.Transport {
	return func(t mcp.Transport) mcp.Transport {
		return notifyTransport{Transport: t, deliver: func(ctx context.Context, m *jsonrpc.Request) {
			r, ss := client()
			if ss == nil {
				return
			}
			switch m.Method {
			case "notifications/progress":
				var p mcp.ProgressNotificationParams
				if json.Unmarshal(m.Params, &p) == nil {
					r.g.progressed(&p)
				}
			case "notifications/message":
				var p mcp.LoggingMessageParams
				if json.Unmarshal(m.Params, &p) == nil {
					_ = ss.Log(r.context(serverID, ctx), &p)
				}
			}
		}}
	}
}

// notifyTransport is a client transport whose connection hands the
// progress and log notifications it reads to deliver, at once and in the
// order read, instead of to the session.
type notifyTransport struct {
	mcp.Transport
	deliver func(context.Context, *jsonrpc.Request)
}

func (t notifyTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return notifyConn{Connection: c, deliver: t.deliver}, nil
}

type notifyConn struct {
	mcp.Connection
	deliver func(context.Context, *jsonrpc.Request)
}

func (c notifyConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		m, err := c.Connection.Read(ctx)
		r, ok := m.(*jsonrpc.Request)
		if err != nil || !ok || r.ID.IsValid() || (r.Method != "notifications/progress" && r.Method != "notifications/message") {
			return m, err
		}
		c.deliver(ctx, r)
	}
}

// principal is the principal of the relay's client session (nil until
// one is bound in stdio mode).
func (r *relay) principal() *Principal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p
}

// client is the relay's client session (nil until one is bound).
func (r *relay) client() *mcp.ServerSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ss
}

// context is the context of the newest request of this client being
// served by serverID, else fallback: what an upstream sends while serving
// a request is sent to the client with the context of the request that
// caused it (on streamable HTTP, its response stream).
func (r *relay) context(serverID string, fallback context.Context) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in := r.inflight[serverID]; len(in) > 0 {
		return *in[len(in)-1]
	}
	return fallback
}

// track notes ctx as a request of this client being served by serverID
// until done is called.
func (r *relay) track(serverID string, ctx context.Context) (done func()) {
	p := &ctx
	r.mu.Lock()
	r.inflight[serverID] = append(r.inflight[serverID], p)
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		in := r.inflight[serverID]
		for i, q := range in {
			if q == p {
				r.inflight[serverID] = append(in[:i:i], in[i+1:]...)
				break
			}
		}
	}
}

// session is the upstream session of serverID for this client session:
// the upstream's own one, or in HTTP mode one made for it now (60 s at
// most; a session's own requests carry no call's credential) if it has
// none yet, with the client's logging level. A session made here has its
// tools held to their pins like the upstream's own session (watchSession):
// listed before it is used, and again on each list_changed. Sessions are
// made one at a time (dialMu), without holding r.mu.
func (r *relay) session(ctx context.Context, serverID string) (*mcp.ClientSession, error) {
	if cs := r.lookup(serverID); cs != nil {
		return cs, nil
	}
	u := r.g.upstreamOf(serverID)
	if u == nil || !r.own {
		return nil, fmt.Errorf("gateway: no upstream %q", serverID)
	}
	r.dialMu.Lock()
	defer r.dialMu.Unlock()
	if cs := r.lookup(serverID); cs != nil {
		return cs, nil
	}
	cctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	changed := make(chan struct{}, 1)
	opts := append(slices.Clone(u.opts), relayOptions(serverID, func() *relay { return r }, changed)...)
	cs, err := mcpup.Connect(cctx, u.spec, u.impl, opts...)
	if err == nil {
		err = r.g.checkSession(cctx, serverID, cs)
	}
	if err != nil {
		if cs != nil {
			_ = cs.Close()
		}
		r.g.log.Warn("cannot open an upstream session for a client session", "server_id", serverID, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "talos: upstream " + serverID + " unreachable"}
	}
	go r.g.watchSession(r.stop, serverID, cs, changed)
	r.mu.Lock()
	level, closed := r.level, r.closed
	if !closed {
		r.sessions[serverID] = cs
	}
	r.mu.Unlock()
	if closed {
		_ = cs.Close()
		return nil, ErrNoClient
	}
	if level != "" && hasLogging(cs) {
		_ = cs.SetLoggingLevel(cctx, &mcp.SetLoggingLevelParams{Level: level})
	}
	return cs, nil
}

// lookup is the upstream session of serverID made so far, or nil.
func (r *relay) lookup(serverID string) *mcp.ClientSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessions[serverID]
}

// callTool forwards a tools/call to serverID on this client session's
// upstream session, with the client's progress token mapped (token, nil
// if it asked for none). def is the tool's definition hash Talos decided
// the call with: a call whose tool drifted since on the session just made
// for it (sessionTools) is refused (errSessionDrift).
func (r *relay) callTool(ctx context.Context, serverID string, params *mcp.CallToolParams, token any, def string) (*mcp.CallToolResult, error) {
	cs, err := r.session(ctx, serverID)
	if err != nil {
		return nil, err
	}
	if err := r.g.sessionDrifted(serverID, params.Name, def); err != nil {
		return nil, err
	}
	defer r.track(serverID, ctx)()
	defer r.g.mapProgress(r, ctx, token, params)()
	return cs.CallTool(ctx, params)
}

// setLevel passes the client's logging level on to every upstream
// session it has that logs.
func (r *relay) setLevel(ctx context.Context, level mcp.LoggingLevel) {
	r.mu.Lock()
	r.level = level
	sessions := maps.Clone(r.sessions)
	r.mu.Unlock()
	for id, cs := range sessions {
		if !hasLogging(cs) {
			continue
		}
		if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level}); err != nil {
			r.g.log.Warn("upstream refused the client's logging level", "server_id", id, "err", err)
		}
	}
}

// hasLogging reports whether the server of cs announced logging.
func hasLogging(cs *mcp.ClientSession) bool {
	ir := cs.InitializeResult()
	return ir != nil && ir.Capabilities != nil && ir.Capabilities.Logging != nil
}

// close closes the upstream sessions made for this relay.
func (r *relay) close() {
	r.mu.Lock()
	sessions := r.sessions
	if !r.closed {
		close(r.stop)
	}
	r.sessions, r.closed = map[string]*mcp.ClientSession{}, true
	r.mu.Unlock()
	if !r.own {
		return
	}
	for _, cs := range sessions {
		_ = cs.Close()
	}
}

// relayOf is the relay of client session ss of principal p. In stdio mode
// (and for a request with no session) it is the shared relay over the
// upstreams' own sessions, bound to ss; in HTTP mode a relay of ss's own,
// made at its first request and closed when ss ends (a goroutine the
// Gateway waits for; Close ends the client sessions first).
func (g *Gateway) relayOf(p *Principal, ss *mcp.ServerSession) *relay {
	if ss == nil || g.stdio {
		if ss != nil {
			g.shared.mu.Lock()
			if g.shared.ss == nil {
				g.shared.ss, g.shared.p = ss, p
			}
			g.shared.mu.Unlock()
		}
		return g.shared
	}
	g.relayMu.Lock()
	defer g.relayMu.Unlock()
	if r := g.relays[ss]; r != nil {
		return r
	}
	r := newRelay(g, p, true)
	r.ss = ss
	g.relays[ss] = r
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		_ = ss.Wait()
		g.relayMu.Lock()
		delete(g.relays, ss)
		g.relayMu.Unlock()
		r.close()
	}()
	return r
}

func newRelay(g *Gateway, p *Principal, own bool) *relay {
	return &relay{g: g, p: p, own: own, stop: make(chan struct{}), sessions: map[string]*mcp.ClientSession{}, inflight: map[string][]*context.Context{}}
}

// progressRoute is where an upstream's progress for one forwarded request
// goes: the client's session, the request's context and its own token.
type progressRoute struct {
	ss    *mcp.ServerSession
	ctx   context.Context
	token any
}

// mapProgress gives a forwarded request whose client asked for progress
// (token non-nil) a token of the gateway's own in params, routed back to
// the client under its token until done is called. Tokens are the
// gateway's so that two clients' tokens never meet on one upstream
// session.
func (g *Gateway) mapProgress(r *relay, ctx context.Context, token any, params interface{ SetProgressToken(any) }) (done func()) {
	ss := r.client()
	if token == nil || ss == nil {
		return func() {}
	}
	up := "talos-" + uuid.NewString()
	g.progress.Store(up, progressRoute{ss: ss, ctx: ctx, token: token})
	params.SetProgressToken(up)
	return func() { g.progress.Delete(up) }
}

// progressed sends an upstream's progress notification to the client
// whose request it is about, under the client's token; one about no
// request in flight is dropped.
func (g *Gateway) progressed(p *mcp.ProgressNotificationParams) {
	up, _ := p.ProgressToken.(string)
	v, ok := g.progress.Load(up)
	if !ok {
		return
	}
	route := v.(progressRoute)
	_ = route.ss.NotifyProgress(route.ctx, &mcp.ProgressNotificationParams{ProgressToken: route.token,
		Progress: p.Progress, Total: p.Total, Message: p.Message})
}
