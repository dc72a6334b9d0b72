// Command talos-mcp-gateway is Talos's enforcement point for MCP: it sits
// between an MCP client (Claude Desktop, an IDE, an agent) and one or more
// upstream MCP servers. tools/list shows only what the caller's registry
// entry and capability allow; every tools/call is published to Talos,
// decided by a worker (allow, deny, require_approval), forwarded only when
// allowed or approved, and reported afterwards with its result and timing.
// Without an answer from Talos the call is denied (fail closed).
//
// This command reads the flags, connects NATS and the upstreams, and runs
// an ingest/gateway over stdio or streamable HTTP; the rules and the call
// flow live there.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/sandbox"
	"github.com/talos-audit/talos/schemas"
)

// version is the gateway's MCP implementation version.
const version = "0.7.0"

type cli struct {
	NatsURL      string `name:"nats-url" default:"nats://127.0.0.1:4222" help:"NATS URL of the Talos stack."`
	NatsUser     string `name:"nats-user" help:"NATS user (default: this enforcement point's user in --nats-auth)."`
	NatsPassword string `name:"nats-password" help:"NATS password for --nats-user (prefer TALOS_NATS_PASSWORD)."`
	NatsAuth     string `name:"nats-auth" help:"talosd's NATS users file; the gateway logs in as the user of --ep-id. 'none': no credentials."`

	EPID     string   `name:"ep-id" required:"" help:"This enforcement point's id (its decisions arrive on talos.decision.<ep-id>)."`
	Upstream []string `name:"upstream" required:"" sep:"none" help:"An upstream MCP server: '<server_id>=<command> [args...]' (stdio) or '<server_id>=http(s)://...' (streamable HTTP). Repeat for several."`
	Registry string   `name:"registry" required:"" type:"path" help:"The tool registry: a manifest file or a directory of them (the bundle the workers pin)."`

	Capability string `name:"capability" type:"existingfile" help:"The agent's capability chain (JSON, from talosctl cap issue|delegate); attached to every call."`
	AgentKey   string `name:"agent-key" type:"existingfile" help:"The chain holder's key (.key): every call carries a sender signature."`
	AgentID    string `name:"agent-id" help:"actor.agent_id of calls (default: the chain's holder, else the ep id)."`
	SessionID  string `name:"session-id" help:"session_id of the stdio session (default: stdio-<uuid>, new each start)."`

	Listen     string `name:"listen" help:"Serve streamable HTTP on this address (e.g. 127.0.0.1:8931) instead of stdio; needs --principals."`
	Principals string `name:"principals" type:"existingfile" help:"HTTP callers: JSON {\"principals\":[{\"name\",\"token_sha256\",\"agent_id\",\"capability\",\"agent_key\"}]}; each sees its own tools."`

	DecisionTimeout      time.Duration `name:"decision-timeout" default:"5s" help:"How long to wait for a decision; none in time means deny."`
	ApprovalTimeout      time.Duration `name:"approval-timeout" default:"2m" help:"How long a require_approval call waits for talosctl approve|reject; then it is denied."`
	BlockNetworkOutbound bool          `name:"block-network-outbound" help:"Exfiltration guard: hide and refuse tools the registry marks network_outbound."`
	AllowNetworkTool     []string      `name:"allow-network-tool" help:"Exempt a tool ('name' or 'server_id/name') from --block-network-outbound."`
	MaxEnvelopeBytes     int           `name:"max-envelope-bytes" help:"Largest call envelope sent to Talos; larger calls are denied here (default: NATS max payload less 64 KiB)."`
	DrainTimeout         time.Duration `name:"drain-timeout" default:"10s" help:"At exit, how long to wait for post events still queued for NATS."`
	LogLevel             string        `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level (logs go to stderr; arguments and results are never logged, and what is logged is redacted like a payload)."`

	Workspace []string `name:"workspace" aliases:"sandbox-workspace" sep:"none" help:"'<server_id>=<dir>': the workspace this gateway serves for an upstream (absolute). Sent with every call to that server as the root of its path arguments (registry workspace_root \"enforcement_point\": paths outside are denied DENY_PATH_TRAVERSAL), and with --sandbox the upstream's only writable host directory. Repeat for several servers."`

	sandboxFlags

	Tools toolsFlag `name:"list-tools" help:"Print the tools the configured principal (or each of --principals) would see, then exit. Needs no NATS."`
}

// toolsFlag is a plain bool flag; named so the help reads well.
type toolsFlag bool

func main() {
	if len(os.Args) > 1 && os.Args[1] == sandbox.InitCommand {
		// Started by bwrap as a sandbox's init (ingest/sandbox).
		os.Exit(sandbox.RunInit(os.Args[2:]))
	}
	var c cli
	parser, err := kong.New(&c,
		kong.Name("talos-mcp-gateway"),
		kong.Description("The Talos enforcement point for MCP: proxy upstream MCP servers, deciding and receipting every tools/call. Every flag also reads TALOS_<FLAG> (e.g. --ep-id ↔ TALOS_EP_ID; TALOS_UPSTREAM takes one upstream)."),
		kong.DefaultEnvars("TALOS"),
		kong.UsageOnError(),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := parser.Parse(os.Args[1:]); err != nil {
		parser.Errorf("%s", err)
		os.Exit(2)
	}
	level := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}[c.LogLevel]
	red, err := redact.NewLogRedactor("gateway-log")
	if err != nil {
		fmt.Fprintln(os.Stderr, "talos-mcp-gateway:", err)
		os.Exit(1)
	}
	// What the gateway logs is redacted like a payload.
	log := slog.New(redact.NewLogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}), red))
	if err := c.run(log); err != nil {
		fmt.Fprintln(os.Stderr, "talos-mcp-gateway:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

func (c *cli) run(log *slog.Logger) error {
	if !schemas.ValidID(c.EPID) {
		return usageError{fmt.Errorf("--ep-id %q must match %s", c.EPID, schemas.IDPattern)}
	}
	reg, err := enforce.LoadRegistry(c.Registry)
	if err != nil {
		return usageError{err}
	}
	principals, err := c.principals()
	if err != nil {
		return usageError{err}
	}
	specs, err := c.upstreams()
	if err != nil {
		return usageError{err}
	}
	opts, err := c.natsOptions()
	if err != nil {
		return usageError{err}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	workspaces, err := c.workspaces(reg, specs, log)
	if err != nil {
		return usageError{err}
	}
	sandboxes, err := c.sandboxes(ctx, reg, specs, workspaces, log)
	if err != nil {
		return err
	}
	defer closeSandboxes(sandboxes) // after the upstreams' deferred closes
	ups, err := gateway.ConnectUpstreams(ctx, specs, &mcp.Implementation{Name: "talos-mcp-gateway", Version: version}, log)
	if err != nil {
		return err
	}
	owned := true // the upstreams are closed here until a Gateway owns them
	defer func() {
		if owned {
			gateway.CloseUpstreams(ups)
		}
	}()
	discovery := enforce.Discovery{Registry: reg, BlockNetwork: c.BlockNetworkOutbound, AllowNetwork: c.AllowNetworkTool}
	if c.Tools {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(gateway.Report(discovery, principals, ups))
	}

	nc, err := nats.Connect(c.NatsURL, opts...)
	if err != nil {
		return fmt.Errorf("NATS %s: %w", natsauth.Redact(c.NatsURL), err)
	}
	defer nc.Close()
	if !nc.IsConnected() {
		log.Warn("NATS not reachable yet; every call is denied until it is", "url", natsauth.Redact(c.NatsURL))
	}

	g, err := gateway.New(gateway.Options{
		EPID: c.EPID, Registry: reg, Discovery: discovery,
		DecisionTimeout: c.DecisionTimeout, ApprovalTimeout: c.ApprovalTimeout,
		MaxEnvelopeBytes: c.MaxEnvelopeBytes, StdioSession: c.SessionID, Logger: log, Version: version,
		Workspaces: workspaces,
	}, nc, ups)
	if err != nil {
		return usageError{err}
	}
	owned = false
	g.Start(ctx)
	defer g.Close(c.DrainTimeout)
	log.Info("talos-mcp-gateway ready", "ep_id", c.EPID, "upstreams", len(ups), "tools", g.Tools(), "registry_digest", reg.Digest())
	if c.Listen != "" {
		return g.ListenHTTP(ctx, c.Listen, principals)
	}
	err = g.Server(principals[0]).Run(ctx, &mcp.StdioTransport{})
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// principals is the stdio principal (flags) or the --principals file.
func (c *cli) principals() ([]*gateway.Principal, error) {
	if c.Listen == "" {
		if c.Principals != "" {
			return nil, errors.New("--principals is for --listen (HTTP); stdio serves the one principal of --capability/--agent-key")
		}
		agent := c.AgentID
		p, err := gateway.LoadPrincipal("stdio", agent, c.Capability, c.AgentKey)
		if err != nil {
			return nil, err
		}
		if p.AgentID == "" {
			p.AgentID = c.EPID
		}
		return []*gateway.Principal{p}, nil
	}
	if c.Principals == "" {
		return nil, errors.New("--listen needs --principals (who may call, and as whom)")
	}
	if c.Capability != "" || c.AgentKey != "" {
		return nil, errors.New("with --listen, capabilities and keys are per principal, in --principals")
	}
	return gateway.LoadPrincipals(c.Principals)
}

// upstreams parses --upstream; server ids are unique.
func (c *cli) upstreams() ([]mcpup.Spec, error) {
	var specs []mcpup.Spec
	seen := map[string]bool{}
	for _, u := range c.Upstream {
		s, err := mcpup.ParseSpec(u)
		if err != nil {
			return nil, fmt.Errorf("--upstream: %w", err)
		}
		if seen[s.ServerID] {
			return nil, fmt.Errorf("--upstream: server_id %q given twice", s.ServerID)
		}
		seen[s.ServerID] = true
		specs = append(specs, s)
	}
	return specs, nil
}

// natsOptions connect as this enforcement point and keep reconnecting
// forever (calls are denied while disconnected).
func (c *cli) natsOptions() ([]nats.Option, error) {
	login := natsauth.Login{URL: c.NatsURL, User: c.NatsUser, Password: c.NatsPassword, UsersFile: c.NatsAuth}
	if c.NatsAuth == "" {
		login.UsersFile = natsauth.None
	}
	creds, err := login.Options(schemas.NATSRoleEnforcement, c.EPID)
	if err != nil {
		return nil, fmt.Errorf("--nats-auth: %w", err)
	}
	return append([]nats.Option{
		nats.Name("talos-mcp-gateway " + c.EPID),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(2 * time.Second),
	}, creds...), nil
}
