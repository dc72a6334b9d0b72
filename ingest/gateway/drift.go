package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/schemas"
)

// watch lists u's tools again each time u announces a new list, until ctx
// ends; Start runs one per upstream and Close waits for them.
func (g *Gateway) watch(ctx context.Context, u *Upstream) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.changed:
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		tools, err := u.listTools(lctx, g.log)
		var f features
		if err == nil {
			f = u.listFeatures(lctx, g.log)
		}
		cancel()
		if err != nil {
			// The old list stays, and with it the old pins' verdicts; a
			// drifted definition cannot be shown without a new list.
			g.log.Warn("upstream announced a new tool list that could not be read", "server_id", u.spec.ServerID, "err", err)
			continue
		}
		g.refresh(u, tools, f)
	}
}

// refresh takes u's new lists: its prompts and resources are offered as
// listed now (features.go), and, for its tools, routes are worked out again, every
// principal's server shows the tools it may now see (the SDK tells
// connected clients the list changed), and a definition that drifted from
// its registry pin is hidden, its calls denied DENY_TOOL_DRIFT (by the
// worker, which compares the hash each call carries, and here), and
// reported as an incident (reportDrift).
func (g *Gateway) refresh(u *Upstream, tools []upstreamTool, f features) {
	g.mu.Lock()
	defer g.mu.Unlock()
	u.tools, u.features = tools, f
	oldFeatures := g.features
	g.features = routeFeatures(g.ups)
	if !reflect.DeepEqual(oldFeatures, g.features) {
		for _, p := range sortedKeys(g.servers) {
			g.offerFeatures(g.servers[p], g.served[p], oldFeatures, g.features)
		}
	}
	old := g.byName
	g.byName = route(g.o.Registry, g.ups, g.log)
	g.reportDrift(g.byName)
	names := map[string]bool{}
	for n := range old {
		names[n] = true
	}
	for n := range g.byName {
		names[n] = true
	}
	g.relist(sortedKeys(names))
	g.log.Info("upstream tool list refreshed", "server_id", u.spec.ServerID, "tools", len(tools))
}

// relist shows each principal's server the tools of names it may see now
// and takes away the others (the SDK tells connected clients the list
// changed). Call it with g.mu held.
func (g *Gateway) relist(names []string) {
	for _, p := range sortedKeys(g.servers) {
		s, pr := g.servers[p], g.served[p]
		for _, name := range names {
			if t, ok := g.listed(pr, name); ok {
				s.AddTool(t, g.unreached(pr))
			} else {
				s.RemoveTools(name)
			}
		}
	}
}

// errSessionDrift refuses a call whose tool drifted from its pin on the
// upstream session that would run it after Talos decided it.
var errSessionDrift = errors.New("talos: the tool's definition drifted from its registry pin on this session's upstream")

func driftKey(server, tool string) string { return server + "\x00" + tool }

// current is ut as the gateway holds it now: the drifted definition an
// HTTP client's own upstream session listed for it, if any
// (sessionDrift). Call it with g.mu held.
func (g *Gateway) current(ut upstreamTool) upstreamTool {
	if ut.tool == nil {
		return ut
	}
	if d, ok := g.sessionDrift[driftKey(ut.server, ut.tool.Name)]; ok {
		return d
	}
	return ut
}

// checkSession lists the tools of cs, an upstream session of serverID
// made for one HTTP client, and holds them to their pins (sessionTools).
// In HTTP mode each client's calls run on a session of its own, and a
// server may list another definition there than on the gateway's own
// session, or change it there later (a rug pull aimed at one client).
func (g *Gateway) checkSession(ctx context.Context, serverID string, cs *mcp.ClientSession) error {
	tools, err := listTools(ctx, serverID, cs, g.log)
	if err != nil {
		return err
	}
	g.sessionTools(tools)
	return nil
}

// watchSession lists the tools of cs again on each list_changed it
// announces (changed), until stop is closed or cs ends.
func (g *Gateway) watchSession(stop <-chan struct{}, serverID string, cs *mcp.ClientSession, changed <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-changed:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := g.checkSession(ctx, serverID, cs)
		cancel()
		if errors.Is(err, mcp.ErrConnectionClosed) {
			return
		}
		if err != nil {
			g.log.Warn("a client's upstream session announced a new tool list that could not be read", "server_id", serverID, "err", err)
		}
	}
}

// sessionTools takes the tools an HTTP client's own upstream session
// lists: a definition that drifted from its pin makes the tool drifted
// for every client for the gateway's life (fail closed: the server was
// seen to rug-pull), hidden from every tools/list, its calls denied
// DENY_TOOL_DRIFT, and reported as an incident like a drift on the
// gateway's own session (reportDrift).
func (g *Gateway) sessionTools(tools []upstreamTool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	drifted := map[string]upstreamTool{}
	for _, ut := range tools {
		key := driftKey(ut.server, ut.tool.Name)
		if d, _ := ut.drift(g.o.Registry); !d {
			continue
		}
		if seen, ok := g.sessionDrift[key]; ok && seen.def == ut.def {
			continue
		}
		g.log.Error("an HTTP client's upstream session lists a tool definition that drifted from its registry pin",
			"server_id", ut.server, "tool", ut.tool.Name, "definition_sha256", ut.def)
		g.sessionDrift[key] = ut
		drifted[ut.tool.Name] = ut
	}
	if len(drifted) > 0 {
		g.reportDrift(drifted)
		g.relist(sortedKeys(drifted))
	}
}

// sessionDrifted refuses (errSessionDrift) a call of server's tool that
// Talos decided with definition def, when a client's upstream session
// has since listed another, drifted one (sessionTools).
func (g *Gateway) sessionDrifted(server, tool, def string) error {
	g.mu.Lock()
	d, ok := g.sessionDrift[driftKey(server, tool)]
	g.mu.Unlock()
	if ok && d.def != def {
		return fmt.Errorf("%w (%s/%s: %s)", errSessionDrift, server, tool, d.def)
	}
	return nil
}

// reportOutbox is where reports go: the refusals' outbox (g.refused).
type reportOutbox interface {
	Send(*schemas.ToolCall)
	Full() bool
}

// driftSession is the session_id of the drift reports of enforcement
// point epID.
func driftSession(epID string) string { return "tool-drift-" + epID }

// reportDrift makes an incident of each tool of byName whose definition
// drifted from its registry pin, once per (server, tool, live hash) in the
// gateway's life: it logs it, counts it (talos_gateway_tool_drift_total)
// and reports it to Talos as a pre envelope for the tool itself, with the
// live hash, in session driftSession, which the worker denies
// DENY_TOOL_DRIFT with a receipt. So the drift is in the audit trail even
// if no agent calls the tool. The report goes through the refusals'
// outbox (it survives an outage and cannot hold up calls) and nobody
// waits for its decision. Call it with g.mu held, or before Start.
func (g *Gateway) reportDrift(byName map[string]upstreamTool) {
	for _, name := range sortedKeys(byName) {
		ut := byName[name]
		drift, why := ut.drift(g.o.Registry)
		if !drift {
			continue
		}
		key := ut.server + "\x00" + name + "\x00" + ut.def
		if g.drifted[key] {
			continue
		}
		g.log.Error("tool definition drifted from its registry pin: hidden, and its calls are denied",
			"code", schemas.CodeDenyToolDrift, "server_id", ut.server, "tool", name, "why", why)
		if id, err := g.driftReport(ut, name); err != nil {
			g.log.Error("tool drift not reported to Talos", "server_id", ut.server, "tool", name, "err", err)
			if ut.def != "" {
				continue // a later list may report it
			}
		} else {
			g.log.Info("tool drift reported to Talos", "server_id", ut.server, "tool", name, "tool_call_id", id)
		}
		g.drifted[key] = true
		g.driftRef.WithLabelValues(ut.server, name).Inc()
	}
}

// driftReport queues the drift report of tool name (ut) and returns its
// tool_call_id. A definition that could not be hashed has no live hash
// for the worker to compare, so it is not reported (only logged).
func (g *Gateway) driftReport(ut upstreamTool, name string) (string, error) {
	if ut.def == "" {
		return "", errors.New("the live definition cannot be hashed")
	}
	if g.driftOut.Full() {
		return "", errors.New("the report outbox is full")
	}
	pinned := ""
	if rt, ok := g.o.Registry.Lookup(ut.server, name); ok {
		pinned = rt.DefinitionSHA256
	}
	args, err := json.Marshal(map[string]string{"reason": "definition drift", "pinned": pinned, "live": ut.def})
	if err != nil {
		return "", err
	}
	c, err := g.envelope(context.Background(), &Principal{}, driftSession(g.o.EPID), &pending{server: ut.server, name: name, args: args})
	if err != nil {
		return "", err
	}
	c.ToolDefinitionSHA256 = ut.def
	g.driftOut.Send(c)
	return c.ToolCallID, nil
}
