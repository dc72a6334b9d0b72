package mcpup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Errors of FilterActionEnum, for callers that branch (the gateway hides
// the tool in either case).
var (
	// ErrNoActionEnum: the schema has no enum, const, or oneOf/anyOf of
	// consts at the action pointer, so there is nothing to narrow.
	ErrNoActionEnum = errors.New("mcpup: no action enum at the action pointer")
	// ErrNoAllowedActions: none of the schema's actions is allowed.
	ErrNoAllowedActions = errors.New("mcpup: no allowed action left in the schema")
)

// maxSchemaDepth bounds the walk through nested schemas and $ref chains
// (a cyclic $ref stops here rather than looping), and maxSchemaSteps the
// schemas visited in all (branching $refs could otherwise make an upstream's
// schema cost exponential time).
const (
	maxSchemaDepth = 64
	maxSchemaSteps = 100_000
)

// ActionEnum returns the values an action-based tool's input schema allows
// at actionPointer, an RFC 6901 pointer into the call's arguments such as
// "/action" or "/request/op" (the registry's action_pointer). Each pointer
// token is looked up under the schema's "properties" (a numeric token under
// "items" or "prefixItems"), through local "$ref"s and through the branches
// of allOf/anyOf/oneOf; at the end the values are the union of "enum"
// strings, "const" strings and, recursively, the enum/const of oneOf/anyOf
// branches. inputSchema is a decoded schema (map[string]any, as the SDK gives
// a client) or its JSON (json.RawMessage, []byte, string). ok is false when
// no string value is found there. Values keep schema order, without
// duplicates.
func ActionEnum(inputSchema any, actionPointer string) (values []string, ok bool) {
	root, err := decodeSchema(inputSchema)
	if err != nil {
		return nil, false
	}
	toks, err := pointerTokens(actionPointer)
	if err != nil {
		return nil, false
	}
	w := &schemaWalker{root: root, seen: map[string]bool{}}
	w.node(root, toks, 0)
	if w.steps > maxSchemaSteps {
		return nil, false
	}
	return w.values, len(w.values) > 0
}

// FilterActionEnum returns inputSchema with the action values at
// actionPointer (found as ActionEnum finds them) narrowed to allowed: enum
// entries not allowed are removed, and so are oneOf/anyOf branches whose
// const (or whose action property, for a union of object schemas) is not
// allowed. This is CM-WRAPPER's ReadOnlyToolWrapper "belt": the caller shows
// the narrowed schema in tools/list and still rejects other actions at call
// time. It fails with ErrNoActionEnum when there is nothing to narrow and
// ErrNoAllowedActions when nothing allowed remains. The input is not
// modified; the output's object keys are sorted.
func FilterActionEnum(inputSchema json.RawMessage, actionPointer string, allowed []string) (json.RawMessage, error) {
	root, err := decodeSchema(inputSchema)
	if err != nil {
		return nil, fmt.Errorf("mcpup: input schema: %w", err)
	}
	toks, err := pointerTokens(actionPointer)
	if err != nil {
		return nil, fmt.Errorf("mcpup: action pointer %q: %w", actionPointer, err)
	}
	w := &schemaWalker{root: root, seen: map[string]bool{}, allowed: map[string]bool{}}
	for _, a := range allowed {
		w.allowed[a] = true
	}
	found, keep := w.node(root, toks, 0)
	switch {
	case w.steps > maxSchemaSteps:
		return nil, fmt.Errorf("%w: the schema is too complex to walk (over %d sub-schemas)", ErrNoActionEnum, maxSchemaSteps)
	case !found:
		return nil, ErrNoActionEnum
	case !keep:
		return nil, ErrNoAllowedActions
	}
	out, err := json.Marshal(root)
	if err != nil {
		return nil, fmt.Errorf("mcpup: input schema: %w", err)
	}
	return out, nil
}

// schemaWalker visits the schemas at an action pointer. With allowed nil it
// only collects values; otherwise it narrows them in place.
type schemaWalker struct {
	root    any
	allowed map[string]bool // nil: collect only
	values  []string
	seen    map[string]bool
	steps   int // schemas visited; over maxSchemaSteps the walk gives up
}

// step counts a visit and reports whether the walk may go on.
func (w *schemaWalker) step(depth int) bool {
	w.steps++
	return depth <= maxSchemaDepth && w.steps <= maxSchemaSteps
}

func (w *schemaWalker) filtering() bool { return w.allowed != nil }

func (w *schemaWalker) collect(v string) {
	if !w.seen[v] {
		w.seen[v] = true
		w.values = append(w.values, v)
	}
}

// node walks schema n for the remaining pointer tokens. found: some schema
// at the pointer has values; keep: some value there is allowed (always true
// when only collecting). A schema that does not mention the pointer's
// property is neither found nor dropped.
func (w *schemaWalker) node(n any, toks []string, depth int) (found, keep bool) {
	m, ok := n.(map[string]any)
	if !ok || !w.step(depth) {
		return false, false
	}
	if len(toks) == 0 {
		return w.leaf(m, depth)
	}
	keep = true
	// merge combines a sub-schema that every value must satisfy (its own
	// property, $ref, allOf): if it rules out every allowed action, so does n.
	merge := func(f, k bool) {
		if f {
			found = true
			keep = keep && k
		}
	}
	if ref, ok := w.ref(m); ok {
		merge(w.node(ref, toks, depth+1))
	}
	if props, ok := m["properties"].(map[string]any); ok {
		if p, ok := props[toks[0]]; ok {
			merge(w.node(p, toks[1:], depth+1))
		}
	}
	if i, err := strconv.Atoi(toks[0]); err == nil && i >= 0 && strconv.Itoa(i) == toks[0] {
		if pre, ok := m["prefixItems"].([]any); ok && i < len(pre) {
			merge(w.node(pre[i], toks[1:], depth+1))
		} else if items, ok := m["items"].(map[string]any); ok {
			merge(w.node(items, toks[1:], depth+1))
		}
	}
	if all, ok := m["allOf"].([]any); ok {
		for _, b := range all {
			merge(w.node(b, toks, depth+1))
		}
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		if f, k := w.branches(m, kw, func(b any) (bool, bool) { return w.node(b, toks, depth+1) }); f {
			merge(true, k)
		}
	}
	return found, found && keep
}

// leaf reads (or narrows) the values of the schema at the pointer.
func (w *schemaWalker) leaf(m map[string]any, depth int) (found, keep bool) {
	keep = true
	merge := func(f, k bool) {
		if f {
			found = true
			keep = keep && k
		}
	}
	if ref, ok := w.ref(m); ok {
		if r, ok := ref.(map[string]any); ok && w.step(depth) {
			merge(w.leaf(r, depth+1))
		}
	}
	if enum, ok := m["enum"].([]any); ok {
		var kept []any
		sawString := false
		for _, v := range enum {
			s, isStr := v.(string)
			if !isStr {
				continue
			}
			sawString = true
			if !w.filtering() {
				w.collect(s)
			}
			if w.allowed[s] {
				kept = append(kept, s)
			}
		}
		if sawString {
			if w.filtering() {
				if kept == nil {
					kept = []any{}
				}
				m["enum"] = kept
			}
			merge(true, !w.filtering() || len(kept) > 0)
		}
	}
	if c, ok := m["const"].(string); ok {
		if !w.filtering() {
			w.collect(c)
		}
		merge(true, !w.filtering() || w.allowed[c])
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		if f, k := w.branches(m, kw, func(b any) (bool, bool) {
			bm, ok := b.(map[string]any)
			if !ok || !w.step(depth) {
				return false, false
			}
			return w.leaf(bm, depth+1)
		}); f {
			merge(true, k)
		}
	}
	return found, found && keep
}

// branches walks the alternatives of m[kw] (oneOf or anyOf). When
// filtering, alternatives that have values but none allowed are removed;
// keep says whether any alternative still admits an allowed value.
func (w *schemaWalker) branches(m map[string]any, kw string, walk func(any) (bool, bool)) (found, keep bool) {
	bs, ok := m[kw].([]any)
	if !ok {
		return false, false
	}
	kept := bs[:0:0]
	for _, b := range bs {
		f, k := walk(b)
		if f {
			found = true
			if !k {
				continue // rules out every allowed action: drop it
			}
			keep = true
		}
		kept = append(kept, b)
	}
	if w.filtering() && found && len(kept) < len(bs) {
		if len(kept) == 0 {
			delete(m, kw) // the caller reports !keep; the schema is not used
		} else {
			m[kw] = kept
		}
	}
	return found, keep
}

// ref resolves m's "$ref" when it is a local JSON pointer ("#/$defs/x").
func (w *schemaWalker) ref(m map[string]any) (any, bool) {
	s, ok := m["$ref"].(string)
	if !ok || !strings.HasPrefix(s, "#") {
		return nil, false
	}
	toks, err := pointerTokens(s[1:])
	if err != nil {
		return nil, false
	}
	cur := w.root
	for _, t := range toks {
		switch c := cur.(type) {
		case map[string]any:
			if cur, ok = c[t]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(t)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// decodeSchema turns any form of a schema into a fresh tree of
// map[string]any and []any that the walker may modify (numbers as
// json.Number, so they survive re-encoding exactly).
func decodeSchema(s any) (any, error) {
	var raw []byte
	switch v := s.(type) {
	case nil:
		return nil, errors.New("no schema")
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	case string:
		raw = []byte(v)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("trailing data after the schema")
	}
	if _, ok := out.(map[string]any); !ok {
		return nil, errors.New("schema is not a JSON object")
	}
	return out, nil
}

// pointerTokens splits an RFC 6901 pointer ("" is the whole document).
func pointerTokens(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, errors.New("a JSON pointer starts with '/'")
	}
	parts := strings.Split(p[1:], "/")
	for i, t := range parts {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 >= len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, errors.New("'~' must be followed by 0 or 1")
			}
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return parts, nil
}
