package mcpup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/yosida95/uritemplate/v3"
)

// Kinds of the definitions a server lists (Rejected.Kind).
const (
	KindTool             = "tool"
	KindPrompt           = "prompt"
	KindResource         = "resource"
	KindResourceTemplate = "resource template"
)

// Rejected is a definition a server listed that cannot be served on: it
// does not decode as its MCP type, or the MCP SDK would refuse to offer it
// (CheckTool, CheckPrompt, CheckResource, CheckResourceTemplate).
type Rejected struct {
	ServerID string `json:"server_id"`
	Kind     string `json:"kind"`
	// Name is the tool's or prompt's name, or the resource's URI or
	// template, as listed ("" when it has none that decodes).
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

func (r Rejected) String() string {
	return fmt.Sprintf("server %s: %s %q: %s", r.ServerID, r.Kind, r.Name, r.Reason)
}

// CheckTool says why t cannot be offered to MCP clients, or nil: it needs
// a name, and an input schema that is a JSON object of "type": "object"
// which compiles as a JSON Schema (the SDK refuses any other; a client
// could not form arguments against it). An output schema, when present,
// must compile too.
func CheckTool(t *mcp.Tool) error {
	if t == nil {
		return errors.New("null definition")
	}
	if t.Name == "" {
		return errors.New("no name")
	}
	if t.InputSchema == nil {
		return errors.New("no inputSchema")
	}
	in, err := schemaObject(t.InputSchema)
	if err != nil {
		return fmt.Errorf("inputSchema: %w", err)
	}
	if in["type"] != "object" {
		return fmt.Errorf(`inputSchema: "type" must be "object" (got %s)`, jsonText(in["type"]))
	}
	if err := compiles(in); err != nil {
		return fmt.Errorf("inputSchema: %w", err)
	}
	if t.OutputSchema != nil {
		out, err := schemaObject(t.OutputSchema)
		if err == nil {
			err = compiles(out)
		}
		if err != nil {
			return fmt.Errorf("outputSchema: %w", err)
		}
	}
	return nil
}

// CheckPrompt says why p cannot be offered, or nil: it needs a name, and
// each of its arguments one.
func CheckPrompt(p *mcp.Prompt) error {
	if p == nil {
		return errors.New("null definition")
	}
	if p.Name == "" {
		return errors.New("no name")
	}
	for i, a := range p.Arguments {
		if a == nil || a.Name == "" {
			return fmt.Errorf("argument %d has no name", i)
		}
	}
	return nil
}

// CheckResource says why r cannot be offered, or nil: its URI must parse
// and be absolute.
func CheckResource(r *mcp.Resource) error {
	if r == nil {
		return errors.New("null definition")
	}
	u, err := url.Parse(r.URI)
	if err != nil {
		return errors.New("uri does not parse")
	}
	if u.Scheme == "" {
		return errors.New("uri is not absolute")
	}
	return nil
}

// CheckResourceTemplate says why t cannot be offered, or nil: its URI
// template must be an RFC 6570 template with a scheme.
func CheckResourceTemplate(t *mcp.ResourceTemplate) error {
	if t == nil {
		return errors.New("null definition")
	}
	if _, err := uritemplate.New(t.URITemplate); err != nil {
		return errors.New("uriTemplate is not an RFC 6570 template")
	}
	scheme, _, ok := strings.Cut(t.URITemplate, ":")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "{}/?#") {
		return errors.New("uriTemplate is not absolute")
	}
	return nil
}

// schemaObject is a schema as a decoded JSON object.
func schemaObject(s any) (map[string]any, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, errors.New("not JSON")
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, errors.New("not a JSON object")
	}
	return m, nil
}

// compiles reports whether schema compiles as a JSON Schema (draft
// 2020-12 unless its $schema names another). Nothing is fetched: a $ref
// outside the schema fails.
func compiles(schema map[string]any) error {
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	const loc = "urn:talos:upstream-schema"
	if err := c.AddResource(loc, schema); err != nil {
		return errors.New("does not compile as a JSON Schema")
	}
	if _, err := c.Compile(loc); err != nil {
		return errors.New("does not compile as a JSON Schema")
	}
	return nil
}

// noLoader refuses every schema the compiler would fetch.
type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errors.New("remote schemas are not fetched") }

// jsonText is v as JSON, for a message.
func jsonText(v any) string {
	if v == nil {
		return "none"
	}
	b, _ := json.Marshal(v)
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}
