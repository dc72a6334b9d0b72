package registrylint

import (
	"slices"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// Kinds of findings about prompts and resources (issue 21), which Talos
// decides like tools: MISSING_PROMPT and MISSING_RESOURCE fail the lint (a
// prompts/get or resources/read of one is unclassified, denied in prod);
// STALE_PROMPT and STALE_RESOURCE are warnings.
const (
	MissingPrompt   = "MISSING_PROMPT"
	MissingResource = "MISSING_RESOURCE"
	StalePrompt     = "STALE_PROMPT"
	StaleResource   = "STALE_RESOURCE"
)

// features are the prompts, resources and resource templates a server
// lists.
type features struct {
	prompts   []*mcp.Prompt
	resources []*mcp.Resource
	templates []*mcp.ResourceTemplate
}

// Features notes the prompts, resources and resource templates the
// server lists (as mcpup.WithFeatures hands them over), for Lint to
// compare with the manifest's; without it Lint compares tools only.
func (rep *Report) Features(prompts []*mcp.Prompt, resources []*mcp.Resource, templates []*mcp.ResourceTemplate) {
	rep.features = &features{prompts, resources, templates}
}

// MissingAny reports whether the lint found anything the registry lacks
// that a skeleton would hold: a tool, prompt or resource.
func (rep *Report) MissingAny() bool {
	return rep.Counts[Missing]+rep.Counts[MissingPrompt]+rep.Counts[MissingResource] > 0
}

// compareFeatures is Compare for prompts and resources: live prompts the
// manifest does not name and live resources and templates no manifest
// resource matches (MISSING_*), and manifest prompts and resources that
// match nothing live (STALE_*). A MISSING_RESOURCE names the live
// resource's name (made a valid registry name) and its URI or template.
func compareFeatures(m *schemas.Manifest, f *features) []Finding {
	var out []Finding
	listed := map[string]bool{}
	for _, p := range f.prompts {
		if p == nil || listed[p.Name] {
			continue
		}
		listed[p.Name] = true
		if !slices.ContainsFunc(m.Prompts, func(rp schemas.Prompt) bool { return rp.Name == p.Name }) {
			out = append(out, Finding{Kind: MissingPrompt, Severity: Severity(MissingPrompt), Tool: p.Name,
				Detail: "a prompt on the server, not in the registry: unclassified, prod denies its prompts/get"})
		}
	}
	for i := range m.Prompts {
		if name := m.Prompts[i].Name; !listed[name] {
			out = append(out, Finding{Kind: StalePrompt, Severity: Severity(StalePrompt), Tool: name, Detail: "a prompt in the registry, not on the server"})
		}
	}
	var uris []string // the live resources' URIs and templates
	missing := func(name, uri, what string) {
		uris = append(uris, uri)
		if _, ok := enforce.MatchManifestResource(m, uri); !ok {
			out = append(out, Finding{Kind: MissingResource, Severity: Severity(MissingResource), Tool: name, URI: uri,
				Detail: what + " " + Printable(uri) + " on the server, no registry resource matches it: unclassified, prod denies its reads"})
		}
	}
	for _, r := range f.resources {
		if r != nil {
			missing(r.Name, r.URI, "resource")
		}
	}
	for _, t := range f.templates {
		if t != nil {
			missing(t.Name, t.URITemplate, "resource template")
		}
	}
	for i := range m.Resources {
		one := schemas.Manifest{Resources: m.Resources[i : i+1]}
		if !slices.ContainsFunc(uris, func(u string) bool { _, ok := enforce.MatchManifestResource(&one, u); return ok }) {
			out = append(out, Finding{Kind: StaleResource, Severity: Severity(StaleResource), Tool: m.Resources[i].Name, URI: m.Resources[i].URI,
				Detail: "a resource in the registry that matches nothing the server lists"})
		}
	}
	return out
}

// skeletonFeatures adds the MISSING_PROMPT and MISSING_RESOURCE findings
// to skeleton m, trust_level unknown, each resource named after what the
// server calls it, made a valid registry name unique in m.
func skeletonFeatures(m *schemas.Manifest, findings []Finding) {
	taken := map[string]bool{}
	for _, t := range m.Tools {
		taken[t.ToolName] = true
	}
	unknown := schemas.Exposure{TrustLevel: enforce.TrustUnknown}
	for _, f := range findings {
		switch f.Kind {
		case MissingPrompt:
			name := registryName(f.Tool, "prompt", taken)
			m.Prompts = append(m.Prompts, schemas.Prompt{Name: name, Exposure: unknown})
		case MissingResource:
			name := registryName(f.Tool, "resource", taken)
			m.Resources = append(m.Resources, schemas.Resource{Name: name, URI: f.URI, Exposure: unknown})
		}
	}
}

// registryName is name as a registry prompt or resource name (no "/", ":",
// "*" or space, at most 256 bytes; fallback when nothing is left), made
// unique among taken, which it joins.
func registryName(name, fallback string, taken map[string]bool) string {
	name = strings.Map(func(r rune) rune {
		if r == '/' || r == ':' || r == '*' || r == '\\' || strings.ContainsRune(" \t\r\n\f\v", r) {
			return '-'
		}
		return r
	}, name)
	if len(name) > 240 || name == "" {
		name = fallback
	}
	base := name
	for i := 2; taken[name]; i++ {
		name = base + "-" + strconv.Itoa(i)
	}
	taken[name] = true
	return name
}
