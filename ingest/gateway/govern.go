package gateway

import (
	"context"
	"encoding/json"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/schemas"
)

// Prompts and resources are decided by Talos like tools (issue 21): every
// prompts/get and resources/read becomes a signed pre envelope whose
// mcp_method names the request, is forwarded only on allow (or a human
// approval), and is reported by a post event with its result, which the
// worker redacts and hashes like a tool's. A denial is the same JSON-RPC
// error as a tool's, with its receipt id.
//
// A prompt's tool_name is its name and its request the prompts/get params.
// A resource read's tool_name is the name of the registry resource whose
// uri matches the URI (the worker checks that it does), else the name its
// upstream lists it or its template under; its arguments are {uri}, so
// the URI itself, which may carry a secret, is redacted and hashed like
// an argument and never becomes a name.

// unlistedResource is the tool_name of a resources/read of a URI whose
// upstream gives no usable name for it, or that no upstream serves.
const unlistedResource = "unlisted-resource"

// promptCall is a prompts/get to decide, with the gateway's own verdict.
func (g *Gateway) promptCall(p *Principal, req *mcp.GetPromptRequest) *pending {
	params := req.Params
	args, _ := json.Marshal(params.Arguments) // a map of strings
	c := &pending{p: p, ss: req.Session, extra: req.Extra, token: params.GetProgressToken(), meta: params.Meta,
		method: schemas.MethodPromptsGet, name: params.Name, server: unroutedServer, args: args}
	g.mu.Lock()
	pr, routed := g.features.prompts[params.Name]
	g.mu.Unlock()
	if !routed {
		c.local, c.localDetail = []string{schemas.CodeToolHidden, schemas.CodeUnknownTool}, "no upstream offers this prompt"
		return c
	}
	c.server, c.routed = pr.server, true
	c.local, c.localDetail = g.governedCheck(p, c)
	c.upstream = forward(g, c, &mcp.GetPromptParams{Name: params.Name, Arguments: params.Arguments}, (*mcp.ClientSession).GetPrompt)
	return c
}

// resourceCall is a resources/read to decide, with the gateway's own
// verdict.
func (g *Gateway) resourceCall(p *Principal, req *mcp.ReadResourceRequest) *pending {
	params := req.Params
	uri := params.URI
	args, _ := json.Marshal(map[string]string{"uri": uri})
	c := &pending{p: p, ss: req.Session, extra: req.Extra, token: params.GetProgressToken(), meta: params.Meta,
		method: schemas.MethodResourcesRead, name: unlistedResource, server: unroutedServer, args: args}
	g.mu.Lock()
	server, listed, routed := g.features.resourceRoute(uri)
	g.mu.Unlock()
	if !routed {
		c.local, c.localDetail = []string{schemas.CodeToolHidden, schemas.CodeUnknownTool}, "no upstream offers this resource"
		return c
	}
	c.server, c.routed = server, true
	if name, _, ok := g.o.Registry.MatchResource(server, uri); ok {
		c.name = name
		c.local, c.localDetail = g.governedCheck(p, c)
	} else {
		if listed != "" && len(listed) <= 256 && utf8.ValidString(listed) {
			c.name = listed
		}
		c.local, c.localDetail = []string{schemas.CodeToolHidden, schemas.CodeUnknownTool}, "the registry lists no resource of "+server+" matching this URI"
	}
	c.upstream = forward(g, c, &mcp.ReadResourceParams{URI: uri}, (*mcp.ClientSession).ReadResource)
	return c
}

// forward is the upstream step of a governed request c: up sent by send
// on the session of c's server, with the client's progress token mapped.
func forward[P interface{ SetProgressToken(any) }, R mcp.Result](g *Gateway, c *pending, up P,
	send func(*mcp.ClientSession, context.Context, P) (R, error)) func(context.Context, *relay) (mcp.Result, bool, error) {
	return func(ctx context.Context, r *relay) (mcp.Result, bool, error) {
		cs, err := r.session(ctx, c.server)
		if err != nil {
			return nil, false, err
		}
		defer r.track(c.server, ctx)()
		defer g.mapProgress(r, ctx, c.token, up)()
		res, err := send(cs, ctx, up)
		if err != nil {
			return nil, false, err
		}
		return res, true, nil
	}
}

// governedCheck is the gateway's own refusal of a prompt or resource p
// may not see (the worker decides again, independently); nil when
// discovery has no objection.
func (g *Gateway) governedCheck(p *Principal, c *pending) ([]string, string) {
	v := g.o.Discovery.SeeMethod(p.Viewer, c.server, c.method, c.name)
	if v.Hidden {
		return v.Codes, v.Detail
	}
	return nil, ""
}

// visibleFeatures is what p may see of fr: the prompts, resources and
// templates the registry classifies that p's capability covers (a
// template is classified when a registry resource's uri is it or matches
// it).
func (g *Gateway) visibleFeatures(p *Principal, fr featureRoutes) featureRoutes {
	out := featureRoutes{prompts: map[string]routed[*mcp.Prompt]{}, resources: map[string]routed[*mcp.Resource]{},
		templates: map[string]routed[*mcp.ResourceTemplate]{}}
	for name, r := range fr.prompts {
		if !g.o.Discovery.SeeMethod(p.Viewer, r.server, schemas.MethodPromptsGet, name).Hidden {
			out.prompts[name] = r
		}
	}
	for uri, r := range fr.resources {
		if g.seesResource(p, r.server, uri) {
			out.resources[uri] = r
		}
	}
	for t, r := range fr.templates {
		if g.seesResource(p, r.server, t) {
			out.templates[t] = r
		}
	}
	return out
}

// seesResource reports whether p sees the resource uri (or template) of
// server.
func (g *Gateway) seesResource(p *Principal, server, uri string) bool {
	name, _, ok := g.o.Registry.MatchResource(server, uri)
	return ok && !g.o.Discovery.SeeMethod(p.Viewer, server, schemas.MethodResourcesRead, name).Hidden
}
