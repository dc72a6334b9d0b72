package main

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/ingest/mcpup"
)

// benchMCPCmd measures what an MCP proxy (talos-mcp-gateway) adds to a
// tools/call: the same call, through the MCP Go SDK client, to the server
// directly and through the proxy, one call in flight, the two sides
// interleaved so that drift on the machine hits both alike.
type benchMCPCmd struct {
	Direct   string        `name:"direct" required:"" help:"The server called directly: '<label>=<command> [args...]' (stdio) or '<label>=http(s)://...' (streamable HTTP)."`
	Via      string        `name:"via" xor:"via" required:"" help:"The same server behind the gateway, e.g. 'gw=talos-mcp-gateway --ep-id gw1 --registry R --upstream \"everything=mcp-server-everything\"'."`
	URL      string        `name:"url" xor:"via" required:"" help:"Instead of --via: the gateway's streamable HTTP endpoint, e.g. https://127.0.0.1:8931/mcp (the side named gw)."`
	Token    string        `name:"token" help:"A streamable HTTP via side: sent as 'Authorization: Bearer <token>' (a static token or a JWT)."`
	CA       string        `name:"ca" type:"existingfile" help:"A streamable HTTP via side: trust only the CA certificates in this PEM file (default: the system's roots)."`
	Tool     string        `name:"tool" default:"echo" help:"Tool to call on both sides."`
	Prompt   string        `name:"prompt" xor:"what" help:"Instead of a tool: get this prompt (prompts/get; --args its arguments)."`
	Resource string        `name:"resource" xor:"what" help:"Instead of a tool: read this resource URI (resources/read)."`
	Args     string        `name:"args" default:"{\"message\":\"hello\"}" help:"The call's arguments (a JSON object)."`
	Calls    int           `name:"calls" default:"2000" help:"Measured calls per side."`
	Warmup   int           `name:"warmup" default:"100" help:"Calls per side before measuring (checked, not timed)."`
	Timeout  time.Duration `name:"timeout" default:"30s" help:"Limit of one call, and of each side's start and handshake."`
	Stderr   string        `name:"stderr" type:"path" help:"Append the stdio servers' stderr (the gateway's log) to this file instead of this command's stderr."`
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

	viaHTTP, err := loadgen.HTTPClient(b.CA, b.Token)
	if err != nil {
		return usage("--ca: %v", err)
	}
	sides, closeAll, err := loadgen.ConnectMCP(ctx, specs, b.Timeout, stderr, viaHTTP)
	defer closeAll()
	if err != nil {
		return failed("%v", err)
	}
	op := loadgen.NewMCPOp(b.Tool, b.Prompt, b.Resource, args)
	direct, via, err := loadgen.CompareMCP(ctx, sides[0], sides[1], op, b.Calls, b.Warmup, b.Timeout)
	if err != nil {
		return failed("%v", err)
	}
	res := loadgen.NewMCPResult(op.Name, b.Warmup, specs, direct, via)
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	return res.WriteText(os.Stdout)
}

// check reads the flags: the call's arguments and the two sides' specs.
func (b *benchMCPCmd) check() (map[string]any, [2]mcpup.Spec, error) {
	var specs [2]mcpup.Spec
	if b.Calls <= 0 || b.Warmup < 0 || b.Timeout <= 0 {
		return nil, specs, usage("--calls and --timeout must be positive, --warmup must not be negative")
	}
	args, err := loadgen.ParseCallArgs(b.Args)
	if err != nil {
		return nil, specs, usage("--args must be one JSON object")
	}
	via := cmp.Or(b.Via, "gw="+b.URL) // kong lets only one of them through
	for i, f := range []struct{ name, val string }{{"--direct", b.Direct}, {"--via or --url", via}} {
		s, err := mcpup.ParseSpec(f.val)
		if err != nil {
			return nil, specs, usage("%s: %v", f.name, err)
		}
		specs[i] = s
	}
	if specs[1].URL == "" && (b.URL != "" || b.Token != "" || b.CA != "") {
		return nil, specs, usage("--url, --token and --ca are for a streamable HTTP via side (http:// or https://)")
	}
	return args, specs, nil
}
