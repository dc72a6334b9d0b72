// Command talos-mcp-gateway is Talos's enforcement point for MCP: it sits
// between an MCP client (Claude Desktop, an IDE, an agent) and one or more
// upstream MCP servers. tools/list shows only what the caller's registry
// entry and capability allow; every tools/call is published to Talos,
// decided by a worker (allow, deny, require_approval), forwarded only when
// allowed or approved, and reported afterwards with its result and timing.
// Without an answer from Talos the call is denied (fail closed).
//
// This command reads the flags into a gateway.Config, which ingest/gateway
// validates and composes (Prepare), connects the upstreams and NATS, and
// serves over stdio or streamable HTTP; the rules, the call flow and the
// flags' meaning live there.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/sandbox"
)

// version is the gateway's MCP implementation version.
const version = "0.7.0"

type cli struct {
	NatsURL      string `name:"nats-url" default:"nats://127.0.0.1:4222" help:"NATS URL of the Talos stack."`
	NatsUser     string `name:"nats-user" help:"NATS user (default: this enforcement point's user in --nats-auth)."`
	NatsPassword string `name:"nats-password" help:"NATS password for --nats-user (prefer TALOS_NATS_PASSWORD)."`
	NatsAuth     string `name:"nats-auth" help:"talosd's NATS users file; the gateway logs in as the user of --ep-id. Default: talos-data/nats-auth.json when it exists (like talosctl). 'none': no credentials."`
	NatsCA       string `name:"nats-ca" type:"path" help:"CA certificate (PEM) the NATS server's certificate must chain to; with it, a server without TLS is refused. Default: nats-tls/ca.pem beside --nats-auth when it exists, else the system's roots."`

	EPID     string   `name:"ep-id" required:"" help:"This enforcement point's id (its decisions arrive on talos.decision.<ep-id>.>)."`
	Upstream []string `name:"upstream" required:"" sep:"none" help:"An upstream MCP server: '<server_id>=<command> [args...]' (stdio) or '<server_id>=http(s)://...' (streamable HTTP). Repeat for several."`
	Registry string   `name:"registry" required:"" type:"path" help:"The tool registry: a manifest file or a directory of them (the bundle the workers pin)."`

	Credentials string `name:"credentials" type:"existingfile" help:"The credential each upstream is sent (the client's own token never is): JSON {\"servers\":{\"<server_id>\":{\"mode\":\"none|secret|token_exchange\", ...}}}; secret: secret_file or secret_env (the gateway's environment), and stdio_env for a stdio upstream; token_exchange (RFC 8693, HTTP upstreams): token_endpoint, client_id, client_secret_file|client_secret_env, audience (default the server_id), resource (default its URL), scope, timeout, session (what its session requests carry: client_credentials, the gateway's own token, by default, or none). A server not listed is sent nothing. See the README."`

	Capability  string `name:"capability" type:"existingfile" help:"The agent's capability chain (JSON, from talosctl cap issue|delegate); attached to every call."`
	AgentKey    string `name:"agent-key" type:"existingfile" help:"The chain holder's key (.key): every call carries a sender signature."`
	AgentID     string `name:"agent-id" help:"actor.agent_id of calls (default: the chain's holder, else the ep id)."`
	SessionID   string `name:"session-id" help:"session_id of the stdio session (default: stdio-<uuid>, new each start)."`
	MetricsAddr string `name:"metrics-addr" placeholder:"HOST:PORT" help:"Stdio mode: serve /metrics (Prometheus: stage times, tool drifts) and /healthz (200 while connected to Talos) on this address, e.g. 127.0.0.1:9466. The HTTP mode serves them beside /mcp."`

	Listen     string `name:"listen" help:"Serve streamable HTTP on this address (e.g. 0.0.0.0:8931) instead of stdio; needs --principals and --tls-cert/--tls-key (or, on a loopback address only, --insecure-plain-http)."`
	Principals string `name:"principals" type:"existingfile" help:"HTTP callers: JSON {\"principals\":[{\"name\",\"token_sha256\",\"jwt_subject\",\"jwt_principal\",\"agent_id\",\"capability\",\"agent_key\"}]}; each sees its own tools. A static token (token_sha256) is tried first; otherwise a JWT selects the principal whose jwt_principal is its talos_principal claim, or, without that claim, whose jwt_subject is its sub."`

	TLSCert           string `name:"tls-cert" type:"existingfile" help:"HTTP mode: the server certificate (chain), PEM; TLS 1.2 or later is served. A renewed pair written over --tls-cert/--tls-key is picked up without a restart."`
	TLSKey            string `name:"tls-key" type:"existingfile" help:"HTTP mode: the key of --tls-cert, PEM."`
	InsecurePlainHTTP bool   `name:"insecure-plain-http" help:"HTTP mode without TLS: allowed only when --listen is a loopback address (local testing)."`

	JWTIssuer     string        `name:"jwt-issuer" help:"HTTP mode: accept JWT bearer tokens from this issuer (their iss); needs --jwt-audience and --jwks-file or --jwks-url."`
	JWTAudience   string        `name:"jwt-audience" help:"The audience (aud) a JWT must name, e.g. talos-mcp-gateway."`
	JWKSFile      string        `name:"jwks-file" type:"existingfile" help:"The issuer's public keys (a JWKS document), read again every --jwks-refresh."`
	JWKSURL       string        `name:"jwks-url" help:"The issuer's JWKS URL (https only), fetched every --jwks-refresh and cached; while no current key set is held, every JWT is refused."`
	JWTAlgorithms []string      `name:"jwt-algorithms" default:"RS256,ES256,EdDSA" help:"Signature algorithms a JWT may use (asymmetric only: RS*, PS*, ES*, EdDSA)."`
	JWTLeeway     time.Duration `name:"jwt-leeway" default:"30s" help:"Clock skew allowed on a JWT's exp, nbf and iat."`
	JWKSRefresh   time.Duration `name:"jwks-refresh" default:"5m" help:"How often the JWKS is read again (sooner after a failure, for a key id it lacks, or as the --jwks-url response's Cache-Control max-age or no-cache says, though never within 30 s)."`
	JWKSMaxStale  time.Duration `name:"jwks-max-stale" default:"15m" help:"How long the last JWKS read stays in use while reading it again fails; then every JWT is refused."`

	AuthRefusalRate  float64 `name:"auth-refusal-rate" default:"1" help:"Refused (unauthenticated) requests reported to Talos per second and source address; beyond it and --auth-refusal-burst they are still refused, and counted in /metrics."`
	AuthRefusalBurst int     `name:"auth-refusal-burst" default:"5" help:"Burst of refused requests reported to Talos per source address."`

	DecisionTimeout      time.Duration `name:"decision-timeout" default:"5s" help:"How long to wait for a decision; none in time means deny."`
	ApprovalTimeout      time.Duration `name:"approval-timeout" default:"2m" help:"How long a require_approval call waits for talosctl approve|reject; then it is denied."`
	TrustedKeys          []string      `name:"trusted-keys" type:"path" help:"talosd's public keys (.pub files or directories): talosctl approve|reject releases a parked call only when its control event is signed by one. Default: keys/signers in talosd's data dir (the directory of --nats-auth, else ./talos-data) when it exists; with no key, parked calls are denied after --approval-timeout."`
	BlockNetworkOutbound bool          `name:"block-network-outbound" help:"Exfiltration guard: hide and refuse tools the registry marks network_outbound."`
	AllowNetworkTool     []string      `name:"allow-network-tool" help:"Exempt a tool ('name' or 'server_id/name') from --block-network-outbound."`
	RelayUngoverned      bool          `name:"relay-ungoverned" help:"Also offer the upstreams' resource subscriptions and completions, relayed WITHOUT a Talos decision or receipt (Talos does not decide them). Prompts and resources are decided like tools and offered either way. Default: neither offered."`
	MaxEnvelopeBytes     int           `name:"max-envelope-bytes" help:"Largest call envelope sent to Talos; larger calls are denied here (default: NATS max payload less 64 KiB)."`
	DrainTimeout         time.Duration `name:"drain-timeout" default:"10s" help:"At exit, how long to wait for post events still queued for NATS."`
	SpoolDir             string        `name:"spool-dir" type:"path" help:"Where post events and refusal reports wait for NATS, on disk (they hold call data: a 0700 directory, each file removed once JetStream has it) and sent first at the next start after a crash. One gateway per directory. Default: $XDG_STATE_HOME/talos-mcp-gateway/<ep-id>, else ~/.local/state/talos-mcp-gateway/<ep-id>."`
	LogLevel             string        `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level (logs go to stderr; arguments and results are never logged, and what is logged is redacted like a payload)."`

	Workspace []string `name:"workspace" aliases:"sandbox-workspace" sep:"none" help:"'<server_id>=<dir>': the workspace this gateway serves for an upstream (absolute). Sent with every call to that server as the root of its path arguments (registry workspace_root \"enforcement_point\": paths outside are denied DENY_PATH_TRAVERSAL), and with --sandbox the upstream's only writable host directory. Repeat for several servers."`

	Sandbox       bool     `name:"sandbox" help:"Run every stdio upstream under bubblewrap (bwrap): only its workspace writable, system directories read-only, nothing else of the host visible, private /tmp, no network unless the registry marks a tool of the server network_outbound, and then only to --sandbox-egress. A sandbox that cannot be set up is a startup error."`
	SandboxRO     []string `name:"sandbox-ro" sep:"none" help:"A host path every sandbox sees read-only (an upstream's installation outside /usr, e.g. its node_modules). Repeat for several."`
	SandboxEgress []string `name:"sandbox-egress" sep:"none" help:"'<server_id>=<host>:<port>[@<ip>:<port>]': a destination a network_outbound upstream may reach through the sandbox's egress proxy (at the pinned address, when given). Nothing else is reachable."`
	SandboxEnv    []string `name:"sandbox-env" sep:"none" help:"'<server_id>=<NAME>': pass the gateway's environment variable NAME to the upstream (a sandboxed upstream gets no other)."`
	SandboxBwrap  string   `name:"sandbox-bwrap" default:"bwrap" help:"The bubblewrap program."`

	Tools toolsFlag `name:"list-tools" help:"Print the tools the configured principal (or each of --principals) would see, then exit. Needs no NATS."`
}

// toolsFlag is a plain bool flag; named so the help reads well.
type toolsFlag bool

func main() {
	sandbox.ExitIfInit() // started by bwrap as a sandbox's init
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
		if errors.Is(err, gateway.ErrUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// config is the gateway's configuration from the flags.
func (c *cli) config(log *slog.Logger) gateway.Config {
	return gateway.Config{
		EPID: c.EPID, Registry: c.Registry, Upstreams: c.Upstream, Credentials: c.Credentials,
		NATS:       natsauth.Login{URL: c.NatsURL, User: c.NatsUser, Password: c.NatsPassword, UsersFile: c.NatsAuth, Default: natsauth.DevUsersFile, CA: c.NatsCA},
		Capability: c.Capability, AgentKey: c.AgentKey, AgentID: c.AgentID, SessionID: c.SessionID,
		Principals: c.Principals, TrustedKeys: c.TrustedKeys,
		HTTP: gateway.HTTPConfig{Listen: c.Listen, TLSCert: c.TLSCert, TLSKey: c.TLSKey, InsecurePlainHTTP: c.InsecurePlainHTTP,
			JWTIssuer: c.JWTIssuer, JWTAudience: c.JWTAudience, JWKSFile: c.JWKSFile, JWKSURL: c.JWKSURL,
			JWTAlgorithms: c.JWTAlgorithms, JWTLeeway: c.JWTLeeway, JWKSRefresh: c.JWKSRefresh, JWKSMaxStale: c.JWKSMaxStale,
			RefusalRate: c.AuthRefusalRate, RefusalBurst: c.AuthRefusalBurst},
		Workspaces: c.Workspace,
		Sandbox: gateway.SandboxConfig{Enabled: c.Sandbox, ReadOnly: c.SandboxRO, Egress: c.SandboxEgress,
			Env: c.SandboxEnv, Bwrap: c.SandboxBwrap},
		BlockNetworkOutbound: c.BlockNetworkOutbound, AllowNetworkTool: c.AllowNetworkTool, RelayUngoverned: c.RelayUngoverned,
		DecisionTimeout: c.DecisionTimeout, ApprovalTimeout: c.ApprovalTimeout, MaxEnvelopeBytes: c.MaxEnvelopeBytes,
		SpoolDir: c.SpoolDir, MetricsAddr: c.MetricsAddr, Logger: log, Version: version,
	}
}

func (c *cli) run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := gateway.Prepare(ctx, c.config(log))
	if err != nil {
		return err
	}
	defer s.Close() // after the upstreams' deferred closes
	ups, err := s.ConnectUpstreams(ctx)
	if err != nil {
		return err
	}
	owned := true // the upstreams are closed here until a Gateway owns them
	defer func() {
		if owned {
			gateway.CloseUpstreams(ups)
		}
	}()
	if c.Tools {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(gateway.Report(s.Discovery, s.Principals, ups))
	}

	nc, err := nats.Connect(c.NatsURL, s.NATS...)
	if err != nil {
		return fmt.Errorf("NATS %s: %w", natsauth.Redact(c.NatsURL), err)
	}
	defer nc.Close() // the NATS options log why it is not connected
	g, err := s.New(nc, ups)
	if err != nil {
		return err
	}
	owned = false
	g.Start(ctx)
	defer g.Close(c.DrainTimeout)
	// Shutdown order: serving ends, then announce, then the gateway
	// closes (its deferred Close), then NATS.
	served, stopAnnounce := context.WithCancel(ctx)
	var announcing sync.WaitGroup
	announcing.Go(func() {
		announce(served, log, g, "ep_id", c.EPID, "upstreams", len(ups), "tools", g.Tools(), "registry_digest", s.Registry.Digest(), "spool", s.SpoolDir)
	})
	defer announcing.Wait()
	defer stopAnnounce()
	return s.Serve(ctx, g)
}

// announce logs "talos-mcp-gateway ready" once g is connected to Talos
// and answers MCP requests (gateway.Gateway.Ready). Until then it has
// logged that the gateway waits for Talos, holding every request; it
// returns early when ctx ends.
func announce(ctx context.Context, log *slog.Logger, g *gateway.Gateway, attrs ...any) {
	select {
	case <-g.Ready():
	default:
		log.Warn("talos-mcp-gateway waiting for Talos: no MCP request is answered until NATS is reachable and the decisions are subscribed to", attrs...)
		select {
		case <-g.Ready():
		case <-ctx.Done():
			return
		}
	}
	log.Info("talos-mcp-gateway ready", attrs...)
}
