package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
)

// upstreamTool is one tool an upstream server offers.
type upstreamTool struct {
	server string
	tool   *mcp.Tool
}

// Upstream is one connected upstream server and the tools it listed. The
// gateway that is given it closes its session (Close).
type Upstream struct {
	spec    mcpup.Spec
	session *mcp.ClientSession
	tools   []*mcp.Tool
}

// ConnectUpstreams starts or dials every upstream (60 s each) and lists
// its tools; client names the gateway to them. Server ids MUST be unique.
// On an error the upstreams already connected are left open.
func ConnectUpstreams(ctx context.Context, specs []mcpup.Spec, client *mcp.Implementation, log *slog.Logger) ([]*Upstream, error) {
	var ups []*Upstream
	for _, s := range specs {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		cs, err := mcpup.Connect(cctx, s, client)
		if err != nil {
			cancel()
			CloseUpstreams(ups)
			return nil, err
		}
		tools, err := mcpup.ListTools(cctx, cs)
		cancel()
		if err != nil {
			_ = cs.Close()
			CloseUpstreams(ups)
			return nil, fmt.Errorf("upstream %s: tools/list: %w", s.ServerID, err)
		}
		log.Info("upstream connected", "server_id", s.ServerID, "tools", len(tools))
		ups = append(ups, &Upstream{spec: s, session: cs, tools: tools})
	}
	return ups, nil
}

// CloseUpstreams closes the sessions of ups (stopping stdio upstreams),
// for a caller that keeps them without a Gateway to close them.
func CloseUpstreams(ups []*Upstream) {
	for _, u := range ups {
		_ = u.session.Close()
	}
}

// Report is, per principal name, the tools it would see and why the
// others are hidden: {agent_id, visible: [{server_id, tool, actions}],
// hidden: [{server_id, tool, codes, why}]}. It needs no NATS.
func Report(d enforce.Discovery, principals []*Principal, ups []*Upstream) map[string]any {
	byName := route(d.Registry, ups, slog.New(slog.DiscardHandler))
	out := map[string]any{}
	for _, p := range principals {
		var visible, hidden []map[string]any
		for _, name := range sortedKeys(byName) {
			ut := byName[name]
			v := d.See(p.Viewer, ut.server, name)
			if v.Hidden {
				hidden = append(hidden, map[string]any{"server_id": ut.server, "tool": name, "codes": v.Codes, "why": v.Detail})
				continue
			}
			e := map[string]any{"server_id": ut.server, "tool": name}
			if v.Actions != nil {
				e["actions"] = v.Actions
			}
			visible = append(visible, e)
		}
		out[p.Name] = map[string]any{"agent_id": p.AgentID, "visible": visible, "hidden": hidden}
	}
	return out
}

func (g *Gateway) upstreamOf(server string) *Upstream {
	for _, u := range g.ups {
		if u.spec.ServerID == server {
			return u
		}
	}
	return nil
}
