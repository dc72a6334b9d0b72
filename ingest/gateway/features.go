package gateway

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"
)

// features are the prompts, resources and resource templates an upstream
// lists. The gateway routes them like tools (on a clash of names or URIs
// the first upstream listed keeps it) and offers each principal those the
// registry classifies and its capability covers (visibleFeatures, like
// tools/list); prompts/get and resources/read are decided by Talos like
// tools/call (govern.go), whatever was listed. With
// Options.RelayUngoverned, resources/subscribe and unsubscribe and
// completion/complete, which Talos does not decide, are relayed to the
// upstream that listed the prompt or resource, on the client session's
// relay.
type features struct {
	prompts   []*mcp.Prompt
	resources []*mcp.Resource
	templates []*mcp.ResourceTemplate
}

// listFeatures lists what u's server announced besides tools. A list the
// server fails to give is logged and left empty: it takes nothing else
// down.
func (u *Upstream) listFeatures(ctx context.Context, log *slog.Logger) features {
	var f features
	caps := upstreamCaps(u.session)
	failed := func(what string, err error) {
		log.Warn("upstream "+what+" not listed: none relayed", "server_id", u.spec.ServerID, "err", err)
	}
	if caps.Prompts != nil {
		for p, err := range u.session.Prompts(ctx, nil) {
			if err != nil {
				f.prompts = nil
				failed("prompts", err)
				break
			}
			f.prompts = append(f.prompts, p)
		}
	}
	if caps.Resources == nil {
		return f
	}
	for r, err := range u.session.Resources(ctx, nil) {
		if err != nil {
			f.resources = nil
			failed("resources", err)
			break
		}
		f.resources = append(f.resources, r)
	}
	for t, err := range u.session.ResourceTemplates(ctx, nil) {
		if err != nil {
			f.templates = nil
			var je *jsonrpc.Error
			if !errors.As(err, &je) || je.Code != jsonrpc.CodeMethodNotFound {
				failed("resource templates", err)
			}
			break
		}
		f.templates = append(f.templates, t)
	}
	return f
}

// upstreamCaps is what cs's server announced (empty if nothing).
func upstreamCaps(cs *mcp.ClientSession) *mcp.ServerCapabilities {
	if ir := cs.InitializeResult(); ir != nil && ir.Capabilities != nil {
		return ir.Capabilities
	}
	return &mcp.ServerCapabilities{}
}

// featureRoutes is, for each prompt name, resource URI and resource
// template, the upstream that keeps it and its definition.
type featureRoutes struct {
	prompts   map[string]routed[*mcp.Prompt]
	resources map[string]routed[*mcp.Resource]
	templates map[string]routed[*mcp.ResourceTemplate]
}

type routed[T any] struct {
	server string
	def    T
}

// routeFeatures maps the upstreams' prompts, resources and templates to
// the upstream that keeps each (the first listed, on a clash).
func routeFeatures(ups []*Upstream) featureRoutes {
	fr := featureRoutes{prompts: map[string]routed[*mcp.Prompt]{}, resources: map[string]routed[*mcp.Resource]{},
		templates: map[string]routed[*mcp.ResourceTemplate]{}}
	for _, u := range ups {
		id := u.spec.ServerID
		for _, p := range u.features.prompts {
			if _, taken := fr.prompts[p.Name]; !taken {
				fr.prompts[p.Name] = routed[*mcp.Prompt]{id, p}
			}
		}
		for _, r := range u.features.resources {
			if _, taken := fr.resources[r.URI]; !taken {
				fr.resources[r.URI] = routed[*mcp.Resource]{id, r}
			}
		}
		for _, t := range u.features.templates {
			if _, taken := fr.templates[t.URITemplate]; !taken {
				fr.templates[t.URITemplate] = routed[*mcp.ResourceTemplate]{id, t}
			}
		}
	}
	return fr
}

// resourceServer is the upstream that serves uri: the one listing it,
// else the one whose template matches it.
func (fr featureRoutes) resourceServer(uri string) (string, bool) {
	server, _, ok := fr.resourceRoute(uri)
	return server, ok
}

// resourceRoute is resourceServer with the name its upstream lists the
// resource or the matching template under.
func (fr featureRoutes) resourceRoute(uri string) (server, name string, ok bool) {
	if r, ok := fr.resources[uri]; ok {
		return r.server, r.def.Name, true
	}
	for _, t := range sortedKeys(fr.templates) {
		if tmpl, err := uritemplate.New(t); err == nil && tmpl.Regexp().MatchString(uri) {
			return fr.templates[t].server, fr.templates[t].def.Name, true
		}
	}
	return "", "", false
}

// offerFeatures makes s, principal p's server, offer what routes holds
// that p may see, removing what it offered of old that it no longer
// offers (the SDK tells connected clients the lists changed). Call it
// with g.mu held.
func (g *Gateway) offerFeatures(s *mcp.Server, p *Principal, old, routes featureRoutes) {
	old, routes = g.visibleFeatures(p, old), g.visibleFeatures(p, routes)
	var gone []string
	for name := range old.prompts {
		if _, ok := routes.prompts[name]; !ok {
			gone = append(gone, name)
		}
	}
	s.RemovePrompts(gone...)
	gone = gone[:0]
	for uri := range old.resources {
		if _, ok := routes.resources[uri]; !ok {
			gone = append(gone, uri)
		}
	}
	s.RemoveResources(gone...)
	gone = gone[:0]
	for t := range old.templates {
		if _, ok := routes.templates[t]; !ok {
			gone = append(gone, t)
		}
	}
	s.RemoveResourceTemplates(gone...)
	for _, name := range sortedKeys(routes.prompts) {
		r := routes.prompts[name]
		s.AddPrompt(r.def, g.getPrompt(p))
	}
	for _, uri := range sortedKeys(routes.resources) {
		r := routes.resources[uri]
		s.AddResource(r.def, g.readResource(p))
	}
	for _, t := range sortedKeys(routes.templates) {
		r := routes.templates[t]
		s.AddResourceTemplate(r.def, g.readResource(p))
	}
}

// getPrompt is the prompt handler of p's server; the receiving
// middleware has Talos decide every prompts/get, so it is not reached.
func (g *Gateway) getPrompt(p *Principal) mcp.PromptHandler {
	return func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		res, err := g.run(ctx, g.promptCall(p, req))
		if err != nil {
			return nil, err
		}
		return res.(*mcp.GetPromptResult), nil
	}
}

// readResource is the resource handler of p's server; the receiving
// middleware has Talos decide every resources/read, so it is not reached.
func (g *Gateway) readResource(p *Principal) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		res, err := g.run(ctx, g.resourceCall(p, req))
		if err != nil {
			return nil, err
		}
		return res.(*mcp.ReadResourceResult), nil
	}
}

// serverOptions are the options of principal p's server: the
// capabilities the upstreams announced (tools and logging always;
// prompts and resources, which Talos decides; subscriptions and
// completions, which it does not, only with Options.RelayUngoverned), the
// handlers relaying those, and the protocol versions the relay keeps
// one-to-one.
func (g *Gateway) serverOptions(p *Principal) *mcp.ServerOptions {
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}, Logging: &mcp.LoggingCapabilities{}}
	for _, u := range g.ups {
		c := upstreamCaps(u.session)
		if c.Prompts != nil {
			caps.Prompts = &mcp.PromptCapabilities{ListChanged: true}
		}
		if c.Resources != nil {
			sub := g.o.RelayUngoverned && (c.Resources.Subscribe || (caps.Resources != nil && caps.Resources.Subscribe))
			caps.Resources = &mcp.ResourceCapabilities{ListChanged: true, Subscribe: sub}
		}
		if c.Completions != nil && g.o.RelayUngoverned {
			caps.Completions = &mcp.CompletionCapabilities{}
		}
	}
	o := &mcp.ServerOptions{
		Instructions:              "Tool calls pass through Talos: each is decided, receipted and audited.",
		Capabilities:              caps,
		SupportedProtocolVersions: relayedVersions(),
	}
	if caps.Resources != nil && caps.Resources.Subscribe {
		o.SubscribeHandler = func(ctx context.Context, req *mcp.SubscribeRequest) error {
			return g.subscription(ctx, p, req.Session, req.Params.URI, true)
		}
		o.UnsubscribeHandler = func(ctx context.Context, req *mcp.UnsubscribeRequest) error {
			return g.subscription(ctx, p, req.Session, req.Params.URI, false)
		}
	}
	if caps.Completions != nil {
		o.CompletionHandler = func(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return g.complete(ctx, p, req)
		}
	}
	return o
}

// relayedVersions are the protocol versions the gateway serves: those in
// which a server may send requests to its client while serving one of
// the client's (from 2026-07-28 it answers with input requests for the
// client to retry with, which an upstream of an earlier version cannot
// be relayed to one-to-one). A newer client negotiates down.
func relayedVersions() []string {
	return slices.DeleteFunc(mcp.SupportedProtocolVersions(), func(v string) bool { return v >= "2026-07-28" })
}

// subscription relays resources/subscribe (on) or unsubscribe to the
// upstream serving uri; its notifications/resources/updated reach the
// client sessions subscribed (relayOptions).
func (g *Gateway) subscription(ctx context.Context, p *Principal, ss *mcp.ServerSession, uri string, on bool) error {
	g.mu.Lock()
	server, ok := g.features.resourceServer(uri)
	g.mu.Unlock()
	if !ok {
		return mcp.ResourceNotFoundError(uri)
	}
	r := g.relayOf(p, ss)
	cs, err := r.session(ctx, server)
	if err != nil {
		return err
	}
	if !on {
		return cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri})
	}
	return cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri})
}

// complete relays completion/complete to the upstream of the prompt or
// resource template it refers to.
func (g *Gateway) complete(ctx context.Context, p *Principal, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	ref := req.Params.Ref
	g.mu.Lock()
	var server string
	var ok bool
	switch {
	case ref == nil:
	case ref.Type == "ref/prompt":
		var pr routed[*mcp.Prompt]
		pr, ok = g.features.prompts[ref.Name]
		server = pr.server
	case ref.Type == "ref/resource":
		var t routed[*mcp.ResourceTemplate]
		if t, ok = g.features.templates[ref.URI]; ok {
			server = t.server
		} else {
			server, ok = g.features.resourceServer(ref.URI)
		}
	}
	g.mu.Unlock()
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "talos: no upstream offers what the completion refers to"}
	}
	r := g.relayOf(p, req.Session)
	cs, err := r.session(ctx, server)
	if err != nil {
		return nil, err
	}
	defer r.track(server, ctx)()
	return cs.Complete(ctx, req.Params)
}
