package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

func TestParseScope(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Scope
	}{
		{"tool:*", Scope{Server: "*", Tool: "*"}},
		{"tool:files:*", Scope{Server: "files", Tool: "*"}},
		{"tool:files:read_file", Scope{Server: "files", Tool: "read_file"}},
		{"tool:gh:github/method:list_prs", Scope{Server: "gh", Tool: "github", Method: "list_prs", HasMethod: true}},
		{"tool:gh:github/method:*", Scope{Server: "gh", Tool: "github", Method: "*", HasMethod: true}},
		{"tool:files:read_file/resource:/work/src/*", Scope{Server: "files", Tool: "read_file", Resource: "/work/src/*", HasResource: true}},
		{"tool:gh:github/method:get/resource:org/repo", Scope{Server: "gh", Tool: "github", Method: "get", HasMethod: true, Resource: "org/repo", HasResource: true}},
		{"tool:*/resource:*", Scope{Server: "*", Tool: "*", Resource: "*", HasResource: true}},
		{"tool:a:ns:tool", Scope{Server: "a", Tool: "ns:tool"}},
		{"tool:files:read_file/resource:/a/method:x", Scope{Server: "files", Tool: "read_file", Resource: "/a/method:x", HasResource: true}},
		{"tool:files:read_file/resource:my docs/*", Scope{Server: "files", Tool: "read_file", Resource: "my docs/*", HasResource: true}},
	} {
		got, err := ParseScope(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseScope(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if got.String() != tc.in {
			t.Errorf("String() = %q, want %q", got.String(), tc.in)
		}
	}
	for _, in := range badScopes {
		if _, err := ParseScope(in); !errors.Is(err, ErrScopeSyntax) {
			t.Errorf("ParseScope(%q) = %v, want ErrScopeSyntax", in, err)
		} else if strings.Contains(err.Error(), in) && in != "" {
			t.Errorf("error quotes the input: %v", err)
		}
	}
}

var badScopes = []string{
	"", "tool:", "tools:files:x", "tool:files", "tool:Files:x", "tool:files:", "tool:*:x", "tool:files:read*",
	"tool:files:*x", "tool:files:x/", "tool:files:x/method:", "tool:files:x/method:a*", "tool:files:x/method:a/",
	"tool:files:x/resource:", "tool:files:x/resource:**", "tool:files:x/resource:a*b", "tool:files:x/resource:a\n",
	"tool:files:x/other:y", "tool:files:x y", "tool:files:x/method:a b", "tool:files:x/method:a/method:b",
	"tool:*/method:x/", "scope:files:x", "tool:files:x/resource:a/method:b/resource:c*d",
	"tool:files:" + strings.Repeat("x", MaxScopeLen),
}

// TestScopeMatchesSchema: ParseScope accepts exactly what
// capability.schema.json's scope pattern accepts.
func TestScopeMatchesSchema(t *testing.T) {
	good := []string{"tool:*", "tool:files:*", "tool:a:ns:tool", "tool:files:read_file/resource:my docs/*",
		"tool:gh:github/method:get/resource:org/repo", "tool:x:é/method:ü", "tool:files:x/resource:/a/method:b"}
	chain := capChain(t, 0)
	for _, s := range append(good, badScopes...) {
		_, perr := ParseScope(s)
		c := *chain
		c.Capability.Scopes = []string{s}
		b, _ := json.Marshal(&c)
		serr := schemas.ValidateCapabilityChain(b)
		if (perr == nil) != (serr == nil) {
			t.Errorf("%q: ParseScope err %v, schema err %v", s, perr, serr)
		}
	}
}

func TestScopeCovers(t *testing.T) {
	type call struct {
		server, tool, method, resource string
		hasResource                    bool
	}
	plain := call{"files", "read_file", "", "", false}
	withRes := call{"files", "read_file", "", "/work/src/a.go", true}
	action := call{"gh", "github", "list_prs", "org/repo", true}
	for _, tc := range []struct {
		scope string
		c     call
		want  bool
	}{
		{"tool:*", plain, true},
		{"tool:*", action, true},
		{"tool:files:*", plain, true},
		{"tool:files:*", action, false},
		{"tool:files:read_file", withRes, true},
		{"tool:files:write_file", withRes, false},
		{"tool:docs:read_file", withRes, false},
		{"tool:files:read_file/resource:/work/*", withRes, true},
		{"tool:files:read_file/resource:/work/src/a.go", withRes, true},
		{"tool:files:read_file/resource:/work/src/a.g", withRes, false},
		{"tool:files:read_file/resource:/etc/*", withRes, false},
		{"tool:files:read_file/resource:*", withRes, true},
		{"tool:files:read_file/resource:*", plain, true},
		{"tool:files:read_file/resource:/work/*", plain, false}, // no resource: not covered
		{"tool:files:read_file/resource:", plain, false},        // malformed: covers nothing
		{"tool:gh:github/method:list_prs", action, true},
		{"tool:gh:github/method:merge_pr", action, false},
		{"tool:gh:github/method:*", action, true},
		{"tool:gh:github/method:list_prs", call{"gh", "github", "", "", false}, false}, // no method
		{"tool:gh:github/method:*", call{"gh", "github", "", "", false}, true},
		{"tool:gh:*/method:list_prs/resource:org/*", action, true},
		{"tool:gh:*/method:list_prs/resource:other/*", action, false},
	} {
		got := ScopesCover([]string{tc.scope}, tc.c.server, tc.c.tool, tc.c.method, tc.c.resource, tc.c.hasResource)
		if got != tc.want {
			t.Errorf("%q covers %+v = %v, want %v", tc.scope, tc.c, got, tc.want)
		}
	}
	if ScopesCover(nil, "files", "read_file", "", "", false) {
		t.Error("no scopes cover a call")
	}
	if !ScopesCover([]string{"bad", "tool:files:*"}, "files", "x", "", "", false) {
		t.Error("a malformed scope hides a good one")
	}
}

func TestScopeContains(t *testing.T) {
	for _, tc := range []struct {
		parent, child string
		want          bool
	}{
		{"tool:*", "tool:*", true},
		{"tool:*", "tool:files:*", true},
		{"tool:*", "tool:files:read_file/method:x/resource:y", true},
		{"tool:files:*", "tool:*", false},
		{"tool:files:*", "tool:files:*", true},
		{"tool:files:*", "tool:files:read_file", true},
		{"tool:files:*", "tool:docs:read_file", false},
		{"tool:files:read_file", "tool:files:*", false},
		{"tool:files:read_file", "tool:files:read_file", true},
		{"tool:files:read_file", "tool:files:write_file", false},
		{"tool:files:read_file", "tool:files:read_file/resource:/a/*", true},
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file", false}, // fewer segments: wider
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file/resource:/a/b", true},
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file/resource:/a/b/*", true},
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file/resource:/a/*", true},
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file/resource:/*", false},
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file/resource:*", false},
		{"tool:files:read_file/resource:/a/*", "tool:files:read_file/resource:/b/x", false},
		{"tool:files:read_file/resource:/a/x", "tool:files:read_file/resource:/a/x*", false},
		{"tool:files:read_file/resource:/a/x", "tool:files:read_file/resource:/a/x", true},
		{"tool:files:read_file/resource:*", "tool:files:read_file/resource:/a", true},
		{"tool:gh:github/method:*", "tool:gh:github/method:get", true},
		{"tool:gh:github/method:*", "tool:gh:github", false},
		{"tool:gh:github/method:get", "tool:gh:github/method:*", false},
		{"tool:gh:github/method:get", "tool:gh:github/method:put", false},
		{"tool:gh:github/method:get", "tool:gh:github/method:get/resource:o/*", true},
		{"tool:gh:github/resource:o/*", "tool:gh:github/method:get/resource:o/r", true}, // adds a method: narrower
		{"tool:gh:github/method:get/resource:o/*", "tool:gh:github/resource:o/r", false},
	} {
		p, err1 := ParseScope(tc.parent)
		c, err2 := ParseScope(tc.child)
		if err1 != nil || err2 != nil {
			t.Fatalf("%q ⊇ %q: %v %v", tc.parent, tc.child, err1, err2)
		}
		if got := p.Contains(c); got != tc.want {
			t.Errorf("%q contains %q = %v, want %v", tc.parent, tc.child, got, tc.want)
		}
	}
}

// TestScopeContainsImpliesCovers: whenever a parent contains a child,
// every call the child covers the parent covers too (containment is never
// looser than coverage).
func TestScopeContainsImpliesCovers(t *testing.T) {
	scopes := []string{"tool:*", "tool:files:*", "tool:files:read_file", "tool:files:read_file/resource:/a/*",
		"tool:files:read_file/resource:/a/b", "tool:files:read_file/resource:*", "tool:files:read_file/method:*",
		"tool:files:read_file/method:get", "tool:files:read_file/method:get/resource:/a/*", "tool:*/resource:/a*",
		"tool:files:*/method:get", "tool:docs:*"}
	var calls [][5]string
	for _, srv := range []string{"files", "docs"} {
		for _, tool := range []string{"read_file", "x"} {
			for _, m := range []string{"", "get", "put"} {
				for _, r := range []string{"", "/a", "/a/b", "/a/c", "/b"} {
					calls = append(calls, [5]string{srv, tool, m, r, fmt.Sprint(r != "")})
				}
			}
		}
	}
	for _, ps := range scopes {
		for _, cs := range scopes {
			p, _ := ParseScope(ps)
			c, _ := ParseScope(cs)
			if !p.Contains(c) {
				continue
			}
			for _, k := range calls {
				has := k[4] == "true"
				if c.Covers(k[0], k[1], k[2], k[3], has) && !p.Covers(k[0], k[1], k[2], k[3], has) {
					t.Errorf("%q contains %q but does not cover %v", ps, cs, k)
				}
			}
		}
	}
}
