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
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/ingest/jwtauth"
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

	Credentials string `name:"credentials" type:"existingfile" help:"The credential each upstream is sent (the client's own token never is): JSON {\"servers\":{\"<server_id>\":{\"mode\":\"none|secret|token_exchange\", ...}}}; secret: secret_file or secret_env (the gateway's environment), and stdio_env for a stdio upstream; token_exchange (RFC 8693, HTTP upstreams): token_endpoint, client_id, client_secret_file|client_secret_env, audience (default the server_id), resource (default its URL), scope, timeout. A server not listed is sent nothing. See the README."`

	Capability string `name:"capability" type:"existingfile" help:"The agent's capability chain (JSON, from talosctl cap issue|delegate); attached to every call."`
	AgentKey   string `name:"agent-key" type:"existingfile" help:"The chain holder's key (.key): every call carries a sender signature."`
	AgentID    string `name:"agent-id" help:"actor.agent_id of calls (default: the chain's holder, else the ep id)."`
	SessionID  string `name:"session-id" help:"session_id of the stdio session (default: stdio-<uuid>, new each start)."`

	Listen     string `name:"listen" help:"Serve streamable HTTP on this address (e.g. 0.0.0.0:8931) instead of stdio; needs --principals and --tls-cert/--tls-key (or, on a loopback address only, --insecure-plain-http)."`
	Principals string `name:"principals" type:"existingfile" help:"HTTP callers: JSON {\"principals\":[{\"name\",\"token_sha256\",\"jwt_subject\",\"jwt_principal\",\"agent_id\",\"capability\",\"agent_key\"}]}; each sees its own tools. A static token (token_sha256) is tried first; otherwise a JWT selects the principal whose jwt_principal is its talos_principal claim, or, without that claim, whose jwt_subject is its sub."`

	TLSCert           string `name:"tls-cert" type:"existingfile" help:"HTTP mode: the server certificate (chain), PEM; TLS 1.2 or later is served."`
	TLSKey            string `name:"tls-key" type:"existingfile" help:"HTTP mode: the key of --tls-cert, PEM."`
	InsecurePlainHTTP bool   `name:"insecure-plain-http" help:"HTTP mode without TLS: allowed only when --listen is a loopback address (local testing)."`

	JWTIssuer     string        `name:"jwt-issuer" help:"HTTP mode: accept JWT bearer tokens from this issuer (their iss); needs --jwt-audience and --jwks-file or --jwks-url."`
	JWTAudience   string        `name:"jwt-audience" help:"The audience (aud) a JWT must name, e.g. talos-mcp-gateway."`
	JWKSFile      string        `name:"jwks-file" type:"existingfile" help:"The issuer's public keys (a JWKS document), read again every --jwks-refresh."`
	JWKSURL       string        `name:"jwks-url" help:"The issuer's JWKS URL (https only), fetched every --jwks-refresh and cached; while no current key set is held, every JWT is refused."`
	JWTAlgorithms []string      `name:"jwt-algorithms" default:"RS256,ES256,EdDSA" help:"Signature algorithms a JWT may use (asymmetric only: RS*, PS*, ES*, EdDSA)."`
	JWTLeeway     time.Duration `name:"jwt-leeway" default:"30s" help:"Clock skew allowed on a JWT's exp, nbf and iat."`
	JWKSRefresh   time.Duration `name:"jwks-refresh" default:"5m" help:"How often the JWKS is read again (sooner after a failure, or for a key id it lacks)."`
	JWKSMaxStale  time.Duration `name:"jwks-max-stale" default:"15m" help:"How long the last JWKS read stays in use while reading it again fails; then every JWT is refused."`

	AuthRefusalRate  float64 `name:"auth-refusal-rate" default:"1" help:"Refused (unauthenticated) requests reported to Talos per second and source address; beyond it and --auth-refusal-burst they are still refused, and counted in /metrics."`
	AuthRefusalBurst int     `name:"auth-refusal-burst" default:"5" help:"Burst of refused requests reported to Talos per source address."`

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
	httpOpts, keys, err := c.httpOptions(principals, log)
	if err != nil {
		return usageError{err}
	}
	specs, err := c.upstreams()
	if err != nil {
		return usageError{err}
	}
	creds, err := c.credentials(specs)
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
	ups, err := gateway.ConnectUpstreams(ctx, specs, &mcp.Implementation{Name: "talos-mcp-gateway", Version: version}, log, creds)
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
		Credentials: creds,
		Workspaces:  workspaces,
	}, nc, ups)
	if err != nil {
		return usageError{err}
	}
	owned = false
	g.Start(ctx)
	defer g.Close(c.DrainTimeout)
	log.Info("talos-mcp-gateway ready", "ep_id", c.EPID, "upstreams", len(ups), "tools", g.Tools(), "registry_digest", reg.Digest())
	if c.Listen != "" {
		return serveHTTP(ctx, stop, g, httpOpts, keys)
	}
	err = g.Server(principals[0]).Run(ctx, &mcp.StdioTransport{})
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// serveHTTP runs the HTTP mode, and the JWKS refresher beside it when
// there is one: the refresher is owned here, stopped (stop) and waited for
// before the gateway closes.
func serveHTTP(ctx context.Context, stop context.CancelFunc, g *gateway.Gateway, o *gateway.HTTPOptions, keys *jwtauth.KeySet) error {
	if keys != nil {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); keys.Run(ctx) }()
		defer wg.Wait()
		defer stop()
	}
	return g.ListenHTTP(ctx, *o)
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

// httpOptions are the HTTP mode's TLS and JWT settings (CSP MUST 2): nil
// for stdio. A JWKS file that cannot be read is a usage error; a JWKS URL
// that cannot be fetched yet is not (its refresher keeps trying, and every
// JWT is refused meanwhile).
func (c *cli) httpOptions(principals []*gateway.Principal, log *slog.Logger) (*gateway.HTTPOptions, *jwtauth.KeySet, error) {
	jwtSet := c.JWTIssuer != "" || c.JWTAudience != "" || c.JWKSFile != "" || c.JWKSURL != ""
	if c.Listen == "" {
		if c.TLSCert != "" || c.TLSKey != "" || c.InsecurePlainHTTP || jwtSet {
			return nil, nil, errors.New("--tls-*, --insecure-plain-http, --jwt-* and --jwks-* are for --listen (HTTP)")
		}
		return nil, nil, nil
	}
	o := &gateway.HTTPOptions{Addr: c.Listen, Principals: principals, InsecurePlainHTTP: c.InsecurePlainHTTP,
		Refusals: gateway.RefusalLimits{PerSource: rate.Limit(c.AuthRefusalRate), PerSourceBurst: c.AuthRefusalBurst}}
	if c.TLSCert != "" || c.TLSKey != "" {
		var err error
		if o.TLS, err = gateway.LoadTLS(c.TLSCert, c.TLSKey); err != nil {
			return nil, nil, err
		}
	}
	if err := gateway.CheckListen(c.Listen, o.TLS != nil, c.InsecurePlainHTTP); err != nil {
		return nil, nil, err
	}
	if !jwtSet {
		for _, p := range principals {
			if p.TokenSHA256 == "" {
				return nil, nil, fmt.Errorf("principal %s is reached by JWT only, but no --jwt-issuer/--jwks-* is given", p.Name)
			}
		}
		return o, nil, nil
	}
	keys, err := jwtauth.NewKeySet(jwtauth.KeySetOptions{File: c.JWKSFile, URL: c.JWKSURL, Refresh: c.JWKSRefresh,
		MaxStale: c.JWKSMaxStale, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	if o.JWT, err = jwtauth.NewVerifier(jwtauth.Options{Issuer: c.JWTIssuer, Audience: c.JWTAudience,
		Algorithms: c.JWTAlgorithms, Leeway: c.JWTLeeway, Keys: keys}); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := keys.Refresh(ctx); err != nil {
		if c.JWKSFile != "" {
			return nil, nil, fmt.Errorf("--jwks-file: %w", err)
		}
		log.Warn("JWKS not fetched yet: every JWT is refused until it is", "url", c.JWKSURL, "err", err)
	}
	return o, keys, nil
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

// credentials is the broker of --credentials (every server mode none
// without it).
func (c *cli) credentials(specs []mcpup.Spec) (*credential.Broker, error) {
	if c.Credentials == "" {
		return credential.New(nil, credential.Options{}), nil
	}
	ups := make([]credential.Upstream, len(specs))
	for i, s := range specs {
		ups[i] = credential.Upstream{ServerID: s.ServerID, URL: s.URL}
	}
	cfg, err := credential.Load(c.Credentials, ups, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	return credential.New(cfg, credential.Options{}), nil
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
