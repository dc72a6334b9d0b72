package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/ingest/mcpup"
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

func (b *benchMCPCmd) Run(g *Globals) error {
	args, specs, err := b.check()
	if err != nil {
		return err
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
	var sides [2]loadgen.MCPSide
	defer func() {
		for _, s := range sides {
			if s.CS != nil {
				_ = s.CS.Close()
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
		sides[i] = loadgen.MCPSide{Name: s.ServerID, CS: cs}
	}
	direct, via, err := loadgen.CompareMCP(ctx, sides[0], sides[1], &mcp.CallToolParams{Name: b.Tool, Arguments: args}, b.Calls, b.Warmup, b.Timeout)
	if err != nil {
		return failed("%v", err)
	}
	res := loadgen.MCPResult{
		Tool: b.Tool, Warmup: b.Warmup, Direct: specs[0].String(), Via: specs[1].String(),
		Added: loadgen.Added(direct, via),
		D:     loadgen.Summarize(direct), V: loadgen.Summarize(via),
	}
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	printBenchMCP(&res)
	return nil
}

// check reads the flags: the call's arguments and the two sides' specs.
func (b *benchMCPCmd) check() (map[string]any, [2]mcpup.Spec, error) {
	var specs [2]mcpup.Spec
	if b.Calls <= 0 || b.Warmup < 0 || b.Timeout <= 0 {
		return nil, specs, usage("--calls and --timeout must be positive, --warmup must not be negative")
	}
	var args map[string]any
	dec := json.NewDecoder(bytes.NewReader([]byte(b.Args)))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil || args == nil || dec.More() {
		return nil, specs, usage("--args must be one JSON object")
	}
	for i, f := range []struct{ name, val string }{{"--direct", b.Direct}, {"--via", b.Via}} {
		s, err := mcpup.ParseSpec(f.val)
		if err != nil {
			return nil, specs, usage("%s: %v", f.name, err)
		}
		specs[i] = s
	}
	return args, specs, nil
}

func printBenchMCP(res *loadgen.MCPResult) {
	fmt.Printf("tools/call %s, %d calls per side after %d warm-up, one in flight, sides interleaved; every result checked equal\n",
		res.Tool, res.D.Calls, res.Warmup)
	fmt.Printf("direct: %s\nvia:    %s\n", res.Direct, res.Via)
	fmt.Printf("%-22s %9s %9s %9s %9s %9s\n", "latency, ms", "p50", "p90", "p99", "max", "mean")
	row := func(name string, s loadgen.LatencySummary) {
		fmt.Printf("%-22s %9.3f %9.3f %9.3f %9.3f %9.3f\n", name, s.P50ms, s.P90ms, s.P99ms, s.MaxMs, s.MeanMs)
	}
	row("direct", res.D)
	row("via", res.V)
	a := res.Added
	fmt.Printf("%-22s %9.3f %9.3f %9.3f %9s %9.3f\n", "added (via − direct)", a.P50ms, a.P90ms, a.P99ms, "", a.MeanMs)
	fmt.Printf("added per round (via − direct of the same round): p50 %.3f ms, p99 %.3f ms\n", a.PairedP50ms, a.PairedP99ms)
}
