package enforce_test

import (
	"slices"
	"testing"

	"github.com/talos-audit/talos/enforce"
)

// serverFactsRegistry has a server whose tools root paths in two places
// and fetch, one that defers to the enforcement point, and one with
// neither.
func serverFactsRegistry(t *testing.T) *enforce.Registry {
	t.Helper()
	tool := func(name, extra string) string {
		return `{"tool_name":"` + name + `","tool_class":"read","is_document_op":false` + extra + `}`
	}
	paths := func(root string) string { return `,"path_pointers":["/path"],"workspace_root":"` + root + `"` }
	m := func(server string, tools ...string) []byte {
		b := `{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"` + server + `","tools":[`
		for i, tl := range tools {
			if i > 0 {
				b += ","
			}
			b += tl
		}
		return []byte(b + `]}`)
	}
	reg, err := enforce.NewRegistry(
		m("two", tool("a", paths("/srv/b")), tool("b", paths("/srv/a")), tool("c", paths("/srv/b")), tool("fetch", `,"network_outbound":true`)),
		m("ep", tool("read", paths("enforcement_point")), tool("list", paths("/srv/ep")), tool("quiet", `,"network_outbound":false`)),
		m("plain", tool("echo", "")),
	)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestRegistryServerFacts(t *testing.T) {
	reg := serverFactsRegistry(t)
	cases := []struct {
		server   string
		deferred bool
		explicit []string
		network  bool
	}{
		{"two", false, []string{"/srv/a", "/srv/b"}, true},
		{"ep", true, []string{"/srv/ep"}, false},
		{"plain", false, nil, false},
		{"absent", false, nil, false},
	}
	for _, c := range cases {
		t.Run(c.server, func(t *testing.T) {
			deferred, explicit := reg.WorkspaceRoots(c.server)
			if deferred != c.deferred || !slices.Equal(explicit, c.explicit) {
				t.Fatalf("WorkspaceRoots = %v, %q; want %v, %q", deferred, explicit, c.deferred, c.explicit)
			}
			if got := reg.ServerNetworkOutbound(c.server); got != c.network {
				t.Fatalf("ServerNetworkOutbound = %v, want %v", got, c.network)
			}
		})
	}
}
