package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
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
