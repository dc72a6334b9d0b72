package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/credential"
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
// On an error the upstreams already connected are closed. creds (nil:
// none) sets what each upstream is sent (CSP MUST 5): an HTTP upstream's
// requests never carry an Authorization header but the broker's
// (credential.Transport); a stdio upstream with a secret gets it in its
// declared environment variable.
func ConnectUpstreams(ctx context.Context, specs []mcpup.Spec, client *mcp.Implementation, log *slog.Logger, creds *credential.Broker) ([]*Upstream, error) {
	if creds == nil {
		creds = credential.New(nil, credential.Options{})
	}
	var ups []*Upstream
	for _, s := range specs {
		var opts []mcpup.Option
		if s.URL != "" {
			opts = append(opts, mcpup.WithHTTPClient(&http.Client{Transport: creds.Transport(s.ServerID, nil)}))
		} else if env := creds.StdioEnv(s.ServerID); env != nil {
			s.Env = append(slices.Clone(s.Env), env...)
		}
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		cs, err := mcpup.Connect(cctx, s, client, opts...)
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
