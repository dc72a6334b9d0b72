package enforce

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// DefaultMaxArgsBytes is the size limit of request.arguments for tools
// without max_args_bytes, when PreflightConfig leaves it 0: 1 MiB.
const DefaultMaxArgsBytes int64 = 1 << 20

// ErrInputSchema wraps every error NewPreflight returns for a tool's
// input_schema; the message names its server_id and tool_name.
var ErrInputSchema = errors.New("enforce: input_schema")

// PreflightConfig configures a Preflight. The zero value means the defaults.
type PreflightConfig struct {
	// MaxArgsBytes is the limit for tools without max_args_bytes; 0 means
	// DefaultMaxArgsBytes. Negative is an error.
	MaxArgsBytes int64
}

// Preflight holds the compiled input_schema of every registry tool
// (compiled once, at construction, as JSON Schema draft 2020-12 unless a
// schema names another draft, with format assertions on and no loading of
// anything outside the schema itself) and runs CSP MUST 7 on a call's
// arguments. A Preflight belongs to one Registry: build a new one when
// another registry is pinned. It is immutable and safe for concurrent use.
type Preflight struct {
	maxArgs int64
	tools   map[toolKey]*inputSchema
}

// inputSchema is one tool's compiled input_schema.
type inputSchema struct {
	tool   *schemas.Tool // the registry entry it was compiled from
	raw    []byte
	schema *jsonschema.Schema
	shape  *shape          // for the unknown-field walk
	names  map[string]bool // property names the schema declares (safe to print)
}

// NewPreflight compiles the input_schema of every tool of reg (nil: an
// empty registry). A schema that does not compile, or whose $ref (or
// $schema) points outside itself, fails construction with an error wrapping
// ErrInputSchema that names server_id and tool_name.
func NewPreflight(reg *Registry, cfg PreflightConfig) (*Preflight, error) {
	if cfg.MaxArgsBytes < 0 {
		return nil, fmt.Errorf("enforce: preflight: max args bytes %d is negative", cfg.MaxArgsBytes)
	}
	if cfg.MaxArgsBytes == 0 {
		cfg.MaxArgsBytes = DefaultMaxArgsBytes
	}
	p := &Preflight{maxArgs: cfg.MaxArgsBytes, tools: map[toolKey]*inputSchema{}}
	if reg == nil {
		return p, nil
	}
	for i := range reg.manifests {
		m := &reg.manifests[i]
		for j := range m.Tools {
			t := &m.Tools[j]
			if len(t.InputSchema) == 0 {
				continue
			}
			is, err := compileInputSchema(m.ServerID, j, t)
			if err != nil {
				return nil, fmt.Errorf("%w: server_id %s tool_name %q: %s", ErrInputSchema, m.ServerID, t.ToolName, oneLine(err.Error()))
			}
			p.tools[toolKey{m.ServerID, t.ToolName}] = is
		}
	}
	for i, g := range reg.governedOrder {
		is, err := compileInputSchema(g.server, -1-i, &g.tool)
		if err != nil {
			return nil, fmt.Errorf("%w: server_id %s %s %q: %s", ErrInputSchema, g.server, g.method, g.tool.ToolName, oneLine(err.Error()))
		}
		p.tools[toolKey{g.server, g.tool.ToolName}] = is
	}
	return p, nil
}

// oneLine joins the lines of a (multi-line) compiler error with "; ", so
// it fits a receipt detail or a log line.
func oneLine(msg string) string {
	lines := strings.Split(msg, "\n")
	out := lines[:0]
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// noLoader refuses every URL: an input_schema is self-contained.
type noLoader struct{}

func (noLoader) Load(u string) (any, error) {
	return nil, fmt.Errorf("reference to %s outside the schema is not allowed", u)
}

func compileInputSchema(serverID string, index int, t *schemas.Tool) (*inputSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(t.InputSchema))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(noLoader{})
	// A private base URL per tool: relative references resolve under it,
	// reach the loader and fail.
	loc := "https://preflight.talos.invalid/" + url.PathEscape(serverID) + "/tools/" + strconv.Itoa(index) + "/input_schema.json"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, err
	}
	b := newShapeBuilder(doc)
	is := &inputSchema{tool: t, raw: t.InputSchema, schema: sch, names: map[string]bool{}}
	is.shape = b.build(doc, false, "")
	b.finish()
	schemas.CollectPropertyNames(doc, is.names)
	return is, nil
}

// lookup finds the compiled schema of tool; nil if this Preflight did not
// compile this exact input_schema (the tool comes from another registry).
func (p *Preflight) lookup(serverID string, tool *schemas.Tool) *inputSchema {
	is, ok := p.tools[toolKey{serverID, tool.ToolName}]
	if !ok {
		return nil
	}
	if is.tool != tool && !bytes.Equal(is.raw, tool.InputSchema) {
		return nil
	}
	return is
}

// Check runs CSP MUST 7 on one call's arguments: args is
// request.arguments as a generic JSON tree (objects map[string]any,
// numbers json.Number or float64; nil means absent, checked as {}), argsLen
// the byte length of its JCS form (or of the raw JSON if the caller has no
// JCS). It returns the codes found, deduplicated, in this order, and
// details that name pointers and keywords, never argument values (a key the
// schema does not declare is printed as "*"):
//
//   - DENY_PAYLOAD_TOO_LARGE: argsLen > tool.MaxArgsBytes, or the default;
//   - DENY_UNKNOWN_FIELDS: an object whose schema declares "properties" has
//     a key that is neither among them nor matched by patternProperties,
//     unless the schema sets additionalProperties (or unevaluatedProperties)
//     to true or to a schema, even without additionalProperties: false
//     (CSP VAL-01: "reject unknown fields"); nested objects and arrays are
//     followed through properties, patternProperties, additionalProperties,
//     items and prefixItems, local $refs and allOf/anyOf/oneOf/if/then/else
//     (the union of what their branches declare); additionalProperties or
//     unevaluatedProperties violations are reported here too;
//   - DENY_SCHEMA_VIOLATION (schemas.CodeDenySchemaViolation): any other
//     input_schema violation; also when this Preflight has no compiled
//     schema for a tool that has one (it belongs to another registry);
//   - DENY_PATH_TRAVERSAL: a string at one of tool.PathPointers (or a
//     string in an array there) escapes the tool's workspace root
//     (PathEscapes); a pointer that does not resolve, or resolves to null,
//     is an absent optional argument; any other value there is denied. The
//     root is tool.WorkspaceRoot, or epRoot (the envelope's workspace_root,
//     the workspace the enforcement point serves) when the registry defers
//     to it (schemas.WorkspaceFromEnforcementPoint). Fail closed: such a
//     tool with no epRoot is denied, and an epRoot that differs from an
//     explicit registry root is denied too (the two disagree on what the
//     server may touch).
//
// A tool without input_schema only gets the size and path checks. A nil
// tool (unclassified) gets none. Both results are nil when nothing is
// found.
func (p *Preflight) Check(serverID string, tool *schemas.Tool, args any, argsLen int, epRoot string) (codes, details []string) {
	if tool == nil {
		return nil, nil
	}
	var f preflightResult
	limit := p.maxArgs
	if tool.MaxArgsBytes != nil {
		limit = *tool.MaxArgsBytes
	}
	if int64(argsLen) > limit {
		f.add(schemas.CodeDenyPayloadTooLarge, fmt.Sprintf("arguments: %d bytes exceed max_args_bytes %d", argsLen, limit))
	}
	if len(tool.InputSchema) > 0 {
		if args == nil {
			args = map[string]any{}
		}
		if is := p.lookup(serverID, tool); is == nil {
			f.add(schemas.CodeDenySchemaViolation, "input_schema: not compiled by this preflight (registry changed)")
		} else {
			is.check(args, &f)
		}
	}
	if len(tool.PathPointers) > 0 {
		checkPaths(tool, args, epRoot, &f)
	}
	return f.codes, f.details
}

// checkPaths is the DENY_PATH_TRAVERSAL part of Check (CSP MUST 7,
// VAL-03).
func checkPaths(tool *schemas.Tool, args any, epRoot string, f *preflightResult) {
	root := tool.WorkspaceRoot
	switch {
	case root == schemas.WorkspaceFromEnforcementPoint && epRoot == "":
		f.add(schemas.CodeDenyPathTraversal, "workspace_root: the registry defers to the enforcement point, which sent none")
		return
	case root == schemas.WorkspaceFromEnforcementPoint:
		root = epRoot
	case epRoot != "" && path.Clean(epRoot) != path.Clean(root):
		f.add(schemas.CodeDenyPathTraversal, "workspace_root: the enforcement point's differs from the registry's")
		return
	}
	for _, ptr := range tool.PathPointers {
		v, ok := jsonkit.ResolvePointer(args, ptr)
		if !ok || v == nil {
			continue
		}
		var paths []any
		if arr, isArr := v.([]any); isArr {
			paths = arr
		} else {
			paths = []any{v}
		}
		for _, pv := range paths {
			s, isStr := pv.(string)
			if !isStr {
				f.add(schemas.CodeDenyPathTraversal, "path_pointers "+ptr+": not a string")
				break
			}
			if esc, why := PathEscapes(root, s); esc {
				f.add(schemas.CodeDenyPathTraversal, "path_pointers "+ptr+": "+why)
				break
			}
		}
	}
}

// preflightResult collects codes (deduplicated, in order) and details
// (deduplicated).
type preflightResult struct {
	codes, details []string
}

func (f *preflightResult) add(code, detail string) {
	if !slices.Contains(f.codes, code) {
		f.codes = append(f.codes, code)
	}
	if detail != "" && !slices.Contains(f.details, detail) {
		f.details = append(f.details, detail)
	}
}

// maxSchemaDetails bounds the details of each preflight code.
const maxSchemaDetails = 20

// check validates args and walks them for unknown fields, adding
// DENY_UNKNOWN_FIELDS before DENY_SCHEMA_VIOLATION.
func (is *inputSchema) check(args any, f *preflightResult) {
	unknown := map[string]bool{}
	w := walker{is: is, unknown: unknown}
	w.walk(args, []*shape{is.shape}, "", 0)

	violations := map[string]bool{}
	if err := is.schema.Validate(args); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			is.classify(args, ve, unknown, violations)
		} else {
			violations["/: invalid"] = true
		}
		if len(unknown) == 0 && len(violations) == 0 {
			violations["/: invalid"] = true
		}
	}
	for _, d := range capped(unknown) {
		f.add(schemas.CodeDenyUnknownFields, "input_schema: "+d+": unknown field")
	}
	for _, d := range capped(violations) {
		f.add(schemas.CodeDenySchemaViolation, "input_schema: "+d)
	}
}

// capped sorts a detail set and bounds it to maxSchemaDetails entries.
func capped(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for d := range set {
		out = append(out, d)
	}
	sort.Strings(out)
	if len(out) > maxSchemaDetails {
		out = append(out[:maxSchemaDetails], fmt.Sprintf("... %d more", len(out)-maxSchemaDetails))
	}
	return out
}

// classify sorts the leaf errors of a validation failure into unknown
// fields (additionalProperties, unevaluatedProperties) and other
// violations, as safe pointers and keywords.
func (is *inputSchema) classify(args any, e *jsonschema.ValidationError, unknown, violations map[string]bool) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			is.classify(args, c, unknown, violations)
		}
		return
	}
	loc := e.InstanceLocation
	switch e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		unknown[schemas.SafeLocation(args, loc, is.names)+"/*"] = true
		return
	case *kind.FalseSchema:
		if strings.HasSuffix(e.SchemaURL, "/unevaluatedProperties") && len(loc) > 0 {
			unknown[schemas.SafeLocation(args, loc[:len(loc)-1], is.names)+"/*"] = true
			return
		}
	}
	violations[orRoot(schemas.SafeLocation(args, loc, is.names))+": "+schemas.DescribeError(e.ErrorKind)] = true
}

// safeKey is k if the schema declares it as a property name, else "*".
func (is *inputSchema) safeKey(k string) string {
	if is.names[k] {
		return jsonkit.EscapeToken(k)
	}
	return "*"
}

// shape is what the unknown-field walk knows of one schema object: the
// properties it declares and where nested values are described. Shapes form
// a graph (local $refs may be cyclic); flat is the closure of a shape over
// its applicators (subs), computed once by shapeBuilder.finish.
type shape struct {
	opaque     bool // cannot be analysed ($dynamicRef, external $ref): allows any key
	hasProps   bool
	props      map[string]*shape
	patterns   []patternShape
	allowExtra bool     // additionalProperties or unevaluatedProperties true or a schema
	extra      []*shape // those schemas
	prefix     []*shape
	items      *shape
	subs       []*shape // $ref, allOf, anyOf, oneOf, if, then, else, dependentSchemas
	flat       []*shape
}

type patternShape struct {
	re *regexp.Regexp
	s  *shape
}

// shapeBuilder turns a schema document into shapes, one per schema object
// (memoised by its location, so $ref cycles terminate).
type shapeBuilder struct {
	root    any
	memo    map[string]*shape
	anchors map[string]anchorTarget
}

type anchorTarget struct {
	node     any
	ptr      string
	embedded bool
}

func newShapeBuilder(root any) *shapeBuilder {
	b := &shapeBuilder{root: root, memo: map[string]*shape{}, anchors: map[string]anchorTarget{}}
	b.collectAnchors(root, "", false)
	return b
}

func (b *shapeBuilder) collectAnchors(v any, ptr string, embedded bool) {
	switch v := v.(type) {
	case map[string]any:
		if _, hasID := v["$id"]; hasID && ptr != "" {
			embedded = true
		}
		if a, ok := v["$anchor"].(string); ok {
			if _, dup := b.anchors[a]; !dup {
				b.anchors[a] = anchorTarget{v, ptr, embedded}
			}
		}
		for k, x := range v {
			b.collectAnchors(x, ptr+"/"+jsonkit.EscapeToken(k), embedded)
		}
	case []any:
		for i, x := range v {
			b.collectAnchors(x, ptr+"/"+strconv.Itoa(i), embedded)
		}
	}
}

// build returns the shape of node, found at ptr in the document. embedded
// says node lies inside a subschema with its own $id, against which local
// "#/..." references would resolve: those are not analysed (opaque).
func (b *shapeBuilder) build(node any, embedded bool, ptr string) *shape {
	if s, ok := b.memo[ptr]; ok {
		return s
	}
	s := &shape{}
	b.memo[ptr] = s
	obj, ok := node.(map[string]any)
	if !ok {
		return s // true / false: no declarations (false is the validator's)
	}
	if _, hasID := obj["$id"]; hasID && ptr != "" {
		embedded = true
	}
	if ref, ok := obj["$ref"].(string); ok {
		if t := b.resolveRef(ref, embedded); t != nil {
			s.subs = append(s.subs, t)
		} else {
			s.opaque = true
		}
	}
	if _, ok := obj["$dynamicRef"]; ok {
		s.opaque = true
	}
	if _, ok := obj["$recursiveRef"]; ok {
		s.opaque = true
	}
	b.objectKeywords(s, obj, embedded, ptr)
	b.arrayKeywords(s, obj, embedded, ptr)
	for _, kw := range []string{"allOf", "anyOf", "oneOf"} {
		if arr, ok := obj[kw].([]any); ok {
			for i, x := range arr {
				s.subs = append(s.subs, b.childAt(embedded, ptr, kw, i, x))
			}
		}
	}
	for _, kw := range []string{"if", "then", "else"} {
		if v, ok := obj[kw]; ok {
			s.subs = append(s.subs, b.child(embedded, ptr, kw, v))
		}
	}
	if ds, ok := obj["dependentSchemas"].(map[string]any); ok {
		for k, v := range ds {
			s.subs = append(s.subs, b.build(v, embedded, ptr+"/dependentSchemas/"+jsonkit.EscapeToken(k)))
		}
	}
	return s
}

// child builds the subschema v of keyword key of the node at ptr.
func (b *shapeBuilder) child(embedded bool, ptr, key string, v any) *shape {
	return b.build(v, embedded, ptr+"/"+jsonkit.EscapeToken(key))
}

// childAt builds the subschema v at index i of keyword key of the node at
// ptr.
func (b *shapeBuilder) childAt(embedded bool, ptr, key string, i int, v any) *shape {
	return b.build(v, embedded, ptr+"/"+jsonkit.EscapeToken(key)+"/"+strconv.Itoa(i))
}

// objectKeywords builds into s the members node obj (at ptr) declares:
// properties, patternProperties, additionalProperties and
// unevaluatedProperties.
func (b *shapeBuilder) objectKeywords(s *shape, obj map[string]any, embedded bool, ptr string) {
	if props, ok := obj["properties"].(map[string]any); ok {
		s.hasProps = true
		s.props = make(map[string]*shape, len(props))
		for k, v := range props {
			s.props[k] = b.build(v, embedded, ptr+"/properties/"+jsonkit.EscapeToken(k))
		}
	}
	if pats, ok := obj["patternProperties"].(map[string]any); ok {
		for pat, v := range pats {
			re, err := regexp.Compile(pat)
			if err != nil {
				s.opaque = true // the compiler accepted it; be lenient here
				continue
			}
			s.patterns = append(s.patterns, patternShape{re, b.build(v, embedded, ptr+"/patternProperties/"+jsonkit.EscapeToken(pat))})
		}
	}
	for _, kw := range []string{"additionalProperties", "unevaluatedProperties"} {
		switch v := obj[kw].(type) {
		case bool:
			s.allowExtra = s.allowExtra || v
		case map[string]any:
			s.allowExtra = true
			s.extra = append(s.extra, b.child(embedded, ptr, kw, v))
		}
	}
}

// arrayKeywords builds into s the elements node obj (at ptr) declares:
// items (a draft 7 tuple with additionalItems, or one schema) and
// prefixItems.
func (b *shapeBuilder) arrayKeywords(s *shape, obj map[string]any, embedded bool, ptr string) {
	switch v := obj["items"].(type) {
	case []any: // draft 7 tuple
		for i, x := range v {
			s.prefix = append(s.prefix, b.childAt(embedded, ptr, "items", i, x))
		}
		if ai, ok := obj["additionalItems"]; ok {
			s.items = b.child(embedded, ptr, "additionalItems", ai)
		}
	case nil:
	default:
		s.items = b.child(embedded, ptr, "items", v)
	}
	if pi, ok := obj["prefixItems"].([]any); ok {
		s.prefix = s.prefix[:0]
		for i, x := range pi {
			s.prefix = append(s.prefix, b.childAt(embedded, ptr, "prefixItems", i, x))
		}
	}
}

// resolveRef resolves a local reference ("#", "#/json/pointer", "#anchor")
// against the document; nil for anything else, and for pointers inside an
// embedded resource.
func (b *shapeBuilder) resolveRef(ref string, embedded bool) *shape {
	if !strings.HasPrefix(ref, "#") {
		return nil
	}
	frag, err := url.PathUnescape(ref[1:])
	if err != nil {
		return nil
	}
	if frag != "" && frag[0] != '/' {
		a, ok := b.anchors[frag]
		if !ok {
			return nil
		}
		if embedded || a.embedded {
			return nil // anchors are scoped to their resource
		}
		return b.build(a.node, false, a.ptr)
	}
	if embedded {
		return nil
	}
	target, ok := jsonkit.ResolvePointer(b.root, frag)
	if !ok {
		return nil
	}
	return b.build(target, false, frag)
}

// finish computes every shape's closure over its applicators.
func (b *shapeBuilder) finish() {
	for _, s := range b.memo {
		seen := map[*shape]bool{}
		var visit func(x *shape)
		visit = func(x *shape) {
			if seen[x] {
				return
			}
			seen[x] = true
			s.flat = append(s.flat, x)
			for _, sub := range x.subs {
				visit(sub)
			}
		}
		visit(s)
	}
}

// maxWalkDepth bounds the unknown-field walk; deeper values are left to the
// validator.
const maxWalkDepth = 128

// walker finds unknown fields in an instance.
type walker struct {
	is      *inputSchema
	unknown map[string]bool
}

// walk visits v, described by shapes, at the safe pointer loc.
func (w *walker) walk(v any, shapes []*shape, loc string, depth int) {
	if depth > maxWalkDepth || len(shapes) == 0 {
		return
	}
	var flat []*shape
	for _, s := range shapes {
		flat = append(flat, s.flat...)
	}
	switch v := v.(type) {
	case map[string]any:
		declared, allowExtra := false, false
		for _, s := range flat {
			declared = declared || s.hasProps
			allowExtra = allowExtra || s.allowExtra || s.opaque
		}
		for k, val := range v {
			var next []*shape
			for _, s := range flat {
				if c, ok := s.props[k]; ok {
					next = append(next, c)
				}
				for _, ps := range s.patterns {
					if ps.re.MatchString(k) {
						next = append(next, ps.s)
					}
				}
			}
			if len(next) == 0 {
				if declared && !allowExtra {
					w.unknown[loc+"/*"] = true
					continue
				}
				for _, s := range flat {
					next = append(next, s.extra...)
				}
			}
			if isContainer(val) {
				w.walk(val, next, loc+"/"+w.is.safeKey(k), depth+1)
			}
		}
	case []any:
		for i, val := range v {
			if !isContainer(val) {
				continue
			}
			var next []*shape
			for _, s := range flat {
				if i < len(s.prefix) {
					next = append(next, s.prefix[i])
				} else if s.items != nil {
					next = append(next, s.items)
				}
			}
			w.walk(val, next, loc+"/"+strconv.Itoa(i), depth+1)
		}
	}
}

// orRoot is a safe pointer, or "/" for the root (whose pointer is "").
func orRoot(loc string) string {
	if loc == "" {
		return "/"
	}
	return loc
}

func isContainer(v any) bool {
	switch v.(type) {
	case map[string]any, []any:
		return true
	}
	return false
}
