package enforce

import (
	"encoding/json"
	"fmt"

	"github.com/yosida95/uritemplate/v3"

	"github.com/talos-audit/talos/schemas"
)

// Prompts and resources (issue 21): a manifest's prompts and resources are
// decided like read tools of their names. Each becomes the tool entry the
// checks read (class read, its trust and exposure fields, the input_schema
// of its request's arguments, and for a resource resource_pointer /uri, so
// a capability scope's resource:<pattern> is matched against the URI), so
// the registry, capability, incident, preflight and policy checks apply
// unchanged. Names are one namespace with the tools' per server
// (schemas.ParseManifest), so {server_id, tool_name} names one thing.

// The input schemas of a prompt's arguments (strings, as MCP has them)
// and of a resource read's ({uri} and nothing else).
var (
	promptArgsSchema   = json.RawMessage(`{"type":"object","additionalProperties":{"type":"string"}}`)
	resourceArgsSchema = json.RawMessage(`{"type":"object","properties":{"uri":{"type":"string"}},"required":["uri"],"additionalProperties":false}`)
)

// serverRequests are the tool entries a server's requests of its client
// (sampling, elicitation, roots) are checked as: read, recorded, in no registry
// (schemas.IsServerRequest). Their tool_name is the method.
var serverRequests = map[string]*schemas.Tool{
	schemas.MethodSamplingCreateMessage: {ToolName: schemas.MethodSamplingCreateMessage, ToolClass: schemas.ClassRead},
	schemas.MethodElicitationCreate:     {ToolName: schemas.MethodElicitationCreate, ToolClass: schemas.ClassRead},
	schemas.MethodRootsList:             {ToolName: schemas.MethodRootsList, ToolClass: schemas.ClassRead},
}

// uriPointer is where a resource read's request carries its URI.
const uriPointer = "/uri"

type methodKey struct{ server, method, name string }

// governedEntry is one prompt or resource of the registry.
type governedEntry struct {
	server, method string
	tool           schemas.Tool
	version        string
	uri            string                // resources: the manifest's uri
	tmpl           *uritemplate.Template // resources: the URIs it matches
}

// addGoverned adds m's prompts and resources. A resource uri that is not
// an RFC 6570 template is an error.
func (r *Registry) addGoverned(m *schemas.Manifest) error {
	version := m.ServerVersion
	if version == "" {
		version = schemas.UnregisteredToolVersion
	}
	read := func(name string, e schemas.Exposure, schema json.RawMessage) schemas.Tool {
		return schemas.Tool{ToolName: name, ToolClass: schemas.ClassRead, TrustLevel: e.TrustLevel, RiskCategory: e.RiskCategory,
			SubagentAccess: e.SubagentAccess, RequiresApproval: e.RequiresApproval, InputSchema: schema}
	}
	for i := range m.Prompts {
		p := &m.Prompts[i]
		g := &governedEntry{server: m.ServerID, method: schemas.MethodPromptsGet, version: version,
			tool: read(p.Name, p.Exposure, promptArgsSchema)}
		g.tool.MaxArgsBytes = p.MaxArgsBytes
		r.governed[methodKey{m.ServerID, g.method, p.Name}] = g
		r.governedOrder = append(r.governedOrder, g)
	}
	for i := range m.Resources {
		res := &m.Resources[i]
		tmpl, err := uritemplate.New(res.URI)
		if err != nil {
			return fmt.Errorf("server_id %s resource %q: uri is not an RFC 6570 URI template: %v", m.ServerID, res.Name, err)
		}
		g := &governedEntry{server: m.ServerID, method: schemas.MethodResourcesRead, version: version, uri: res.URI, tmpl: tmpl,
			tool: read(res.Name, res.Exposure, resourceArgsSchema)}
		g.tool.ResourcePointer, g.tool.NetworkOutbound = uriPointer, res.NetworkOutbound
		r.governed[methodKey{m.ServerID, g.method, res.Name}] = g
		r.governedOrder = append(r.governedOrder, g)
	}
	return nil
}

// matches reports whether the resource entry g covers uri.
func (g *governedEntry) matches(uri string) bool {
	if g.uri == uri {
		return true
	}
	return g.tmpl != nil && g.tmpl.Regexp().MatchString(uri)
}

// LookupMethod finds the entry a call of method (an envelope's
// mcp_method: "" or tools/call for a tool, prompts/get, resources/read)
// names: a tool, or the tool entry a prompt or resource is decided as.
func (r *Registry) LookupMethod(serverID, method, name string) (*schemas.Tool, bool) {
	if method == "" || method == schemas.MethodToolsCall {
		return r.Lookup(serverID, name)
	}
	if t, ok := serverRequests[method]; ok {
		return t, name == method
	}
	g, ok := r.governed[methodKey{serverID, method, name}]
	if !ok {
		return nil, false
	}
	return &g.tool, true
}

// MatchResource names the first resource of serverID's manifest whose uri
// matches uri (the name a read of it is decided under), and its uri.
func (r *Registry) MatchResource(serverID, uri string) (name, pattern string, ok bool) {
	for _, g := range r.governedOrder {
		if g.server == serverID && g.method == schemas.MethodResourcesRead && g.matches(uri) {
			return g.tool.ToolName, g.uri, true
		}
	}
	return "", "", false
}

// ClassifyCall is Classify for a call of any method: a prompts/get or
// resources/read is classified by its registry entry; a resources/read
// whose arguments' uri that entry does not match is unclassified. A
// server's request of its client is a read named by its method.
func (r *Registry) ClassifyCall(serverID, method, name string, args any) Classification {
	if method == "" || method == schemas.MethodToolsCall {
		return r.Classify(serverID, name, args)
	}
	c := Classification{Version: schemas.UnregisteredToolVersion}
	if t, ok := serverRequests[method]; ok {
		if name == method {
			c.Tool, c.Class = t, schemas.ClassRead
		}
		return c
	}
	g, ok := r.governed[methodKey{serverID, method, name}]
	if !ok {
		return c
	}
	if method == schemas.MethodResourcesRead {
		a, _ := args.(map[string]any)
		uri, _ := a["uri"].(string)
		if !g.matches(uri) {
			return c
		}
		c.Resource, c.HasResource = uri, true
	}
	c.Tool, c.Version, c.Class = &g.tool, g.version, schemas.ClassRead
	return c
}

// MatchManifestResource is MatchResource over one manifest: the name of
// its first resource whose uri is uri or, as an RFC 6570 template,
// matches it (talosctl registry lint).
func MatchManifestResource(m *schemas.Manifest, uri string) (name string, ok bool) {
	for i := range m.Resources {
		res := &m.Resources[i]
		g := governedEntry{uri: res.URI}
		if tmpl, err := uritemplate.New(res.URI); err == nil {
			g.tmpl = tmpl
		}
		if g.matches(uri) {
			return res.Name, true
		}
	}
	return "", false
}
