package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/cmd/internal/mcpup"
)

// benchMCPCmd measures what an MCP proxy (talos-mcp-gateway) adds to a
// tools/call: the same call, through the MCP Go SDK client, to the server
// directly and through the proxy, one call in flight, the two sides
// interleaved so that drift on the machine hits both alike.
type benchMCPCmd struct {
	Direct  string        `name:"direct" required:"" help:"The server called directly: '<label>=<command> [args...]' (stdio) or '<label>=http(s)://...' (streamable HTTP)."`
	Via     string        `name:"via" required:"" help:"The same server behind the gateway, e.g. 'gw=talos-mcp-gateway --ep-id gw1 --registry R --upstream \"everything=mcp-server-everything\"'."`
	Tool    string        `name:"tool" default:"echo" help:"Tool to call on both sides."`
	Args    string        `name:"args" default:"{\"message\":\"hello\"}" help:"The call's arguments (a JSON object)."`
	Calls   int           `name:"calls" default:"2000" help:"Measured calls per side."`
	Warmup  int           `name:"warmup" default:"100" help:"Calls per side before measuring (checked, not timed)."`
	Timeout time.Duration `name:"timeout" default:"30s" help:"Limit of one call, and of each side's start and handshake."`
	Stderr  string        `name:"stderr" type:"path" help:"Append the stdio servers' stderr (the gateway's log) to this file instead of this command's stderr."`
}

// latencySummary describes one sample of call latencies, in milliseconds.
// Percentiles are nearest-rank from below: the value at index
// floor(p·(n−1)) of the sorted sample, as in talosctl bench.
type latencySummary struct {
	Calls  int     `json:"calls"`
	P50ms  float64 `json:"p50_ms"`
	P90ms  float64 `json:"p90_ms"`
	P99ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// addedLatency is what the via side adds to the direct side, in
// milliseconds, two ways: Paired* are percentiles of the per-round
// differences (via − direct of the same round), and the others are
// differences of the two sides' percentiles.
type addedLatency struct {
	PairedP50ms float64 `json:"paired_p50_ms"`
	PairedP99ms float64 `json:"paired_p99_ms"`
	P50ms       float64 `json:"p50_ms"`
	P90ms       float64 `json:"p90_ms"`
	P99ms       float64 `json:"p99_ms"`
	MeanMs      float64 `json:"mean_ms"`
}

type benchMCPResult struct {
	Tool   string         `json:"tool"`
	Warmup int            `json:"warmup"`
	Direct string         `json:"direct"`
	Via    string         `json:"via"`
	D      latencySummary `json:"direct_latency"`
	V      latencySummary `json:"via_latency"`
	Added  addedLatency   `json:"added"`
}

// summarize sorts d in place and describes it; an empty sample is all zeros.
func summarize(d []time.Duration) latencySummary {
	if len(d) == 0 {
		return latencySummary{}
	}
	slices.Sort(d)
	at := func(p float64) float64 { return ms(d[int(p*float64(len(d)-1))]) }
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return latencySummary{
		Calls: len(d), P50ms: at(0.50), P90ms: at(0.90), P99ms: at(0.99), MaxMs: at(1),
		MeanMs: roundMs(ms(sum) / float64(len(d))),
	}
}

// added compares two samples taken in rounds: direct[i] and via[i] are the
// same round. Neither slice is modified.
func added(direct, via []time.Duration) addedLatency {
	n := min(len(direct), len(via))
	diff := make([]time.Duration, n)
	for i := range n {
		diff[i] = via[i] - direct[i]
	}
	pd := summarize(diff)
	ds, vs := summarize(slices.Clone(direct)), summarize(slices.Clone(via))
	return addedLatency{
		PairedP50ms: pd.P50ms, PairedP99ms: pd.P99ms,
		P50ms: roundMs(vs.P50ms - ds.P50ms), P90ms: roundMs(vs.P90ms - ds.P90ms), P99ms: roundMs(vs.P99ms - ds.P99ms),
		MeanMs: roundMs(vs.MeanMs - ds.MeanMs),
	}
}

// roundMs rounds milliseconds to whole microseconds, the resolution of every
// figure here.
func roundMs(msec float64) float64 { return math.Round(msec*1000) / 1000 }

// benchSide is one end of the comparison: a connected client session and
// its measured latencies.
type benchSide struct {
	spec mcpup.Spec
	cs   *mcp.ClientSession
	lat  []time.Duration
}

// call runs one tools/call and checks that it succeeded: a protocol error
// (a gateway's deny among them) or a result with isError fails the run.
func (s *benchSide) call(ctx context.Context, timeout time.Duration, p *mcp.CallToolParams) (*mcp.CallToolResult, time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res, err := s.cs.CallTool(cctx, p)
	took := time.Since(start)
	switch {
	case err != nil:
		return nil, took, fmt.Errorf("%s: tools/call %s: %w", s.spec.ServerID, p.Name, err)
	case res.IsError:
		return nil, took, fmt.Errorf("%s: tools/call %s: the result is a tool error (isError)", s.spec.ServerID, p.Name)
	}
	return res, took, nil
}

// resultDigest is a short digest of what a result says (content and
// structured content; _meta is left out), to compare the two sides without
// printing what the tool returned.
func resultDigest(r *mcp.CallToolResult) (string, error) {
	b, err := json.Marshal(struct {
		Content    []mcp.Content `json:"content"`
		Structured any           `json:"structuredContent,omitempty"`
	}{r.Content, r.StructuredContent})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%d bytes, sha256 %s", len(b), hex.EncodeToString(sum[:6])), nil
}

func (b *benchMCPCmd) Run(g *Globals) error {
	if b.Calls <= 0 || b.Warmup < 0 || b.Timeout <= 0 {
		return usage("--calls and --timeout must be positive, --warmup must not be negative")
	}
	var args map[string]any
	dec := json.NewDecoder(bytes.NewReader([]byte(b.Args)))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil || args == nil || dec.More() {
		return usage("--args must be one JSON object")
	}
	var specs [2]mcpup.Spec
	for i, f := range []struct{ name, val string }{{"--direct", b.Direct}, {"--via", b.Via}} {
		s, err := mcpup.ParseSpec(f.val)
		if err != nil {
			return usage("%s: %v", f.name, err)
		}
		specs[i] = s
	}
	stderr := io.Writer(os.Stderr)
	if b.Stderr != "" {
		f, err := os.OpenFile(b.Stderr, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return usage("--stderr: %v", err)
		}
		defer f.Close()
		stderr = f
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Closing a session ends its stdio server; the gateway then drains the
	// post events it still holds.
	var sides [2]*benchSide
	defer func() {
		for _, s := range sides {
			if s != nil {
				_ = s.cs.Close()
			}
		}
	}()
	for i, s := range specs {
		cctx, cancel := context.WithTimeout(ctx, b.Timeout)
		cs, err := mcpup.Connect(cctx, s, &mcp.Implementation{Name: "talosctl-bench-mcp", Version: "dev"}, mcpup.WithStderr(stderr))
		cancel()
		if err != nil {
			return failed("%v", err)
		}
		sides[i] = &benchSide{spec: s, cs: cs, lat: make([]time.Duration, 0, b.Calls)}
	}

	params := &mcp.CallToolParams{Name: b.Tool, Arguments: args}
	for round := -b.Warmup; round < b.Calls; round++ {
		var digests [2]string
		for i, s := range sides {
			res, took, err := s.call(ctx, b.Timeout, params)
			if err != nil {
				return failed("round %d: %v", round+b.Warmup+1, err)
			}
			if round >= 0 {
				s.lat = append(s.lat, took)
			}
			if digests[i], err = resultDigest(res); err != nil {
				return failed("round %d: %s: result: %v", round+b.Warmup+1, s.spec.ServerID, err)
			}
		}
		if digests[0] != digests[1] {
			return failed("round %d: the results differ: %s returned %s, %s returned %s",
				round+b.Warmup+1, sides[0].spec.ServerID, digests[0], sides[1].spec.ServerID, digests[1])
		}
	}

	res := benchMCPResult{
		Tool: b.Tool, Warmup: b.Warmup, Direct: specs[0].String(), Via: specs[1].String(),
		Added: added(sides[0].lat, sides[1].lat),
		D:     summarize(sides[0].lat), V: summarize(sides[1].lat),
	}
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("tools/call %s, %d calls per side after %d warm-up, one in flight, sides interleaved; every result checked equal\n",
		res.Tool, res.D.Calls, res.Warmup)
	fmt.Printf("direct: %s\nvia:    %s\n", res.Direct, res.Via)
	fmt.Printf("%-22s %9s %9s %9s %9s %9s\n", "latency, ms", "p50", "p90", "p99", "max", "mean")
	row := func(name string, s latencySummary) {
		fmt.Printf("%-22s %9.3f %9.3f %9.3f %9.3f %9.3f\n", name, s.P50ms, s.P90ms, s.P99ms, s.MaxMs, s.MeanMs)
	}
	row("direct", res.D)
	row("via", res.V)
	a := res.Added
	fmt.Printf("%-22s %9.3f %9.3f %9.3f %9s %9.3f\n", "added (via − direct)", a.P50ms, a.P90ms, a.P99ms, "", a.MeanMs)
	fmt.Printf("added per round (via − direct of the same round): p50 %.3f ms, p99 %.3f ms\n", a.PairedP50ms, a.PairedP99ms)
	return nil
}
