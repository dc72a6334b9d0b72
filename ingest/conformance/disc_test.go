package conformance

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestDiscoveryInputs: the DISC rows' inputs are refused clearly when
// malformed, the token never appears in an error or a row, and the rows
// are not applicable, or fail, before any connection when what they need
// is missing or wrong. The live probe is TestConformanceGatewayProbes.
func TestDiscoveryInputs(t *testing.T) {
	dir := t.TempDir()
	const secret = "s3cret-principal-token"
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, empty, two := write("good", secret+"\n"), write("empty", " \n"), write("two", secret+" "+secret)
	load := func(f Files) (*Config, error) {
		f.ReadTool, f.WriteTool = "files/read_file", "files/write_file"
		cfg := &Config{Registry: "../../deploy/mcp/registry"}
		_, err := f.Load(cfg)
		return cfg, err
	}
	for _, c := range []struct {
		name string
		f    Files
		want string
	}{
		{"token without a gateway", Files{GatewayToken: good}, "need --gateway-url"},
		{"servers without a gateway", Files{GatewayServers: []string{"fs"}}, "need --gateway-url"},
		{"empty token file", Files{GatewayURL: "https://127.0.0.1:1/mcp", GatewayToken: empty}, "does not hold one bearer token"},
		{"two tokens", Files{GatewayURL: "https://127.0.0.1:1/mcp", GatewayToken: two}, "does not hold one bearer token"},
		{"no capability file", Files{GatewayURL: "https://127.0.0.1:1/mcp", GatewayCapability: filepath.Join(dir, "none.json")}, "--gateway-capability"},
	} {
		_, err := load(c.f)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), secret) {
			t.Errorf("%s: %v, want an error with %q and without the token", c.name, err, c.want)
		}
	}

	for _, c := range []struct {
		name, status, want string
		f                  Files
		registry           string
	}{
		{"no token", NotApplicable, "no principal's token given (--gateway-token-file)", Files{GatewayURL: "https://127.0.0.1:1/mcp"}, "reg"},
		{"no registry", NotApplicable, "no registry given (--registry)", Files{GatewayURL: "https://127.0.0.1:1/mcp", GatewayToken: good}, ""},
		{"plain http elsewhere", Fail, "the token is sent over https only, or to a loopback address",
			Files{GatewayURL: "http://gateway.invalid/mcp", GatewayToken: good}, "reg"},
		{"unknown server", Fail, "--gateway-server nope: the registry has no manifest",
			Files{GatewayURL: "https://127.0.0.1:1/mcp", GatewayToken: good, GatewayServers: []string{"fs", "nope"}}, "reg"},
	} {
		cfg, err := load(c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.registry == "" {
			cfg.Registry = ""
		}
		for _, r := range Discovery(context.Background(), *cfg) {
			if r.Status != c.status || !strings.Contains(r.Reason, c.want) || strings.Contains(r.Reason, secret) || r.Test == "" {
				t.Errorf("%s: %s %s %q, want %s with %q", c.name, r.ID, r.Status, r.Reason, c.status, c.want)
			}
		}
	}
}

// TestDiscoveryOutside: a listed tool is outside what the principal is
// permitted when no permitted tool has its name, or, for an action-based
// tool, when its schema offers an action the principal may not call or
// no action enum at all.
func TestDiscoveryOutside(t *testing.T) {
	e := &expected{visible: map[string][]permit{
		"echo":    {{}},
		"message": {{pointer: "/kind", actions: []string{"debug", "success"}}},
	}}
	schema := func(kinds ...string) map[string]any {
		p := map[string]any{"type": "string"}
		if kinds != nil {
			p["enum"] = kinds
		}
		return map[string]any{"type": "object", "properties": map[string]any{"kind": p}}
	}
	for _, c := range []struct {
		name   string
		listed map[string]*mcp.Tool
		want   []string
	}{
		{"as permitted", map[string]*mcp.Tool{"echo": {InputSchema: schema()}, "message": {InputSchema: schema("success", "debug")}}, nil},
		{"narrower", map[string]*mcp.Tool{"message": {InputSchema: schema("debug")}}, nil},
		{"an unpermitted tool", map[string]*mcp.Tool{"echo": {}, "write": {}}, []string{"write"}},
		{"an unpermitted action", map[string]*mcp.Tool{"message": {InputSchema: schema("debug", "error", "success")}},
			[]string{"message (actions error not permitted)"}},
		{"no action enum", map[string]*mcp.Tool{"message": {InputSchema: schema()}}, []string{"message (no action enum at /kind: any action)"}},
	} {
		if got := e.outside(c.listed); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
