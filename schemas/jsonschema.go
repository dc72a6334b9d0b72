package schemas

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

//go:embed mcp/*.json talos/*.json
var schemaFiles embed.FS

// Embedded schema file paths (relative to this folder).
const (
	FileToolRegistrySchema  = "mcp/tool_registry.schema.json"
	FileToolCallSchema      = "talos/tool_call.schema.json"
	FileToolEffectSchema    = "talos/tool_effect.schema.json"
	FileReceiptSchema       = "talos/receipt.schema.json"
	FileDecisionSchema      = "talos/decision.schema.json"
	FileCapabilitySchema    = "talos/capability.schema.json"
	FileToolCallEventSchema = "talos/toolcall_event.schema.json"
	FileCheckpointSchema    = "talos/checkpoint.schema.json"
)

// schemaBaseURL is the base of every schema's $id; no schema is ever fetched.
const schemaBaseURL = "https://schemas.talos.dev/"

// SchemaFS is the read-only tree of the embedded JSON Schema files, for tools
// that publish or serve them.
func SchemaFS() fs.FS { return schemaFiles }

// compiledSet holds the compiled schemas. It is built once per process and
// is immutable afterwards.
type compiledSet struct {
	toolCall, registry, effect, receipt, decision *jsonschema.Schema
	capability, toolCallEvent, checkpoint         *jsonschema.Schema
	// names are the property names declared anywhere in the schemas; error
	// details print instance path tokens only if they are such a name or an
	// array index, so that an unknown key (input) is never echoed.
	names map[string]bool
	docs  map[string]any // parsed schema documents by file path (for tests)
	// toolCallQuick is the quick check compiled from the same tool call
	// schema document; nil (and toolCallQuickErr set) if that document
	// uses something the quick check does not know, in which case every
	// envelope is validated by the library alone.
	toolCallQuick    *quickSchema
	toolCallQuickErr error
}

var compiled = sync.OnceValues(compileSchemas)

func compileSchemas() (*compiledSet, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	set := &compiledSet{names: map[string]bool{}, docs: map[string]any{}}
	files := []string{FileToolRegistrySchema, FileToolCallSchema, FileToolEffectSchema, FileReceiptSchema, FileDecisionSchema,
		FileCapabilitySchema, FileToolCallEventSchema, FileCheckpointSchema}
	for _, f := range files {
		b, err := schemaFiles.ReadFile(f)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schemas: %s: %w", f, err)
		}
		if err := c.AddResource(schemaBaseURL+f, doc); err != nil {
			return nil, fmt.Errorf("schemas: %s: %w", f, err)
		}
		set.docs[f] = doc
		CollectPropertyNames(doc, set.names)
	}
	var err error
	get := func(f string) *jsonschema.Schema {
		if err != nil {
			return nil
		}
		var s *jsonschema.Schema
		s, err = c.Compile(schemaBaseURL + f)
		if err != nil {
			err = fmt.Errorf("schemas: compile %s: %w", f, err)
		}
		return s
	}
	set.registry = get(FileToolRegistrySchema)
	set.toolCall = get(FileToolCallSchema)
	set.effect = get(FileToolEffectSchema)
	set.receipt = get(FileReceiptSchema)
	set.decision = get(FileDecisionSchema)
	set.capability = get(FileCapabilitySchema)
	set.toolCallEvent = get(FileToolCallEventSchema)
	set.checkpoint = get(FileCheckpointSchema)
	if err != nil {
		return nil, err
	}
	set.toolCallQuick, set.toolCallQuickErr = compileQuickSchema(set.docs[FileToolCallSchema])
	return set, nil
}

// CollectPropertyNames adds to names every property name declared anywhere
// in a decoded JSON Schema document (under any "properties"). Details that
// echo only such names (and array indexes) never echo instance content.
func CollectPropertyNames(v any, names map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		if props, ok := v["properties"].(map[string]any); ok {
			for k := range props {
				names[k] = true
			}
		}
		for _, x := range v {
			CollectPropertyNames(x, names)
		}
	case []any:
		for _, x := range v {
			CollectPropertyNames(x, names)
		}
	}
}

// schemaDetails turns a jsonschema validation error into details that name
// instance paths and keywords only, never instance values.
func (cs *compiledSet) schemaDetails(err error) []string {
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return []string{"/: schema validation failed"}
	}
	seen := map[string]bool{}
	var out []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		loc := SafeLocation(nil, e.InstanceLocation, cs.names)
		if loc == "" {
			loc = "/"
		}
		d := loc + ": " + DescribeError(e.ErrorKind)
		if _, isNot := e.ErrorKind.(*kind.Not); isNot {
			if i := strings.IndexByte(e.SchemaURL, '#'); i >= 0 {
				d += " (schema " + e.SchemaURL[i+1:] + ")"
			}
		}
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	walk(ve)
	sort.Strings(out)
	const maxDetails = 20
	if len(out) > maxDetails {
		out = append(out[:maxDetails], fmt.Sprintf("... %d more", len(out)-maxDetails))
	}
	if len(out) == 0 {
		out = []string{"/: schema validation failed"}
	}
	return out
}

// SafeLocation renders a validation error's instance location as a JSON
// pointer ("" for the root) that echoes only array indexes and the property
// names in declared; any other object key (input, perhaps a secret) is
// printed as "*". doc is the instance that was validated: walking it tells
// an array index from an object key; with a nil doc, a canonical index token
// counts as an index. Every schema-error detail Talos writes (envelope
// validation, a tool's input schema) is rendered by it.
func SafeLocation(doc any, loc []string, declared map[string]bool) string {
	var sb strings.Builder
	cur := doc
	for _, tok := range loc {
		sb.WriteByte('/')
		isIndex := false
		switch c := cur.(type) {
		case []any:
			isIndex = true
			if i, ok := jsonkit.ArrayIndex(tok); ok && i < len(c) {
				cur = c[i]
			} else {
				cur = nil
			}
		case map[string]any:
			cur = c[tok]
		default:
			_, isIndex = jsonkit.ArrayIndex(tok)
			cur = nil
		}
		switch {
		case isIndex:
			sb.WriteString(tok)
		case declared[tok]:
			sb.WriteString(jsonkit.EscapeToken(tok))
		default:
			sb.WriteByte('*')
		}
	}
	return sb.String()
}

// DescribeError names the failed keyword of a leaf validation error. Only
// schema-side facts (keywords, wanted types and formats, required property
// names, how many unknown fields) are printed, never instance values.
func DescribeError(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Required:
		return "required: missing " + strings.Join(k.Missing, ", ")
	case *kind.DependentRequired:
		return "dependentRequired: " + k.Prop + " needs " + strings.Join(k.Missing, ", ")
	case *kind.AdditionalProperties:
		return fmt.Sprintf("additionalProperties: %d unknown field(s)", len(k.Properties))
	case *kind.Not:
		return "not"
	case *kind.FalseSchema:
		return "not allowed here"
	case *kind.Format:
		return "format " + k.Want
	case *kind.Type:
		return "type: want " + strings.Join(k.Want, " or ")
	}
	if p := k.KeywordPath(); len(p) > 0 {
		return strings.Join(p, "/")
	}
	return "invalid"
}
