package mcpup

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// schemas used by the ActionEnum and FilterActionEnum tests.
const (
	flatEnum = `{"type":"object","properties":{"action":{"type":"string","enum":["list","get","create","delete"]},"id":{"type":"integer","maximum":10}}}`

	nestedEnum = `{"type":"object","properties":{"request":{"type":"object","properties":{"op":{"enum":["read","write",7,null]}}}}}`

	oneOfConst = `{"type":"object","properties":{"action":{"oneOf":[{"const":"list","description":"List"},{"const":"create"},{"const":"delete"}]}}}`

	anyOfMixed = `{"properties":{"action":{"anyOf":[{"enum":["a","b"]},{"const":"c"},{"type":"null"}]}}}`

	// A discriminated union: each branch is an object with its own const.
	union = `{"type":"object","oneOf":[
		{"properties":{"action":{"const":"list"},"q":{"type":"string"}},"required":["action"]},
		{"properties":{"action":{"const":"send"},"to":{"type":"string"}},"required":["action"]},
		{"properties":{"action":{"const":"label"}},"required":["action"]}
	]}`

	refEnum = `{"$defs":{"Op":{"type":"string","enum":["x","y","z"]},"Req":{"type":"object","properties":{"op":{"$ref":"#/$defs/Op"}}}},
		"type":"object","properties":{"req":{"$ref":"#/$defs/Req"}}}`

	arrayItems = `{"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"kind":{"enum":["k1","k2"]}}}},
		"pair":{"type":"array","prefixItems":[{"enum":["p0"]},{"enum":["p1a","p1b"]}]}}}`

	escaped = `{"properties":{"a/b":{"properties":{"m~n":{"enum":["e1","e2"]}}}}}`

	noEnum = `{"type":"object","properties":{"action":{"type":"string"}}}`

	cyclic = `{"$defs":{"A":{"$ref":"#/$defs/A"}},"properties":{"action":{"$ref":"#/$defs/A"}}}`
)

func TestActionEnum(t *testing.T) {
	cases := []struct {
		name    string
		schema  string
		pointer string
		want    []string // nil: not found
	}{
		{"flat enum", flatEnum, "/action", []string{"list", "get", "create", "delete"}},
		{"nested enum skips non-strings", nestedEnum, "/request/op", []string{"read", "write"}},
		{"oneOf const", oneOfConst, "/action", []string{"list", "create", "delete"}},
		{"anyOf enum and const", anyOfMixed, "/action", []string{"a", "b", "c"}},
		{"discriminated union", union, "/action", []string{"list", "send", "label"}},
		{"local refs", refEnum, "/req/op", []string{"x", "y", "z"}},
		{"array items", arrayItems, "/steps/3/kind", []string{"k1", "k2"}},
		{"prefixItems", arrayItems, "/pair/1", []string{"p1a", "p1b"}},
		{"escaped tokens", escaped, "/a~1b/m~0n", []string{"e1", "e2"}},
		{"no enum", noEnum, "/action", nil},
		{"missing property", flatEnum, "/verb", nil},
		{"pointer too deep", flatEnum, "/action/x", nil},
		{"non-numeric array token", arrayItems, "/steps/first/kind", nil},
		{"bad pointer", flatEnum, "action", nil},
		{"cyclic ref terminates", cyclic, "/action", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ActionEnum(json.RawMessage(c.schema), c.pointer)
			if ok != (c.want != nil) || !slices.Equal(got, c.want) {
				t.Fatalf("ActionEnum(%s) = %q, %v; want %q", c.pointer, got, ok, c.want)
			}
		})
	}
}

// TestActionEnumDecodedSchema: the SDK hands a client the schema as
// map[string]any; that form gives the same answer as the JSON.
func TestActionEnumDecodedSchema(t *testing.T) {
	var m map[string]any
	if err := json.Unmarshal([]byte(union), &m); err != nil {
		t.Fatal(err)
	}
	got, ok := ActionEnum(m, "/action")
	if !ok || !slices.Equal(got, []string{"list", "send", "label"}) {
		t.Fatalf("ActionEnum(map) = %q, %v", got, ok)
	}
	if _, ok := ActionEnum(nil, "/action"); ok {
		t.Fatal("ActionEnum(nil) found values")
	}
	if _, ok := ActionEnum(json.RawMessage(`[1]`), ""); ok {
		t.Fatal("ActionEnum of a non-object found values")
	}
}

func TestFilterActionEnum(t *testing.T) {
	cases := []struct {
		name    string
		schema  string
		pointer string
		allowed []string
		want    []string // ActionEnum of the result
		check   func(t *testing.T, out map[string]any)
	}{
		{name: "flat enum", schema: flatEnum, pointer: "/action", allowed: []string{"get", "list", "unknown"}, want: []string{"list", "get"},
			check: func(t *testing.T, out map[string]any) {
				// Other properties are untouched, numbers exactly as given.
				id := out["properties"].(map[string]any)["id"].(map[string]any)
				if id["maximum"] != json.Number("10") || id["type"] != "integer" {
					t.Fatalf("id property changed: %v", id)
				}
			}},
		{name: "nested enum drops non-strings", schema: nestedEnum, pointer: "/request/op", allowed: []string{"read"}, want: []string{"read"},
			check: func(t *testing.T, out map[string]any) {
				op := dig(out, "properties", "request", "properties", "op")
				if !reflect.DeepEqual(op["enum"], []any{"read"}) {
					t.Fatalf("enum = %v", op["enum"])
				}
			}},
		{name: "oneOf const drops branches", schema: oneOfConst, pointer: "/action", allowed: []string{"list"}, want: []string{"list"},
			check: func(t *testing.T, out map[string]any) {
				br := dig(out, "properties", "action")["oneOf"].([]any)
				if len(br) != 1 || br[0].(map[string]any)["description"] != "List" {
					t.Fatalf("oneOf = %v", br)
				}
			}},
		{name: "anyOf keeps the branch without values", schema: anyOfMixed, pointer: "/action", allowed: []string{"b"}, want: []string{"b"},
			check: func(t *testing.T, out map[string]any) {
				br := dig(out, "properties", "action")["anyOf"].([]any)
				if len(br) != 2 || br[1].(map[string]any)["type"] != "null" {
					t.Fatalf("anyOf = %v", br)
				}
			}},
		{name: "discriminated union drops object branches", schema: union, pointer: "/action", allowed: []string{"list", "label"}, want: []string{"list", "label"},
			check: func(t *testing.T, out map[string]any) {
				if n := len(out["oneOf"].([]any)); n != 2 {
					t.Fatalf("%d branches left, want 2", n)
				}
			}},
		{name: "through refs", schema: refEnum, pointer: "/req/op", allowed: []string{"z", "x"}, want: []string{"x", "z"}},
		{name: "array items", schema: arrayItems, pointer: "/steps/0/kind", allowed: []string{"k2"}, want: []string{"k2"}},
		{name: "escaped tokens", schema: escaped, pointer: "/a~1b/m~0n", allowed: []string{"e2"}, want: []string{"e2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := json.RawMessage(c.schema)
			before := string(in)
			out, err := FilterActionEnum(in, c.pointer, c.allowed)
			if err != nil {
				t.Fatalf("FilterActionEnum: %v", err)
			}
			if string(in) != before {
				t.Fatal("the input schema was modified")
			}
			got, ok := ActionEnum(out, c.pointer)
			if !ok || !slices.Equal(got, c.want) {
				t.Fatalf("actions after filtering = %q, %v; want %q\n%s", got, ok, c.want, out)
			}
			if c.check != nil {
				d := json.NewDecoder(bytesReader(out))
				d.UseNumber()
				var m map[string]any
				if err := d.Decode(&m); err != nil {
					t.Fatal(err)
				}
				c.check(t, m)
			}
		})
	}
}

func TestFilterActionEnumErrors(t *testing.T) {
	cases := []struct {
		name    string
		schema  string
		pointer string
		allowed []string
		want    error
	}{
		{"nothing allowed (enum)", flatEnum, "/action", []string{"nope"}, ErrNoAllowedActions},
		{"nothing allowed (empty list)", oneOfConst, "/action", nil, ErrNoAllowedActions},
		{"nothing allowed (union)", union, "/action", []string{"delete"}, ErrNoAllowedActions},
		{"no enum", noEnum, "/action", []string{"x"}, ErrNoActionEnum},
		{"missing property", flatEnum, "/verb", []string{"list"}, ErrNoActionEnum},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := FilterActionEnum(json.RawMessage(c.schema), c.pointer, c.allowed)
			if !errors.Is(err, c.want) {
				t.Fatalf("FilterActionEnum = %s, %v; want %v", out, err, c.want)
			}
		})
	}
	if _, err := FilterActionEnum(json.RawMessage(`{"a":`), "/a", []string{"x"}); err == nil {
		t.Fatal("malformed schema: no error")
	}
	if _, err := FilterActionEnum(json.RawMessage(flatEnum), "action", []string{"list"}); err == nil {
		t.Fatal("pointer without leading '/': no error")
	}
}

// TestFilterActionEnumAllOf: a constraint every value must meet (allOf)
// that rules out all allowed actions rules out the tool.
func TestFilterActionEnumAllOf(t *testing.T) {
	s := `{"allOf":[{"properties":{"action":{"enum":["a","b"]}}},{"properties":{"action":{"enum":["b","c"]}}}]}`
	if _, err := FilterActionEnum(json.RawMessage(s), "/action", []string{"a"}); !errors.Is(err, ErrNoAllowedActions) {
		t.Fatalf("allOf with one branch emptied: %v, want ErrNoAllowedActions", err)
	}
	out, err := FilterActionEnum(json.RawMessage(s), "/action", []string{"b"})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := ActionEnum(out, "/action"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("allOf narrowed to %q", got)
	}
}

// TestExponentialSchemaGivesUp: $refs that branch into themselves would
// take 2^64 visits; the walk stops after a bounded number instead.
func TestExponentialSchemaGivesUp(t *testing.T) {
	s := `{"$defs":{"A":{"allOf":[{"$ref":"#/$defs/A"},{"$ref":"#/$defs/A"}],"oneOf":[{"$ref":"#/$defs/A"},{"$ref":"#/$defs/A"}]}},
		"properties":{"action":{"$ref":"#/$defs/A"}},"allOf":[{"$ref":"#/$defs/A"},{"$ref":"#/$defs/A"}]}`
	if got, ok := ActionEnum(json.RawMessage(s), "/action"); ok {
		t.Fatalf("ActionEnum = %q", got)
	}
	if _, err := FilterActionEnum(json.RawMessage(s), "/action", []string{"a"}); !errors.Is(err, ErrNoActionEnum) {
		t.Fatalf("FilterActionEnum: %v, want ErrNoActionEnum", err)
	}
}

func FuzzFilterActionEnum(f *testing.F) {
	for _, s := range []string{flatEnum, union, refEnum, cyclic, anyOfMixed} {
		f.Add(s, "/action", "list")
	}
	f.Fuzz(func(t *testing.T, schema, pointer, allowed string) {
		out, err := FilterActionEnum(json.RawMessage(schema), pointer, []string{allowed})
		if err != nil {
			return
		}
		got, ok := ActionEnum(out, pointer)
		if !ok {
			t.Fatalf("filtered schema has no actions left: %s", out)
		}
		for _, g := range got {
			if g != allowed {
				t.Fatalf("action %q survived filtering to %q: %s", g, allowed, out)
			}
		}
	})
}

func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m = m[k].(map[string]any)
	}
	return m
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
