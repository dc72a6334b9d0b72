package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

// pfSecret is planted in arguments; no detail may contain it.
const pfSecret = "SECRET-VALUE-7f3a"

// preflightTool is a registry tool entry for server "fs" with the given
// extra members (input_schema, path_pointers, ...).
func preflightTool(name, extra string) string {
	t := fmt.Sprintf(`{"tool_name":%q,"tool_class":"read","is_document_op":false`, name)
	if extra != "" {
		t += "," + extra
	}
	return t + "}"
}

func preflightRegistry(t *testing.T, tools ...string) *Registry {
	t.Helper()
	m := `{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"fs","tools":[` + strings.Join(tools, ",") + `]}`
	reg, err := NewRegistry([]byte(m))
	if err != nil {
		t.Fatalf("registry: %v", err)
	}
	return reg
}

func newTestPreflight(t *testing.T, cfg PreflightConfig, tools ...string) (*Preflight, *Registry) {
	t.Helper()
	reg := preflightRegistry(t, tools...)
	p, err := NewPreflight(reg, cfg)
	if err != nil {
		t.Fatalf("NewPreflight: %v", err)
	}
	return p, reg
}

// pfParseArgs parses JSON as the envelope parser does (numbers json.Number).
func pfParseArgs(t *testing.T, s string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("args %s: %v", s, err)
	}
	return v
}

// pfCheck checks args (JSON) against tool name of reg, with argsLen the
// length of the JSON text.
func pfCheck(t *testing.T, p *Preflight, reg *Registry, name, args string) (codes, details []string) {
	t.Helper()
	tool, ok := reg.Lookup("fs", name)
	if !ok {
		t.Fatalf("no tool %s", name)
	}
	codes, details = p.Check("fs", tool, pfParseArgs(t, args), len(args), "")
	for _, d := range details {
		if strings.Contains(d, pfSecret) {
			t.Fatalf("detail %q echoes an argument value", d)
		}
	}
	return codes, details
}

func pfWantCodes(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(want) == 0 && len(got) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("codes = %v, want %v", got, want)
	}
}

func pfWantDetail(t *testing.T, details []string, want string) {
	t.Helper()
	for _, d := range details {
		if d == want {
			return
		}
	}
	t.Fatalf("details %q lack %q", details, want)
}

const fileSchema = `"input_schema":{
	"type":"object",
	"required":["path"],
	"properties":{
		"path":{"type":"string"},
		"mode":{"enum":["r","w"]},
		"count":{"type":"integer","minimum":0},
		"options":{"type":"object","properties":{"recursive":{"type":"boolean"}}},
		"files":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}},
		"headers":{"type":"object","additionalProperties":{"type":"string"}},
		"meta":{"type":"object","properties":{"a":{}},"additionalProperties":true},
		"ext":{"type":"object","properties":{"a":{}},"patternProperties":{"^x-":{"type":"string"}}},
		"free":{"type":"object"}
	}}`

func TestPreflightUnknownFields(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{}, preflightTool("read_file", fileSchema))
	cases := []struct {
		name, args string
		detail     string // "" means allowed
	}{
		{"known only", `{"path":"a.txt","mode":"r","count":1}`, ""},
		{"top level", `{"path":"a.txt","` + pfSecret + `":1}`, "input_schema: /*: unknown field"},
		{"nested object", `{"path":"a","options":{"recursive":true,"` + pfSecret + `":"x"}}`, "input_schema: /options/*: unknown field"},
		{"nested array item", `{"path":"a","files":[{"name":"x"},{"name":"y","evil":1}]}`, "input_schema: /files/1/*: unknown field"},
		{"additionalProperties schema allows extras", `{"path":"a","headers":{"X-Any":"v"}}`, ""},
		{"additionalProperties true allows extras", `{"path":"a","meta":{"a":1,"b":2}}`, ""},
		{"patternProperties match", `{"path":"a","ext":{"x-trace":"1"}}`, ""},
		{"patternProperties miss", `{"path":"a","ext":{"y-trace":"1"}}`, "input_schema: /ext/*: unknown field"},
		{"object without properties is open", `{"path":"a","free":{"anything":{"deep":1}}}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			codes, details := pfCheck(t, p, reg, "read_file", tc.args)
			if tc.detail == "" {
				pfWantCodes(t, codes)
				return
			}
			pfWantCodes(t, codes, schemas.CodeDenyUnknownFields)
			pfWantDetail(t, details, tc.detail)
		})
	}
}

func TestPreflightUnknownFieldsComposition(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{},
		preflightTool("allof", `"input_schema":{"allOf":[{"properties":{"a":{}}},{"properties":{"b":{}}}]}`),
		preflightTool("anyof", `"input_schema":{"properties":{"kind":{}},"anyOf":[{"properties":{"x":{}}},{"properties":{"y":{}}}]}`),
		preflightTool("ref", `"input_schema":{"$ref":"#/$defs/args","$defs":{"args":{"type":"object","properties":{"q":{"$ref":"#/$defs/q"}}},"q":{"type":"object","properties":{"text":{"type":"string"}}}}}`),
		preflightTool("tree", `"input_schema":{"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}}}`),
		preflightTool("strict", `"input_schema":{"type":"object","additionalProperties":false}`),
		preflightTool("uneval", `"input_schema":{"type":"object","allOf":[{"properties":{"a":{}}}],"unevaluatedProperties":false}`),
		preflightTool("prefix", `"input_schema":{"type":"array","prefixItems":[{"type":"object","properties":{"a":{}}}],"items":{"type":"object","properties":{"b":{}}}}`),
		preflightTool("anchor", `"input_schema":{"$ref":"#args","$defs":{"a":{"$anchor":"args","type":"object","properties":{"k":{}}}}}`),
		// An embedded resource's references are not followed: its object
		// is open to the unknown-field walk (the validator still applies).
		preflightTool("embedded", `"input_schema":{"type":"object","properties":{"sub":{"$id":"https://example.test/sub.json","$ref":"#/$defs/s","$defs":{"s":{"type":"object","properties":{"k":{"type":"integer"}}}}}}}`),
	)
	cases := []struct {
		tool, args string
		detail     string
	}{
		{"allof", `{"a":1,"b":2}`, ""},
		{"allof", `{"a":1,"b":2,"c":3}`, "input_schema: /*: unknown field"},
		{"anyof", `{"kind":1,"y":2}`, ""},
		{"anyof", `{"kind":1,"z":2}`, "input_schema: /*: unknown field"},
		{"ref", `{"q":{"text":"hi"}}`, ""},
		{"ref", `{"q":{"text":"hi","more":1}}`, "input_schema: /q/*: unknown field"},
		{"tree", `{"name":"r","children":[{"name":"c","children":[{"name":"g"}]}]}`, ""},
		{"tree", `{"name":"r","children":[{"name":"c","children":[{"name":"g","bad":1}]}]}`, "input_schema: /children/0/children/0/*: unknown field"},
		{"strict", `{}`, ""},
		{"strict", `{"` + pfSecret + `":1}`, "input_schema: /*: unknown field"},
		{"uneval", `{"a":1}`, ""},
		{"uneval", `{"a":1,"b":2}`, "input_schema: /*: unknown field"},
		{"prefix", `[{"a":1},{"b":2},{"b":3}]`, ""},
		{"prefix", `[{"b":1}]`, "input_schema: /0/*: unknown field"},
		{"prefix", `[{"a":1},{"a":2}]`, "input_schema: /1/*: unknown field"},
		{"anchor", `{"k":1}`, ""},
		{"anchor", `{"k":1,"z":1}`, "input_schema: /*: unknown field"},
		{"embedded", `{"sub":{"k":1,"z":2}}`, ""},
		{"embedded", `{"sub":{"k":1},"top":1}`, "input_schema: /*: unknown field"},
	}
	for _, tc := range cases {
		t.Run(tc.tool+" "+tc.args, func(t *testing.T) {
			codes, details := pfCheck(t, p, reg, tc.tool, tc.args)
			if tc.detail == "" {
				pfWantCodes(t, codes)
				return
			}
			pfWantCodes(t, codes, schemas.CodeDenyUnknownFields)
			pfWantDetail(t, details, tc.detail)
		})
	}
}

func TestPreflightSchemaViolation(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{}, preflightTool("read_file", fileSchema))
	cases := []struct{ name, args, detail string }{
		{"type", `{"path":5}`, "input_schema: /path: type: want string"},
		{"required", `{"mode":"r"}`, "input_schema: /: required: missing path"},
		{"enum", `{"path":"a","mode":"` + pfSecret + `"}`, "input_schema: /mode: enum"},
		{"minimum", `{"path":"a","count":-1}`, "input_schema: /count: minimum"},
		{"nested type", `{"path":"a","options":{"recursive":"` + pfSecret + `"}}`, "input_schema: /options/recursive: type: want boolean"},
		{"additionalProperties schema", `{"path":"a","headers":{"` + pfSecret + `":1}}`, "input_schema: /headers/*: type: want string"},
		{"not an object", `[1,2]`, "input_schema: /: type: want object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			codes, details := pfCheck(t, p, reg, "read_file", tc.args)
			pfWantCodes(t, codes, schemas.CodeDenySchemaViolation)
			pfWantDetail(t, details, tc.detail)
		})
	}
}

func TestPreflightPayloadTooLarge(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{MaxArgsBytes: 100},
		preflightTool("small", `"max_args_bytes":10`),
		preflightTool("dflt", ""),
	)
	small, _ := reg.Lookup("fs", "small")
	dflt, _ := reg.Lookup("fs", "dflt")
	args := map[string]any{}
	pfWantCodes(t, pfCodesOf(p.Check("fs", small, args, 10, "")))
	codes, details := p.Check("fs", small, args, 11, "")
	pfWantCodes(t, codes, schemas.CodeDenyPayloadTooLarge)
	pfWantDetail(t, details, "arguments: 11 bytes exceed max_args_bytes 10")
	pfWantCodes(t, pfCodesOf(p.Check("fs", dflt, args, 100, "")))
	pfWantCodes(t, pfCodesOf(p.Check("fs", dflt, args, 101, "")), schemas.CodeDenyPayloadTooLarge)

	// The zero config means 1 MiB.
	p0, _ := newTestPreflight(t, PreflightConfig{}, preflightTool("dflt", ""))
	pfWantCodes(t, pfCodesOf(p0.Check("fs", dflt, args, int(DefaultMaxArgsBytes), "")))
	pfWantCodes(t, pfCodesOf(p0.Check("fs", dflt, args, int(DefaultMaxArgsBytes)+1, "")), schemas.CodeDenyPayloadTooLarge)

	if _, err := NewPreflight(reg, PreflightConfig{MaxArgsBytes: -1}); err == nil {
		t.Fatal("negative MaxArgsBytes accepted")
	}
}

func pfCodesOf(codes, _ []string) []string { return codes }

func TestPreflightPathTraversal(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{},
		preflightTool("copy", `"path_pointers":["/src","/dst","/more","/opts/target"],"workspace_root":"/work/root"`),
		preflightTool("copy_schema", `"path_pointers":["/src"],"workspace_root":"/work/root","input_schema":{"type":"object","properties":{"src":{"type":"string"}}}`),
	)
	cases := []struct {
		name, tool, args string
		detail           string
	}{
		{"inside", "copy", `{"src":"a.txt","dst":"/work/root/b.txt"}`, ""},
		{"absent pointers", "copy", `{}`, ""},
		{"null is absent", "copy", `{"src":null}`, ""},
		{"parent", "copy", `{"src":"../etc/passwd"}`, "path_pointers /src: parent directory segment"},
		{"absolute outside", "copy", `{"src":"a","dst":"/etc/shadow"}`, "path_pointers /dst: outside the workspace root"},
		{"encoded", "copy", `{"src":"%2e%2e%2fetc"}`, "path_pointers /src: percent-encoded dot or slash"},
		{"nested pointer", "copy", `{"opts":{"target":"~/.ssh"}}`, "path_pointers /opts/target: home directory expansion"},
		{"array element", "copy", `{"more":["a","b","/proc/self/root"]}`, "path_pointers /more: outside the workspace root"},
		{"array fine", "copy", `{"more":["a","b/c"]}`, ""},
		{"not a string", "copy", `{"src":{"path":"a"}}`, "path_pointers /src: not a string"},
		{"with schema", "copy_schema", `{"src":"../../` + pfSecret + `"}`, "path_pointers /src: parent directory segment"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			codes, details := pfCheck(t, p, reg, tc.tool, tc.args)
			if tc.detail == "" {
				pfWantCodes(t, codes)
				return
			}
			pfWantCodes(t, codes, schemas.CodeDenyPathTraversal)
			pfWantDetail(t, details, tc.detail)
		})
	}
}

// TestPreflightWorkspaceFromEnforcementPoint (CSP MUST 7, VAL-03): a tool
// whose workspace_root defers to the enforcement point is checked against
// the root the envelope carries; without one every call is denied (fail
// closed); an explicit registry root is checked as it is, and an envelope
// root that differs from it is denied.
func TestPreflightWorkspaceFromEnforcementPoint(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{},
		preflightTool("ep", `"path_pointers":["/path","/paths"],"workspace_root":"enforcement_point"`),
		preflightTool("fixed", `"path_pointers":["/path"],"workspace_root":"/srv/fixed"`),
		preflightTool("nopaths", ``),
	)
	cases := []struct {
		name, tool, args, epRoot string
		detail                   string
	}{
		{"inside the enforcement point's root", "ep", `{"path":"/srv/ws/a.txt","paths":["b","/srv/ws/c"]}`, "/srv/ws", ""},
		{"relative inside", "ep", `{"path":"notes/a.txt"}`, "/srv/ws/", ""},
		{"absolute outside", "ep", `{"path":"/srv/other/a.txt"}`, "/srv/ws", "path_pointers /path: outside the workspace root"},
		{"prefix trick", "ep", `{"path":"/srv/ws2/a.txt"}`, "/srv/ws", "path_pointers /path: outside the workspace root"},
		{"parent", "ep", `{"path":"../a.txt"}`, "/srv/ws", "path_pointers /path: parent directory segment"},
		{"encoded", "ep", `{"path":"%2e%2e/a.txt"}`, "/srv/ws", "path_pointers /path: percent-encoded dot or slash"},
		{"array element outside", "ep", `{"paths":["a","/etc/passwd"]}`, "/srv/ws", "path_pointers /paths: outside the workspace root"},
		{"no root from the enforcement point", "ep", `{"path":"a.txt"}`, "", "workspace_root: the registry defers to the enforcement point, which sent none"},
		{"no root, no path", "ep", `{}`, "", "workspace_root: the registry defers to the enforcement point, which sent none"},
		{"explicit root, none sent", "fixed", `{"path":"/srv/fixed/a"}`, "", ""},
		{"explicit root, same sent", "fixed", `{"path":"/srv/fixed/a"}`, "/srv/fixed/", ""},
		{"explicit root, another sent", "fixed", `{"path":"/srv/fixed/a"}`, "/srv/ws", "workspace_root: the enforcement point's differs from the registry's"},
		{"no path_pointers, root ignored", "nopaths", `{"path":"../x"}`, "/srv/ws", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tool, _ := reg.Lookup("fs", tc.tool)
			codes, details := p.Check("fs", tool, pfParseArgs(t, tc.args), len(tc.args), tc.epRoot)
			if tc.detail == "" {
				pfWantCodes(t, codes)
				return
			}
			pfWantCodes(t, codes, schemas.CodeDenyPathTraversal)
			pfWantDetail(t, details, tc.detail)
		})
	}
}

func TestPreflightWithoutInputSchema(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{MaxArgsBytes: 64},
		preflightTool("open", `"path_pointers":["/path"],"workspace_root":"/w"`))
	// Any fields, any types: no schema to hold them to.
	pfWantCodes(t, pfCodesOf(pfCheck(t, p, reg, "open", `{"path":"x","anything":{"goes":[1,true]}}`)))
	// Size and paths still apply.
	codes, _ := pfCheck(t, p, reg, "open", `{"path":"../x","pad":"`+strings.Repeat("p", 64)+`"}`)
	pfWantCodes(t, codes, schemas.CodeDenyPayloadTooLarge, schemas.CodeDenyPathTraversal)
	// An unclassified tool gets nothing.
	if codes, details := p.Check("fs", nil, map[string]any{"x": 1}, 1<<30, ""); codes != nil || details != nil {
		t.Fatalf("nil tool: %v %v", codes, details)
	}
}

func TestPreflightCodeOrder(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{MaxArgsBytes: 16},
		preflightTool("read_file", fileSchema+`,"path_pointers":["/path"],"workspace_root":"/work/root"`))
	codes, details := pfCheck(t, p, reg, "read_file", `{"path":"../`+pfSecret+`","count":"x","extra":1}`)
	pfWantCodes(t, codes, schemas.CodeDenyPayloadTooLarge, schemas.CodeDenyUnknownFields, schemas.CodeDenySchemaViolation, schemas.CodeDenyPathTraversal)
	pfWantDetail(t, details, "input_schema: /count: type: want integer")
	for _, d := range details {
		if strings.Contains(d, "extra") {
			t.Fatalf("detail %q names an undeclared key", d)
		}
	}
}

func TestPreflightNilArgsAreEmptyObject(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{},
		preflightTool("noargs", `"input_schema":{"type":"object","properties":{}}`),
		preflightTool("needs", `"input_schema":{"type":"object","required":["q"],"properties":{"q":{}}}`))
	noargs, _ := reg.Lookup("fs", "noargs")
	needs, _ := reg.Lookup("fs", "needs")
	pfWantCodes(t, pfCodesOf(p.Check("fs", noargs, nil, 0, "")))
	pfWantCodes(t, pfCodesOf(p.Check("fs", needs, nil, 0, "")), schemas.CodeDenySchemaViolation)
}

func TestPreflightOtherRegistry(t *testing.T) {
	p, _ := newTestPreflight(t, PreflightConfig{}, preflightTool("read_file", fileSchema))
	// Same schema bytes from another registry value: still the compiled one.
	_, reg2 := newTestPreflight(t, PreflightConfig{}, preflightTool("read_file", fileSchema))
	same, _ := reg2.Lookup("fs", "read_file")
	pfWantCodes(t, pfCodesOf(p.Check("fs", same, map[string]any{"path": "a"}, 12, "")))
	// A changed schema this Preflight never compiled: fail closed.
	reg3 := preflightRegistry(t, preflightTool("read_file", `"input_schema":{"type":"object"}`))
	changed, _ := reg3.Lookup("fs", "read_file")
	codes, details := p.Check("fs", changed, map[string]any{"path": "a"}, 12, "")
	pfWantCodes(t, codes, schemas.CodeDenySchemaViolation)
	pfWantDetail(t, details, "input_schema: not compiled by this preflight (registry changed)")
	// A tool the Preflight does not know at all.
	reg4 := preflightRegistry(t, preflightTool("other", `"input_schema":{"type":"object"}`))
	other, _ := reg4.Lookup("fs", "other")
	pfWantCodes(t, pfCodesOf(p.Check("fs", other, map[string]any{}, 2, "")), schemas.CodeDenySchemaViolation)
}

func TestNewPreflightBadSchemas(t *testing.T) {
	cases := []struct{ name, schema string }{
		{"remote ref", `{"$ref":"https://example.com/schema.json"}`},
		{"relative ref", `{"properties":{"a":{"$ref":"other.json#/defs/a"}}}`},
		{"file ref", `{"$ref":"file:///etc/passwd"}`},
		{"missing local ref", `{"$ref":"#/$defs/nope"}`},
		{"unknown metaschema", `{"$schema":"https://example.com/my-draft","type":"object"}`},
		{"bad type", `{"type":5}`},
		{"bad pattern", `{"properties":{"a":{"pattern":"(?<=x)"}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := preflightRegistry(t,
				preflightTool("good", `"input_schema":{"type":"object"}`),
				preflightTool("bad_tool", `"input_schema":`+tc.schema))
			_, err := NewPreflight(reg, PreflightConfig{})
			if err == nil {
				t.Fatal("NewPreflight accepted the schema")
			}
			if !errors.Is(err, ErrInputSchema) {
				t.Fatalf("error %v does not wrap ErrInputSchema", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "server_id fs") || !strings.Contains(msg, `tool_name "bad_tool"`) {
				t.Fatalf("error %q does not name server_id and tool_name", msg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q spans several lines", err)
			}
		})
	}
	// A nil registry is an empty one.
	if _, err := NewPreflight(nil, PreflightConfig{}); err != nil {
		t.Fatal(err)
	}
}

func TestPreflightDraft7Schema(t *testing.T) {
	p, reg := newTestPreflight(t, PreflightConfig{},
		preflightTool("d7", `"input_schema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"t":{"type":"array","items":[{"type":"object","properties":{"a":{}}}]}},"definitions":{}}`))
	pfWantCodes(t, pfCodesOf(pfCheck(t, p, reg, "d7", `{"t":[{"a":1}]}`)))
	codes, details := pfCheck(t, p, reg, "d7", `{"t":[{"a":1,"b":2}]}`)
	pfWantCodes(t, codes, schemas.CodeDenyUnknownFields)
	pfWantDetail(t, details, "input_schema: /t/0/*: unknown field")
}

func BenchmarkPreflightCheck(b *testing.B) {
	reg, err := NewRegistry([]byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"fs","tools":[` +
		preflightTool("read_file", fileSchema+`,"path_pointers":["/path"],"workspace_root":"/work/root"`) + `]}`))
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewPreflight(reg, PreflightConfig{})
	if err != nil {
		b.Fatal(err)
	}
	tool, _ := reg.Lookup("fs", "read_file")
	raw := `{"path":"notes/2024/a.txt","mode":"r","count":3,"options":{"recursive":true},"files":[{"name":"a"},{"name":"b"}]}`
	d := json.NewDecoder(strings.NewReader(raw))
	d.UseNumber()
	var args any
	if err := d.Decode(&args); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if codes, _ := p.Check("fs", tool, args, len(raw), ""); codes != nil {
			b.Fatal(codes)
		}
	}
}
