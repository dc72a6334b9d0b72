package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/testenv"
)

// TestBenchMCPUsage: bad flags are usage errors (exit 2), found before any
// server is started.
func TestBenchMCPUsage(t *testing.T) {
	ok := benchMCPCmd{Direct: "a=/nonexistent/server", Via: "b=/nonexistent/server", Tool: "echo",
		Args: `{"message":"hello"}`, Calls: 1, Timeout: time.Second}
	for _, tc := range []struct {
		name string
		edit func(*benchMCPCmd)
	}{
		{"args not JSON", func(c *benchMCPCmd) { c.Args = `{"message":` }},
		{"args an array", func(c *benchMCPCmd) { c.Args = `["hello"]` }},
		{"args null", func(c *benchMCPCmd) { c.Args = `null` }},
		{"args two objects", func(c *benchMCPCmd) { c.Args = `{} {}` }},
		{"no calls", func(c *benchMCPCmd) { c.Calls = 0 }},
		{"negative warmup", func(c *benchMCPCmd) { c.Warmup = -1 }},
		{"direct without label", func(c *benchMCPCmd) { c.Direct = "/usr/bin/server" }},
		{"via with a bad label", func(c *benchMCPCmd) { c.Via = "Not Valid=/usr/bin/server" }},
		{"url not http", func(c *benchMCPCmd) { c.Via, c.URL = "", "ftp://127.0.0.1/mcp" }},
		{"token for a stdio via side", func(c *benchMCPCmd) { c.Token = "t" }},
		{"ca for a stdio via side", func(c *benchMCPCmd) { c.CA = "ca.pem" }},
		{"ca not PEM", func(c *benchMCPCmd) { c.Via, c.URL, c.CA = "", "https://127.0.0.1:1/mcp", "bench_mcp.go" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			var ee exitError
			if err := c.Run(&Globals{}); !errors.As(err, &ee) || ee.code != 2 {
				t.Fatalf("Run = %v, want a usage error (exit 2)", err)
			}
		})
	}
	// The unchanged flags pass validation and fail on the missing server
	// (exit 1), which shows the cases above failed for their own reason.
	var ee exitError
	if err := ok.Run(&Globals{}); !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("Run with a missing server = %v, want exit 1", err)
	}
}

// TestBenchMCPTwoServers runs the talosctl binary against two processes of
// the real mcp-server-everything (npm): every call is checked and counted,
// and a tool whose calls fail stops the run with exit 1.
func TestBenchMCPTwoServers(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	everything := testenv.MCPBin(t, testenv.MCPServerEverything)
	stderr := t.TempDir() + "/servers.log"
	base := []string{"--json", "bench-mcp", "--direct", "a=" + everything, "--via", "b=" + everything,
		"--calls", "5", "--warmup", "2", "--stderr", stderr}

	out, code := run(t, talosctl, base...)
	if code != 0 {
		t.Fatalf("bench-mcp: exit %d: %s", code, out)
	}
	var res loadgen.MCPResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench-mcp --json: %v: %s", err, out)
	}
	if res.Tool != "echo" || res.Warmup != 2 || res.D.Calls != 5 || res.V.Calls != 5 {
		t.Errorf("result %+v: want tool echo, warmup 2, 5 calls per side", res)
	}
	for _, s := range []loadgen.LatencySummary{res.D, res.V} {
		if s.P50ms <= 0 || s.P50ms > s.P90ms || s.P90ms > s.P99ms || s.P99ms > s.MaxMs {
			t.Errorf("latencies not ordered 0 < p50 ≤ p90 ≤ p99 ≤ max: %+v", s)
		}
	}
	if !strings.HasPrefix(res.Direct, "a=") || !strings.HasPrefix(res.Via, "b=") {
		t.Errorf("sides named %q and %q, want a=… and b=…", res.Direct, res.Via)
	}

	// An unknown tool is a tool error on both sides: the run stops at once.
	out, code = run(t, talosctl, append(base, "--tool", "no-such-tool")...)
	if code != 1 || !strings.Contains(out, "round 1: a: tools/call no-such-tool") {
		t.Fatalf("unknown tool: exit %d, output %q; want exit 1 naming round 1 and side a", code, out)
	}
}
