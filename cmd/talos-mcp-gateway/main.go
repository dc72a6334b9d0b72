// Command talos-mcp-gateway is Talos's enforcement point for MCP: it sits
// between an MCP client (Claude Desktop, an IDE, an agent) and one or more
// upstream MCP servers. tools/list shows only what the caller's registry
// entry and capability allow; every tools/call is published to Talos,
// decided by a worker (allow, deny, require_approval), forwarded only when
// allowed or approved, and reported afterwards with its result and timing.
// Without an answer from Talos the call is denied (fail closed).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/cmd/internal/mcpup"
	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/natsauth"
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

	Tools toolsFlag `name:"list-tools" help:"Print the tools the configured principal (or each of --principals) would see, then exit. Needs no NATS."`
}

// toolsFlag is a plain bool flag; named so the help reads well.
type toolsFlag bool

func main() {
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
	red, err := newLogRedactor()
	if err != nil {
		fmt.Fprintln(os.Stderr, "talos-mcp-gateway:", err)
		os.Exit(1)
	}
	// What the gateway logs is redacted like a payload (redactlog.go).
	log := slog.New(newRedactingHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}), red))
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
	var specs []mcpup.Spec
	for _, u := range c.Upstream {
		s, err := mcpup.ParseSpec(u)
		if err != nil {
			return usageError{fmt.Errorf("--upstream: %w", err)}
		}
		specs = append(specs, s)
	}
	opts, err := c.natsOptions()
	if err != nil {
		return usageError{err}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ups, err := connectUpstreams(ctx, specs, log)
	if err != nil {
		return err
	}
	access := accessPolicy{blockNetwork: c.BlockNetworkOutbound, allowNetwork: c.AllowNetworkTool}
	if c.Tools {
		return printTools(reg, access, principals, ups)
	}

	nc, err := nats.Connect(c.NatsURL, opts...)
	if err != nil {
		return fmt.Errorf("NATS %s: %w", natsauth.Redact(c.NatsURL), err)
	}
	defer nc.Close()
	if !nc.IsConnected() {
		log.Warn("NATS not reachable yet; every call is denied until it is", "url", natsauth.Redact(c.NatsURL))
	}

	g, err := New(Options{
		EPID: c.EPID, Registry: reg, Access: access,
		DecisionTimeout: c.DecisionTimeout, ApprovalTimeout: c.ApprovalTimeout,
		MaxEnvelopeBytes: c.MaxEnvelopeBytes, StdioSession: c.SessionID, Logger: log, Version: version,
	}, nc, ups)
	if err != nil {
		return usageError{err}
	}
	g.Start(ctx)
	defer g.Close(c.DrainTimeout)
	log.Info("talos-mcp-gateway ready", "ep_id", c.EPID, "upstreams", len(ups), "tools", len(g.byName), "registry_digest", reg.Digest())
	if c.Listen != "" {
		return serveHTTP(ctx, c.Listen, g, principals, log)
	}
	err = g.Server(principals[0]).Run(ctx, &mcp.StdioTransport{})
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// principals is the stdio principal (flags) or the --principals file.
func (c *cli) principals() ([]*principal, error) {
	if c.Listen == "" {
		if c.Principals != "" {
			return nil, errors.New("--principals is for --listen (HTTP); stdio serves the one principal of --capability/--agent-key")
		}
		agent := c.AgentID
		p, err := loadPrincipal("stdio", agent, c.Capability, c.AgentKey)
		if err != nil {
			return nil, err
		}
		if p.agentID == "" {
			p.agentID = c.EPID
		}
		return []*principal{p}, nil
	}
	if c.Principals == "" {
		return nil, errors.New("--listen needs --principals (who may call, and as whom)")
	}
	if c.Capability != "" || c.AgentKey != "" {
		return nil, errors.New("with --listen, capabilities and keys are per principal, in --principals")
	}
	return loadPrincipals(c.Principals)
}

// natsOptions connect as this enforcement point and keep reconnecting
// forever (calls are denied while disconnected).
func (c *cli) natsOptions() ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name("talos-mcp-gateway " + c.EPID),
		nats.CustomInboxPrefix(schemas.EPInboxPrefix(c.EPID)),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(2 * time.Second),
	}
	switch {
	case natsauth.HasUser(c.NatsURL):
	case c.NatsUser != "":
		opts = append(opts, nats.UserInfo(c.NatsUser, c.NatsPassword))
	case c.NatsAuth != "" && c.NatsAuth != "none":
		user, pass, err := authFileUser(c.NatsAuth, c.EPID)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserInfo(user, pass))
	}
	return opts, nil
}

// authFileUser finds the enforcement user of epID in talosd's users file.
func authFileUser(path, epID string) (user, password string, err error) {
	users, err := natsauth.ReadUsers(path)
	if err != nil {
		return "", "", fmt.Errorf("--nats-auth: %w", err)
	}
	u, ok := natsauth.Find(users, schemas.NATSRoleEnforcement, epID)
	if !ok {
		return "", "", fmt.Errorf("--nats-auth %s has no user for enforcement point %q: add it with talosd --nats-eps %s", path, epID, epID)
	}
	return u.User, u.Password, nil
}

// connectUpstreams starts or dials every upstream and lists its tools.
func connectUpstreams(ctx context.Context, specs []mcpup.Spec, log *slog.Logger) ([]*upstream, error) {
	seen := map[string]bool{}
	var ups []*upstream
	for _, s := range specs {
		if seen[s.ServerID] {
			return nil, usageError{fmt.Errorf("--upstream: server_id %q given twice", s.ServerID)}
		}
		seen[s.ServerID] = true
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		cs, err := mcpup.Connect(cctx, s, &mcp.Implementation{Name: "talos-mcp-gateway", Version: version})
		if err != nil {
			cancel()
			return nil, err
		}
		tools, err := mcpup.ListTools(cctx, cs)
		cancel()
		if err != nil {
			_ = cs.Close()
			return nil, fmt.Errorf("upstream %s: tools/list: %w", s.ServerID, err)
		}
		log.Info("upstream connected", "server_id", s.ServerID, "tools", len(tools))
		ups = append(ups, &upstream{spec: s, session: cs, tools: tools})
	}
	return ups, nil
}

// printTools writes, per principal, the tools it would see and why the
// others are hidden.
func printTools(reg *enforce.Registry, access accessPolicy, principals []*principal, ups []*upstream) error {
	access.reg = reg
	g := &Gateway{o: Options{Registry: reg, Access: access}, log: slog.New(slog.DiscardHandler), ups: ups, byName: map[string]upstreamTool{}}
	g.route()
	out := map[string]any{}
	for _, p := range principals {
		var visible, hidden []map[string]any
		for _, name := range sortedKeys(g.byName) {
			ut := g.byName[name]
			v := access.see(p, ut.server, name)
			if v.hidden {
				hidden = append(hidden, map[string]any{"server_id": ut.server, "tool": name, "codes": v.codes, "why": v.detail})
				continue
			}
			e := map[string]any{"server_id": ut.server, "tool": name}
			if v.actions != nil {
				e["actions"] = v.actions
			}
			visible = append(visible, e)
		}
		out[p.name] = map[string]any{"agent_id": p.agentID, "visible": visible, "hidden": hidden}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// loadPrincipals reads the --principals file; relative paths in it are
// relative to the file.
func loadPrincipals(path string) ([]*principal, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Principals []struct {
			Name        string `json:"name"`
			TokenSHA256 string `json:"token_sha256"`
			AgentID     string `json:"agent_id"`
			Capability  string `json:"capability"`
			AgentKey    string `json:"agent_key"`
		} `json:"principals"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("--principals %s: %w", path, err)
	}
	if len(f.Principals) == 0 {
		return nil, fmt.Errorf("--principals %s: no principals", path)
	}
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	var out []*principal
	names := map[string]bool{}
	for i, e := range f.Principals {
		if e.Name == "" || names[e.Name] {
			return nil, fmt.Errorf("--principals %s: entry %d: a unique name is required", path, i)
		}
		names[e.Name] = true
		tok := strings.ToLower(e.TokenSHA256)
		if len(tok) != 64 || strings.Trim(tok, "0123456789abcdef") != "" {
			return nil, fmt.Errorf("--principals %s: %s: token_sha256 must be the hex sha256 of the bearer token", path, e.Name)
		}
		p, err := loadPrincipal(e.Name, e.AgentID, rel(e.Capability), rel(e.AgentKey))
		if err != nil {
			return nil, err
		}
		if p.agentID == "" {
			p.agentID = e.Name
		}
		p.tokenSHA256 = tok
		out = append(out, p)
	}
	return out, nil
}
