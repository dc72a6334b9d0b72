package main

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/testenv"
)

func msList(v ...float64) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x * float64(time.Millisecond))
	}
	return d
}

func TestSummarize(t *testing.T) {
	oneToHundred := make([]float64, 100)
	for i := range oneToHundred {
		oneToHundred[i] = float64(i + 1)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(oneToHundred), func(i, j int) {
		oneToHundred[i], oneToHundred[j] = oneToHundred[j], oneToHundred[i]
	})
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want latencySummary
	}{
		{"empty", nil, latencySummary{}},
		{"one call", msList(5), latencySummary{Calls: 1, P50ms: 5, P90ms: 5, P99ms: 5, MaxMs: 5, MeanMs: 5}},
		// index floor(p·(n−1)): p50 → 4, p90 → 8, p99 → 8.
		{"ten calls, unsorted", msList(10, 1, 9, 2, 8, 3, 7, 4, 6, 5),
			latencySummary{Calls: 10, P50ms: 5, P90ms: 9, P99ms: 9, MaxMs: 10, MeanMs: 5.5}},
		{"a hundred calls, shuffled", msList(oneToHundred...),
			latencySummary{Calls: 100, P50ms: 50, P90ms: 90, P99ms: 99, MaxMs: 100, MeanMs: 50.5}},
		{"sub-millisecond, mean rounded to µs", msList(0.25, 0.5, 0.75, 0.4),
			latencySummary{Calls: 4, P50ms: 0.4, P90ms: 0.5, P99ms: 0.5, MaxMs: 0.75, MeanMs: 0.475}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(tc.in); got != tc.want {
				t.Errorf("summarize = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAdded(t *testing.T) {
	for _, tc := range []struct {
		name        string
		direct, via []time.Duration
		want        addedLatency
	}{
		{
			// Per round: 2, 1, 2, 6 → sorted 1, 2, 2, 6 (p50 index 1, p99 index 2).
			// Sides sorted: direct 1 2 3 4, via 3 3 5 10.
			name:   "via slower",
			direct: msList(1, 2, 3, 4), via: msList(3, 3, 5, 10),
			want: addedLatency{PairedP50ms: 2, PairedP99ms: 2, P50ms: 1, P90ms: 2, P99ms: 2, MeanMs: 2.75},
		},
		{
			// A round where via was faster gives a negative difference.
			name:   "via faster in some rounds",
			direct: msList(4, 1, 1), via: msList(1, 2, 2),
			want: addedLatency{PairedP50ms: 1, PairedP99ms: 1, P50ms: 1, P90ms: 1, P99ms: 1, MeanMs: -0.333},
		},
		{
			name:   "equal",
			direct: msList(1, 2, 3), via: msList(1, 2, 3),
			want: addedLatency{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct, via := slices.Clone(tc.direct), slices.Clone(tc.via)
			if got := added(direct, via); got != tc.want {
				t.Errorf("added = %+v, want %+v", got, tc.want)
			}
			// The rounds must stay paired: added must not sort its inputs.
			if !slices.Equal(direct, tc.direct) || !slices.Equal(via, tc.via) {
				t.Errorf("added reordered its inputs: %v %v", direct, via)
			}
		})
	}
}

func TestResultDigest(t *testing.T) {
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	digest := func(r *mcp.CallToolResult) string {
		t.Helper()
		d, err := resultDigest(r)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := digest(text("Echo: hello"))
	if b := digest(text("Echo: hello")); a != b {
		t.Errorf("equal results, different digests: %s, %s", a, b)
	}
	withMeta := text("Echo: hello")
	withMeta.Meta = mcp.Meta{"dev.talos/receipt_id": "r-1"}
	if b := digest(withMeta); a != b {
		t.Errorf("_meta must not count: %s, %s", a, b)
	}
	if b := digest(text("Echo: hellO")); a == b {
		t.Errorf("different text, same digest %s", a)
	}
	structured := text("Echo: hello")
	structured.StructuredContent = map[string]any{"n": 1}
	if b := digest(structured); a == b {
		t.Errorf("structured content ignored: %s", a)
	}
}

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
	var res benchMCPResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench-mcp --json: %v: %s", err, out)
	}
	if res.Tool != "echo" || res.Warmup != 2 || res.D.Calls != 5 || res.V.Calls != 5 {
		t.Errorf("result %+v: want tool echo, warmup 2, 5 calls per side", res)
	}
	for _, s := range []latencySummary{res.D, res.V} {
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
