package gateway

import (
	"context"
	"time"

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
		cancel()
		if err != nil {
			// The old list stays, and with it the old pins' verdicts; a
			// drifted definition cannot be shown without a new list.
			g.log.Warn("upstream announced a new tool list that could not be read", "server_id", u.spec.ServerID, "err", err)
			continue
		}
		g.refresh(u, tools)
	}
}

// refresh takes u's new tool list: routes are worked out again, every
// principal's server shows the tools it may now see (the SDK tells
// connected clients the list changed), and a definition that drifted from
// its registry pin is hidden, its calls denied DENY_TOOL_DRIFT (by the
// worker, which compares the hash each call carries, and here), and
// logged as an incident.
func (g *Gateway) refresh(u *Upstream, tools []upstreamTool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	u.tools = tools
	old := g.byName
	g.byName = route(g.o.Registry, g.ups, g.log)
	g.logDrift(g.byName, old)
	names := map[string]bool{}
	for n := range old {
		names[n] = true
	}
	for n := range g.byName {
		names[n] = true
	}
	for _, p := range sortedKeys(g.servers) {
		s := g.servers[p]
		pr := g.served[p]
		for _, name := range sortedKeys(names) {
			if t, ok := g.listed(pr, name); ok {
				s.AddTool(t, g.unreached(pr))
			} else {
				s.RemoveTools(name)
			}
		}
	}
	g.log.Info("upstream tool list refreshed", "server_id", u.spec.ServerID, "tools", len(tools))
}

// logDrift logs, once per change, each tool of byName whose definition
// drifted from its registry pin and did not already in old: the incident
// record of the gateway (its calls get DENY_TOOL_DRIFT receipts).
func (g *Gateway) logDrift(byName, old map[string]upstreamTool) {
	for _, name := range sortedKeys(byName) {
		ut := byName[name]
		drift, why := ut.drift(g.o.Registry)
		if !drift {
			continue
		}
		if prev, ok := old[name]; ok && prev.def == ut.def && prev.server == ut.server {
			continue
		}
		g.log.Error("tool definition drifted from its registry pin: hidden, and its calls are denied",
			"code", schemas.CodeDenyToolDrift, "server_id", ut.server, "tool", name, "why", why)
	}
}
