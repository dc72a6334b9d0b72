package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// toolCallSchemaDoc is the embedded tool call schema as the library
// decodes it.
func toolCallSchemaDoc(t testing.TB) map[string]any {
	t.Helper()
	cs, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	return cs.docs[FileToolCallSchema].(map[string]any)
}

// TestQuickSchemaKnowsToolCallSchema fails when the tool call schema file
// uses anything the quick check does not understand (a new keyword, a
// reference to another file, a new format, a numeric enum): every
// envelope would then go to the library, and this test says why.
func TestQuickSchemaKnowsToolCallSchema(t *testing.T) {
	cs, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	if cs.toolCallQuickErr != nil || cs.toolCallQuick == nil {
		t.Fatalf("the quick check does not know %s: %v", FileToolCallSchema, cs.toolCallQuickErr)
	}
	// Every pattern has a hand-written matcher (a pattern without one
	// would still be exact, through regexp, but slow).
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if p, ok := v["pattern"].(string); ok && quickPatterns[p] == nil {
				t.Errorf("pattern %q has no matcher in quickPatterns", p)
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(toolCallSchemaDoc(t))
}

// deepCopy copies a decoded JSON tree.
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = deepCopy(x)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, x := range v {
			a[i] = deepCopy(x)
		}
		return a
	}
	return v
}

// TestQuickSchemaRefusesWhatItDoesNotKnow: a keyword, format, reference or
// value the quick check cannot evaluate makes compilation fail, wherever
// it sits in the schema.
func TestQuickSchemaRefusesWhatItDoesNotKnow(t *testing.T) {
	cases := map[string]map[string]any{
		"minimum":                  {"minimum": json.Number("1")},
		"allOf":                    {"allOf": []any{map[string]any{}}},
		"anyOf":                    {"anyOf": []any{map[string]any{}}},
		"oneOf":                    {"oneOf": []any{map[string]any{}}},
		"not":                      {"not": map[string]any{}},
		"patternProperties":        {"patternProperties": map[string]any{}},
		"propertyNames":            {"propertyNames": map[string]any{}},
		"dependentRequired":        {"dependentRequired": map[string]any{}},
		"prefixItems":              {"prefixItems": []any{}},
		"contains":                 {"contains": map[string]any{}},
		"uniqueItems":              {"uniqueItems": true},
		"minItems":                 {"minItems": json.Number("1")},
		"minProperties":            {"minProperties": json.Number("1")},
		"$dynamicRef":              {"$dynamicRef": "#x"},
		"$anchor":                  {"$anchor": "x"},
		"contentEncoding":          {"contentEncoding": "base64"},
		"misspelt keyword":         {"requried": []any{"a"}},
		"format email":             {"format": "email"},
		"format uuid":              {"format": "uuid"},
		"ref to another file":      {"$ref": "capability.schema.json#/$defs/capability"},
		"ref that does not exist":  {"$ref": "#/$defs/nothing"},
		"numeric enum":             {"enum": []any{json.Number("1")}},
		"object const":             {"const": map[string]any{}},
		"unevaluatedProperties {}": {"unevaluatedProperties": map[string]any{}},
		"items array":              {"items": []any{map[string]any{}}},
		"bad regexp":               {"pattern": "("},
		"negative maxLength":       {"maxLength": json.Number("-1")},
		"unknown type":             {"type": "int"},
	}
	for name, extra := range cases {
		t.Run(name, func(t *testing.T) {
			// Deep inside the real schema: in a property of a property.
			doc := deepCopy(toolCallSchemaDoc(t)).(map[string]any)
			actor := doc["properties"].(map[string]any)["actor"].(map[string]any)
			kind := actor["properties"].(map[string]any)["kind"].(map[string]any)
			for k, v := range extra {
				kind[k] = v
			}
			if _, err := compileQuickSchema(doc); err == nil {
				t.Fatal("compiled a schema the quick check cannot evaluate")
			}
			if _, err := compileQuickSchema(map[string]any{"$defs": map[string]any{"x": extra}}); err == nil {
				t.Fatal("compiled an unknown keyword under $defs")
			}
		})
	}
	if _, err := compileQuickSchema(deepCopy(toolCallSchemaDoc(t))); err != nil {
		t.Fatalf("the unmodified copy does not compile: %v", err)
	}
}

// compileLibrary compiles a schema document with the library, as
// compileSchemas does.
func compileLibrary(t testing.TB, doc any) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	const url = "https://schemas.talos.dev/test.schema.json"
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// decodeDoc decodes JSON the way the library and the parser see it.
func decodeDoc(t testing.TB, s string) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestQuickSchemaSemantics: small schemas whose keywords combine in ways
// the envelope schema does not use yet, each against instances with known
// library verdicts; the quick answer must be sound and, where listed,
// exact.
func TestQuickSchemaSemantics(t *testing.T) {
	cases := []struct {
		schema, instance string
		want             quickResult
	}{
		{`{"type":"integer"}`, `1`, quickValid},
		{`{"type":"integer"}`, `-0`, quickValid},
		{`{"type":"integer"}`, `1.0`, quickUnknown},
		{`{"type":"integer"}`, `1.5`, quickUnknown},
		{`{"type":"integer"}`, `"1"`, quickInvalid},
		{`{"type":"number"}`, `1e400`, quickValid},
		{`{"type":["null","boolean"]}`, `null`, quickValid},
		{`{"type":["null","boolean"]}`, `0`, quickInvalid},
		{`{"const":null}`, `null`, quickValid},
		{`{"const":null}`, `false`, quickInvalid},
		{`{"enum":["a",true]}`, `true`, quickValid},
		{`{"enum":["a",true]}`, `["a"]`, quickInvalid},
		{`{"enum":["a",true]}`, `{"a":1}`, quickInvalid},
		{`{"minLength":2,"maxLength":2}`, `"éé"`, quickValid},
		{`{"minLength":2,"maxLength":2}`, `"é"`, quickInvalid},
		{`{"minLength":2}`, `1`, quickValid},
		{`{"pattern":"^a+$"}`, `"aa"`, quickValid},
		{`{"pattern":"^a+$"}`, `"ab"`, quickInvalid},
		{`{"pattern":"b"}`, `"abc"`, quickValid},
		{`{"format":"date-time"}`, `"2016-12-31T23:59:60Z"`, quickUnknown},
		{`{"format":"date-time"}`, `5`, quickValid},
		{`{"required":["a"]}`, `{"a":1}`, quickValid},
		{`{"required":["a"]}`, `{}`, quickInvalid},
		{`{"required":["a"]}`, `[]`, quickValid},
		{`{"properties":{"a":{"type":"string"}},"required":["a","b"]}`, `{"a":"x"}`, quickInvalid},
		{`{"properties":{"a":{"type":"string"}},"required":["a","b"]}`, `{"a":"x","b":1}`, quickValid},
		{`{"properties":{"a":false}}`, `{"b":1}`, quickValid},
		{`{"properties":{"a":false}}`, `{"a":1}`, quickInvalid},
		{`{"properties":{"a":true},"additionalProperties":false}`, `{"a":1,"b":1}`, quickInvalid},
		{`{"properties":{"a":true},"additionalProperties":{"type":"string"}}`, `{"a":1,"b":"x"}`, quickValid},
		{`{"properties":{"a":true},"additionalProperties":{"type":"string"}}`, `{"a":1,"b":2}`, quickInvalid},
		{`{"additionalProperties":{"type":"string"}}`, `{"a":"x"}`, quickValid},
		{`{"properties":{"a":true},"unevaluatedProperties":false}`, `{"a":1}`, quickValid},
		{`{"properties":{"a":true},"unevaluatedProperties":false}`, `{"a":1,"b":1}`, quickUnknown},
		{`{"unevaluatedProperties":false,"if":{"properties":{"b":true}},"then":true}`, `{"b":1}`, quickUnknown},
		{`{"items":{"type":"string"}}`, `["a","b"]`, quickValid},
		{`{"items":{"type":"string"}}`, `["a",1]`, quickInvalid},
		{`{"items":{"format":"date-time"}}`, `["x"]`, quickUnknown},
		{`{"if":{"required":["a"]},"then":{"required":["b"]},"else":{"required":["c"]}}`, `{"a":1,"b":1}`, quickValid},
		{`{"if":{"required":["a"]},"then":{"required":["b"]},"else":{"required":["c"]}}`, `{"a":1}`, quickInvalid},
		{`{"if":{"required":["a"]},"then":{"required":["b"]},"else":{"required":["c"]}}`, `{"c":1}`, quickValid},
		{`{"if":{"required":["a"]},"then":{"required":["b"]},"else":{"required":["c"]}}`, `{}`, quickInvalid},
		{`{"if":{"format":"date-time"},"then":false}`, `"2016-12-31T23:59:60Z"`, quickUnknown},
		{`{"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":1}`, `"ab"`, quickInvalid},
		{`{"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":1}`, `1`, quickInvalid},
		{`{"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":1}`, `"a"`, quickValid},
		{`{"$defs":{"n":{"properties":{"c":{"$ref":"#/$defs/n"}},"additionalProperties":false}},"$ref":"#/$defs/n"}`, `{"c":{"c":{}}}`, quickValid},
		{`{"$defs":{"n":{"properties":{"c":{"$ref":"#/$defs/n"}},"additionalProperties":false}},"$ref":"#/$defs/n"}`, `{"c":{"c":{"d":1}}}`, quickInvalid},
		{`{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, `1`, quickUnknown},
		{`false`, `1`, quickInvalid},
		{`true`, `1`, quickValid},
	}
	for _, tc := range cases {
		t.Run(tc.schema+" "+tc.instance, func(t *testing.T) {
			doc := decodeDoc(t, tc.schema)
			q, err := compileQuickSchema(doc)
			if err != nil {
				t.Fatal(err)
			}
			inst := decodeDoc(t, tc.instance)
			got := q.check(inst)
			if got != tc.want {
				t.Fatalf("quick check %d, want %d", got, tc.want)
			}
			if strings.Contains(tc.schema, `"#/$defs/a"`) {
				return // a $ref cycle: the library has no verdict to compare
			}
			libErr := compileLibrary(t, doc).Validate(inst)
			if (got == quickValid && libErr != nil) || (got == quickInvalid && libErr == nil) {
				t.Fatalf("quick check %d contradicts the library (%v)", got, libErr)
			}
		})
	}
}

// schemaProp is one place in the envelope the schema describes: an
// instance path ("*" for every array element) and the schema node there.
type schemaProp struct {
	path []string
	node map[string]any
}

// schemaProps walks the tool call schema through properties, items,
// $ref and the conditional keywords, so that a property the schema file
// gains is mutated without this test changing.
func schemaProps(t testing.TB, root map[string]any) []schemaProp {
	t.Helper()
	var out []schemaProp
	seen := map[string]bool{}
	var walk func(node map[string]any, path []string, depth int)
	walk = func(node map[string]any, path []string, depth int) {
		if depth > 12 {
			return
		}
		if ref, ok := node["$ref"].(string); ok {
			target, found := jsonkit.ResolvePointer(root, strings.TrimPrefix(ref, "#"))
			if !found {
				t.Fatalf("unresolved $ref %s", ref)
			}
			if m, ok := target.(map[string]any); ok {
				walk(m, path, depth+1)
			}
		}
		if props, ok := node["properties"].(map[string]any); ok {
			for name, sub := range props {
				p := append(slices.Clone(path), name)
				if m, ok := sub.(map[string]any); ok {
					key := strings.Join(p, "/")
					if !seen[key] {
						seen[key] = true
						out = append(out, schemaProp{path: p, node: m})
					}
					walk(m, p, depth+1)
				}
			}
		}
		if items, ok := node["items"].(map[string]any); ok {
			walk(items, append(slices.Clone(path), "*"), depth+1)
		}
		for _, kw := range []string{"if", "then", "else"} {
			if m, ok := node[kw].(map[string]any); ok {
				walk(m, path, depth+1)
			}
		}
	}
	walk(root, nil, 0)
	return out
}

// setPath sets (or, with del, deletes) the value at path in doc, if the
// path's parent exists; "*" is the first array element.
func setPath(doc any, path []string, v any, del bool) bool {
	cur := doc
	for i, tok := range path {
		last := i == len(path)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				if del {
					delete(c, tok)
				} else {
					c[tok] = v
				}
				return true
			}
			next, ok := c[tok]
			if !ok {
				return false
			}
			cur = next
		case []any:
			if tok != "*" || len(c) == 0 {
				return false
			}
			if last {
				if del {
					return false
				}
				c[0] = v
				return true
			}
			cur = c[0]
		default:
			return false
		}
	}
	return false
}

// interestingStrings are values near every pattern, length bound, enum
// and format of the envelope schema.
func interestingStrings() []string {
	s := []string{
		"", "a", "A", " ", "é", "\n", "pre", "post", "Pre", "pre ", "read", "write", "mcp", "local", "mex", "stage_bridge", "other",
		"human", "agent", "system", "sha256", "SHA256", "talos.tool_call.v1", "talos.tool_call.v2",
		"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", "0190F5B2-7C1E-7A3B-8D4E-1F2A3B4C5D6E", "0190f5b27c1e7a3b8d4e1f2a3b4c5d6e",
		"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6", "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e\n", "g190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e",
		"gw-1", "files", "a_b", "-a", "_a", "Files", "a.b", strings.Repeat("a", 64), strings.Repeat("a", 65),
		"q3V2bH7pR9sT1uW4xY6zAb", "q3V2bH7pR9sT1uW4xY6zA", "q3V2bH7pR9sT1uW4xY6zA=", "q3V2bH7pR9sT1uW4xY6z+b",
		strings.Repeat("A", 256), strings.Repeat("A", 257), strings.Repeat("é", 128), strings.Repeat("é", 129),
		strings.Repeat("é", 256), strings.Repeat("é", 257), strings.Repeat("x", 128), strings.Repeat("x", 129),
		strings.Repeat("ab", 32), strings.Repeat("AB", 32), strings.Repeat("ab", 32) + "a", strings.Repeat("a", 63),
		"sha256:" + strings.Repeat("ab", 32), "sha256:" + strings.Repeat("AB", 32), "SHA256:" + strings.Repeat("ab", 32),
		"sha256:" + strings.Repeat("ab", 31),
		"/", "/content", "/a/b", "/a~0b", "/a~1b", "/a~2b", "/a~", "~0", "content", "//", "/é",
	}
	s = append(s, dateTimeSamples()...)
	return s
}

// dateTimeSamples straddle every rule of the date-time format.
func dateTimeSamples() []string {
	return []string{
		"2025-01-15T10:20:30.123Z", "2025-01-15T10:20:30Z", "2025-01-15t10:20:30z", "2025-01-15T10:20:30+01:00",
		"2025-01-15T10:20:30-23:59", "2025-01-15T10:20:30+24:00", "2025-01-15T10:20:30+01:60", "2025-01-15T10:20:30+0100",
		"2025-01-15T10:20:30.Z", "2025-01-15T10:20:30.123456789Z", "2025-01-15 10:20:30Z", "2025-01-15T10:20:30",
		"2025-01-15T24:00:00Z", "2025-01-15T23:60:00Z", "2025-01-15T23:59:60Z", "2016-12-31T23:59:60Z",
		"2017-01-01T00:59:60+01:00", "2016-12-31T18:59:60-05:00", "2025-02-29T00:00:00Z", "2024-02-29T00:00:00Z",
		"2000-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2025-04-31T00:00:00Z", "2025-12-31T00:00:00Z", "2025-13-01T00:00:00Z",
		"2025-00-01T00:00:00Z", "2025-01-00T00:00:00Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "+2025-01-15T10:20:30Z",
		"2025-1-15T10:20:30Z", "2025-01-15T1:20:30Z", "2025-01-15T10:20:30ZZ", "2025-01-15T10:20:30+1:00", "2025-01-15T+1:20:30Z",
		"2025-01-15T10:20:-1Z", "2025-01-15T10:20:30.1+01:00", "2025-01-15T10:20:30.1x", "２０２５-01-15T10:20:30Z",
	}
}

// interestingValues are the non-string values tried at every property.
func interestingValues() []any {
	return []any{nil, true, false, json.Number("0"), json.Number("1"), json.Number("-1"), json.Number("1.5"),
		json.Number("1e3"), map[string]any{}, []any{}, []any{map[string]any{}}, map[string]any{"x": json.Number("1")}}
}

// baseDocs are valid envelopes, as decoded trees, that exercise every
// optional member.
func baseDocs(t testing.TB) map[string]map[string]any {
	t.Helper()
	cases := parseCases(t)
	out := map[string]map[string]any{}
	for _, name := range []string{"minimal", "all optional pre fields", "full post struct", "testdata envelope"} {
		doc, _, ok := decodeObjectTree(cases[name], DefaultMaxDepth)
		if !ok {
			t.Fatalf("%s does not decode", name)
		}
		out[name] = doc
	}
	return out
}

// TestQuickSchemaAgreesWithLibrary mutates valid envelopes at every place
// the schema describes — each interesting value, deletion, an unknown
// member in every object — and holds the quick check to the library's
// verdict on each result.
func TestQuickSchemaAgreesWithLibrary(t *testing.T) {
	root := toolCallSchemaDoc(t)
	props := schemaProps(t, root)
	if len(props) < 30 {
		t.Fatalf("schema walk found only %d places", len(props))
	}
	var values []any
	for _, s := range interestingStrings() {
		values = append(values, s)
	}
	values = append(values, interestingValues()...)
	counts := map[quickResult]int{}
	try := func(doc map[string]any) {
		counts[checkQuickSound(t, doc)]++
	}
	for name, base := range baseDocs(t) {
		if checkQuickSound(t, base) != quickValid {
			t.Fatalf("%s: not quick-valid", name)
		}
		for _, p := range props {
			doc := deepCopy(base).(map[string]any)
			if setPath(doc, p.path, nil, true) {
				try(doc)
			}
			for _, v := range values {
				doc := deepCopy(base).(map[string]any)
				if setPath(doc, p.path, v, false) {
					try(doc)
				}
			}
			doc = deepCopy(base).(map[string]any)
			if setPath(doc, append(slices.Clone(p.path), "x_unknown"), json.Number("1"), false) {
				try(doc)
			}
		}
		doc := deepCopy(base).(map[string]any)
		doc["x_unknown"] = "x"
		try(doc)
		for _, phase := range []string{"pre", "post"} {
			doc := deepCopy(base).(map[string]any)
			doc["phase"] = phase
			try(doc)
		}
	}
	t.Logf("valid %d, invalid %d, unknown %d", counts[quickValid], counts[quickInvalid], counts[quickUnknown])
	if counts[quickValid] < 100 || counts[quickInvalid] < 100 {
		t.Fatalf("mutations no longer exercise both verdicts: %v", counts)
	}
}

// patternProbes are strings near each hand-matched pattern: every valid
// example with each byte replaced by each probe character, plus random
// strings of the lengths the patterns bound.
func patternProbes() []string {
	examples := []string{
		"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", "4BF92F35-77B3-4DA6-A3CE-929D0E0E4736", "gw-1", "a", strings.Repeat("z9_-", 16),
		"q3V2bH7pR9sT1uW4xY6zAb", strings.Repeat("A_-9", 64), strings.Repeat("0f", 32), "sha256:" + strings.Repeat("0f", 32),
		"", "/", "/a~0/b~1c/", "/content/0/text",
	}
	const probe = "0aAfFgG9zZ-_/~:.+ \né\x00"
	var out []string
	for _, ex := range examples {
		out = append(out, ex, ex+"x", "x"+ex, ex+"\n", strings.ToUpper(ex))
		if len(ex) > 0 {
			out = append(out, ex[1:], ex[:len(ex)-1])
		}
		for i := 0; i < len(ex); i++ {
			for _, r := range probe {
				out = append(out, ex[:i]+string(r)+ex[i+1:])
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 8, 21, 22, 23, 36, 63, 64, 65, 71, 72, 256, 257} {
		for range 50 {
			var sb strings.Builder
			for range n {
				sb.WriteRune([]rune(probe)[rng.IntN(len([]rune(probe)))])
			}
			out = append(out, sb.String())
		}
	}
	return out
}

// TestQuickPatternsMatchRegexp: each hand-written matcher answers exactly
// what Go's regexp (the library's engine) answers for its pattern.
func TestQuickPatternsMatchRegexp(t *testing.T) {
	probes := patternProbes()
	for pattern, match := range quickPatterns {
		re := regexp.MustCompile(pattern)
		matched := 0
		for _, s := range probes {
			if got, want := match(s), re.MatchString(s); got != want {
				t.Errorf("%s on %q: matcher %v, regexp %v", pattern, s, got, want)
			}
			if re.MatchString(s) {
				matched++
			}
		}
		if matched == 0 {
			t.Errorf("%s: no probe matches; the probes do not exercise it", pattern)
		}
	}
}

func FuzzQuickPatterns(f *testing.F) {
	for _, s := range patternProbes()[:200] {
		f.Add(s)
	}
	res := map[string]*regexp.Regexp{}
	for p := range quickPatterns {
		res[p] = regexp.MustCompile(p)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for p, match := range quickPatterns {
			if got, want := match(s), res[p].MatchString(s); got != want {
				t.Fatalf("%s on %q: matcher %v, regexp %v", p, s, got, want)
			}
		}
	})
}

// dateTimeSchema is the library's date-time format, asserted.
func dateTimeSchema(t testing.TB) *jsonschema.Schema {
	return compileLibrary(t, decodeDoc(t, `{"format":"date-time"}`))
}

// TestQuickDateTimeSound: isPlainDateTime accepts only what the library's
// date-time format accepts, and accepts the timestamps Talos writes.
func TestQuickDateTimeSound(t *testing.T) {
	lib := dateTimeSchema(t)
	samples := dateTimeSamples()
	// Every day of a leap and a common year, at the edges of the clock.
	for _, y := range []int{1900, 2000, 2023, 2024} {
		for m := 0; m <= 13; m++ {
			for d := 0; d <= 32; d++ {
				samples = append(samples, fmt.Sprintf("%04d-%02d-%02dT23:59:59.5-00:00", y, m, d))
			}
		}
	}
	accepted := 0
	for _, s := range samples {
		fast := isPlainDateTime(s)
		libOK := lib.Validate(s) == nil
		if fast && !libOK {
			t.Errorf("%q: quick check accepts, library rejects", s)
		}
		if fast {
			accepted++
		}
	}
	if accepted < 700 {
		t.Fatalf("quick date-time accepted only %d samples", accepted)
	}
	for _, s := range []string{"2025-01-15T10:20:30.123Z", "2025-01-15T10:20:30.123+05:30", "2024-02-29T00:00:00Z"} {
		if !isPlainDateTime(s) {
			t.Errorf("%q: a usual timestamp is left to the library", s)
		}
	}
}

func FuzzQuickDateTime(f *testing.F) {
	for _, s := range dateTimeSamples() {
		f.Add(s)
	}
	lib := dateTimeSchema(f)
	f.Fuzz(func(t *testing.T, s string) {
		if isPlainDateTime(s) && lib.Validate(s) != nil {
			t.Fatalf("%q: quick check accepts, library rejects", s)
		}
	})
}

// FuzzQuickSchema feeds arbitrary JSON objects to the quick check and the
// library; the quick check must never contradict the library.
func FuzzQuickSchema(f *testing.F) {
	for _, doc := range baseDocs(f) {
		f.Add(mustJSON(f, doc))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return
		}
		checkQuickSound(t, v)
	})
}
