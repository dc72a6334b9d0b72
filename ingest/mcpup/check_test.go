package mcpup

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestCheckTool(t *testing.T) {
	for _, tc := range []struct {
		name, def, want string // want: "" for a servable tool, else part of the reason
	}{
		{"object schema", `{"name":"a","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}}`, ""},
		{"output schema", `{"name":"a","inputSchema":{"type":"object"},"outputSchema":{"type":"object"}}`, ""},
		{"draft-07", `{"name":"a","inputSchema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}}`, ""},
		{"no type", `{"name":"a","inputSchema":{"properties":{}}}`, `"type" must be "object" (got none)`},
		{"array type", `{"name":"a","inputSchema":{"type":"array"}}`, `(got "array")`},
		{"no schema", `{"name":"a"}`, "no inputSchema"},
		{"schema not an object", `{"name":"a","inputSchema":"x"}`, "not a JSON object"},
		{"does not compile", `{"name":"a","inputSchema":{"type":"object","properties":{"x":{"type":5}}}}`, "does not compile"},
		{"remote ref", `{"name":"a","inputSchema":{"type":"object","$ref":"https://example.com/s.json"}}`, "does not compile"},
		{"bad output schema", `{"name":"a","inputSchema":{"type":"object"},"outputSchema":{"type":7}}`, "outputSchema"},
		{"no name", `{"inputSchema":{"type":"object"}}`, "no name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tool mcp.Tool
			if err := json.Unmarshal([]byte(tc.def), &tool); err != nil {
				t.Fatal(err)
			}
			err := CheckTool(&tool)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestCheckPromptsAndResources(t *testing.T) {
	if err := CheckPrompt(&mcp.Prompt{Name: "p", Arguments: []*mcp.PromptArgument{{Name: "a"}}}); err != nil {
		t.Fatal(err)
	}
	if err := CheckPrompt(&mcp.Prompt{Name: "p", Arguments: []*mcp.PromptArgument{{}}}); err == nil {
		t.Fatal("a nameless argument passed")
	}
	if err := CheckResource(&mcp.Resource{URI: "file:///a"}); err != nil {
		t.Fatal(err)
	}
	if err := CheckResource(&mcp.Resource{URI: "a/b"}); err == nil {
		t.Fatal("a relative URI passed")
	}
	if err := CheckResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://x/{id}"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"test://x/{id", "{scheme}://x", "x/{id}"} {
		if err := CheckResourceTemplate(&mcp.ResourceTemplate{URITemplate: bad}); err == nil {
			t.Fatalf("%s passed", bad)
		}
	}
}

// TestListFilter: a tools/list response loses the definitions that
// cannot be served, each reported once, and keeps the rest byte for byte;
// a response to another method is untouched.
func TestListFilter(t *testing.T) {
	var got []Rejected
	c := &filterConn{server: "s", report: func(r Rejected) { got = append(got, r) }}
	in := `{"tools":[{"name":"ok","inputSchema":{"type":"object"}},{"name":7},{"name":"nt","inputSchema":{}}],"nextCursor":"c"}`
	out := string(c.filter("tools/list", json.RawMessage(in)))
	if out != `{"nextCursor":"c","tools":[{"name":"ok","inputSchema":{"type":"object"}}]}` {
		t.Fatalf("filtered: %s", out)
	}
	if len(got) != 2 || got[0].Name != "7" || got[1].Name != "nt" || got[0].Kind != KindTool || got[0].ServerID != "s" {
		t.Fatalf("rejected: %+v", got)
	}
	in = `{"prompts":[{"name":"p"},{"description":"x"}]}`
	if out := string(c.filter("prompts/list", json.RawMessage(in))); out != `{"prompts":[{"name":"p"}]}` {
		t.Fatalf("prompts: %s", out)
	}
	if in := `{"tools":"not a list"}`; string(c.filter("tools/list", json.RawMessage(in))) != in {
		t.Fatal("a malformed list was rewritten")
	}
}
