package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/registrylint"
	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/schemas"
)

// upstreamTool is one tool an upstream server offers.
type upstreamTool struct {
	server string
	tool   *mcp.Tool
	def    string // its definition's hash (enforce.ToolDefinition); "" if it has none
}

// drift reports whether the tool's live definition is not the one the
// registry pins (OWASP MCP03); a pinned tool whose definition could not be
// hashed counts as drifted (fail closed).
func (ut upstreamTool) drift(reg *enforce.Registry) (bool, string) {
	rt, ok := reg.Lookup(ut.server, ut.tool.Name)
	if !ok || rt.DefinitionSHA256 == "" {
		return false, ""
	}
	if ut.def == "" {
		return true, "tool definition: cannot be hashed, the registry pins " + rt.DefinitionSHA256
	}
	return enforce.DefinitionDrift(rt, ut.def)
}

// Upstream is one connected upstream server and the tools it listed. The
// gateway that is given it closes its session (Close). tools is replaced
// when the server announces a new list (notifications/tools/list_changed,
// signalled on changed); the Gateway's mutex guards it.
type Upstream struct {
	spec    mcpup.Spec
	session *mcp.ClientSession
	tools   []upstreamTool
	changed chan struct{}
	// features are its prompts, resources and resource templates
	// (listFeatures), replaced like tools.
	features features

	// impl and opts are how the session was made, for the sessions made
	// for HTTP clients (relay.session); peer is the relay the session's
	// server-to-client traffic goes to (the Gateway's shared relay).
	impl *mcp.Implementation
	opts []mcpup.Option
	peer atomic.Pointer[relay]

	// rejected holds the definitions already logged as hidden (reject).
	rejectedMu sync.Mutex
	rejected   map[mcpup.Rejected]bool
}

// reject logs, once per definition and reason, a definition the server
// listed that cannot be served: the list filter (mcpup.WithRejected) has
// taken it out of the list, so it is hidden from every client and cannot
// be called, while the server's other definitions are served.
func (u *Upstream) reject(log *slog.Logger) func(mcpup.Rejected) {
	return func(r mcpup.Rejected) {
		u.rejectedMu.Lock()
		seen := u.rejected[r]
		if u.rejected == nil {
			u.rejected = map[mcpup.Rejected]bool{}
		}
		u.rejected[r] = true
		u.rejectedMu.Unlock()
		if !seen {
			log.Warn("upstream "+r.Kind+" hidden: its definition cannot be served", "server_id", r.ServerID, "name", r.Name, "why", r.Reason)
		}
	}
}

// listTools lists the server's tools with the hashes of their definitions.
func (u *Upstream) listTools(ctx context.Context, log *slog.Logger) ([]upstreamTool, error) {
	return listTools(ctx, u.spec.ServerID, u.session, log)
}

// listTools lists the tools of serverID's session cs with the hashes of
// their definitions.
func listTools(ctx context.Context, serverID string, cs *mcp.ClientSession, log *slog.Logger) ([]upstreamTool, error) {
	tools, err := mcpup.ListTools(ctx, cs)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: tools/list: %w", serverID, err)
	}
	out := make([]upstreamTool, 0, len(tools))
	for _, t := range tools {
		def, err := registrylint.Definition(t).SHA256()
		if err != nil {
			log.Warn("tool definition cannot be hashed", "server_id", serverID, "tool", t.Name, "err", err)
		}
		out = append(out, upstreamTool{server: serverID, tool: t, def: def})
	}
	return out, nil
}

// ConnectUpstreams starts or dials every upstream (60 s each) and lists
// its tools; client names the gateway to them. Server ids MUST be unique.
// On an error the upstreams already connected are closed. creds (nil:
// none) sets what each upstream is sent (CSP MUST 5): an HTTP upstream's
// requests never carry an Authorization header but the broker's
// (credential.Transport); a stdio upstream with a secret gets it in its
// declared environment variable.
//
// Requests sent while serving a traced one carry its trace context to the
// upstream, recorded as MCP client spans when t is enabled (nil: off).
func ConnectUpstreams(ctx context.Context, specs []mcpup.Spec, client *mcp.Implementation, log *slog.Logger, creds *credential.Broker, t *tracing.Provider) ([]*Upstream, error) {
	if creds == nil {
		creds = credential.New(nil, credential.Options{})
	}
	var ups []*Upstream
	for _, s := range specs {
		u := &Upstream{spec: s, changed: make(chan struct{}, 1), impl: client}
		u.opts = []mcpup.Option{mcpup.WithRejected(u.reject(log)), mcpup.WithTerminateWait(upstreamTerminateWait)}
		transport := "pipe"
		if s.URL != "" {
			transport = "tcp"
		}
		u.opts = append(u.opts, mcpup.WithSendingMiddleware(traceClient(t, transport)))
		if t.Enabled() {
			u.opts = append(u.opts, mcpup.WithTransport(func(tr mcp.Transport) mcp.Transport { return idTransport{Transport: tr} }))
		}
		if s.URL != "" {
			u.opts = append(u.opts, mcpup.WithHTTPClient(&http.Client{Transport: creds.Transport(s.ServerID, nil)}))
		} else if env := creds.StdioEnv(s.ServerID); env != nil {
			s.Env = append(slices.Clone(s.Env), env...)
		}
		u.spec = s
		if err := u.connect(ctx, log); err != nil {
			CloseUpstreams(ups)
			return nil, err
		}
		log.Info("upstream connected", "server_id", s.ServerID, "tools", len(u.tools),
			"prompts", len(u.features.prompts), "resources", len(u.features.resources), "resource_templates", len(u.features.templates))
		ups = append(ups, u)
	}
	return ups, nil
}

// connect makes u's own session (60 s at most) and lists what it offers.
// Its server-to-client traffic goes to u.peer, and its list_changed
// notifications signal u.changed: the gateway lists again and compares
// the definitions with their pins (Start).
func (u *Upstream) connect(ctx context.Context, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	opts := append(slices.Clone(u.opts), relayOptions(u.spec.ServerID, u.peer.Load, u.changed)...)
	cs, err := mcpup.Connect(cctx, u.spec, u.impl, opts...)
	if err != nil {
		return err
	}
	u.session = cs
	if u.tools, err = u.listTools(cctx, log); err != nil {
		_ = cs.Close()
		return err
	}
	u.features = u.listFeatures(cctx, log)
	return nil
}

// upstreamTerminateWait is how long closing a stdio upstream's session
// waits for the process to exit once its stdin is closed, and again after
// SIGTERM, before it is killed: short, so that the gateway exits promptly
// when its client leaves (a client that waits less kills the gateway, and
// an upstream left running would then be orphaned but for
// mcpup.Connect's parent-death signal).
const upstreamTerminateWait = time.Second

// CloseUpstreams closes the sessions of ups (stopping stdio upstreams), all
// at once, and returns when every one is closed: at most about twice
// upstreamTerminateWait for a stdio upstream that ignores its stdin and
// SIGTERM. A Gateway calls it from Close; a caller that keeps upstreams
// without a Gateway calls it itself.
func CloseUpstreams(ups []*Upstream) {
	var wg sync.WaitGroup
	for _, u := range ups {
		wg.Go(func() { _ = u.session.Close() })
	}
	wg.Wait()
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
			if drift, why := ut.drift(d.Registry); drift && !v.Hidden {
				v.Hidden, v.Codes, v.Detail = true, []string{schemas.CodeDenyToolDrift}, why
			}
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
