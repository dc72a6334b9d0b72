package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/sandbox"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// ErrUsage is wrapped by the errors of a Config that cannot be honoured as
// given (a flag's value, a file it names): the operator's to fix.
// talos-mcp-gateway exits 2 on them. The message is the underlying error's.
var ErrUsage = errors.New("gateway: bad configuration")

// usageError marks err as ErrUsage without changing its message.
type usageError struct{ err error }

func (e usageError) Error() string   { return e.err.Error() }
func (e usageError) Unwrap() []error { return []error{e.err, ErrUsage} }

// Config is the gateway as its operator describes it: talos-mcp-gateway
// fills it from its flags (the field comments name them), Prepare
// validates it and composes the parts. Zero values mean the defaults of
// Options and of the packages the parts come from.
type Config struct {
	EPID      string   // --ep-id
	Registry  string   // --registry: a manifest file or a directory of them
	Upstreams []string // --upstream: '<server_id>=<command> [args...]' or '<server_id>=<url>'
	// Credentials is the --credentials file; "": every server mode none.
	Credentials string
	NATS        natsauth.Login // --nats-url, --nats-user, --nats-password, --nats-auth
	// TrustedKeys are --trusted-keys: talosd's public keys (.pub files or
	// directories), which approvals must be signed by; none given:
	// DefaultTrustedKeys when it exists (TrustedKeys).
	TrustedKeys []string

	// The stdio mode's one principal: --capability, --agent-key,
	// --agent-id (default: the chain's holder, else EPID), --session-id.
	Capability, AgentKey, AgentID, SessionID string
	// Principals is the --principals file of the HTTP mode's callers.
	Principals string
	HTTP       HTTPConfig

	Workspaces []string // --workspace: '<server_id>=<dir>'
	Sandbox    SandboxConfig

	BlockNetworkOutbound bool     // --block-network-outbound
	AllowNetworkTool     []string // --allow-network-tool
	RelayUngoverned      bool     // --relay-ungoverned (Options.RelayUngoverned)
	DecisionTimeout      time.Duration
	ApprovalTimeout      time.Duration
	MaxEnvelopeBytes     int
	// SpoolDir is --spool-dir, where post events and reports wait for
	// NATS on disk (Options.SpoolDir); "": DefaultSpoolDir.
	SpoolDir string
	// MetricsAddr is --metrics-addr: in the stdio mode, where /metrics
	// and /healthz are served (HOST:PORT); "": nowhere. The HTTP mode
	// serves them beside /mcp.
	MetricsAddr string

	Logger  *slog.Logger // default slog.Default()
	Version string       // the gateway's MCP implementation version
	// LookupEnv reads the gateway's environment (default os.LookupEnv).
	LookupEnv func(string) (string, bool)
}

// SandboxConfig is --sandbox and its flags (CSP MUST 8, ingest/sandbox).
type SandboxConfig struct {
	Enabled  bool     // --sandbox: every stdio upstream runs sandboxed
	ReadOnly []string // --sandbox-ro: host paths every sandbox sees read-only
	Egress   []string // --sandbox-egress: '<server_id>=<host>:<port>[@<ip>:<port>]'
	Env      []string // --sandbox-env: '<server_id>=<NAME>'
	Bwrap    string   // --sandbox-bwrap
}

// Setup is a prepared Config: everything the gateway needs before its
// upstreams and NATS are connected. Close it after the upstreams.
type Setup struct {
	Registry   *enforce.Registry
	Discovery  enforce.Discovery
	Principals []*Principal // the stdio principal, or the HTTP callers
	// HTTP is the HTTP mode's options; nil: the stdio mode.
	HTTP *HTTPOptions
	// Upstreams are the parsed --upstream specs, sandboxed with --sandbox.
	Upstreams   []mcpup.Spec
	Credentials *credential.Broker
	Workspaces  map[string]string
	// NATS are the options that connect as this enforcement point and
	// keep reconnecting forever (calls are denied while disconnected).
	NATS []nats.Option
	// SpoolDir is the outboxes' spool: --spool-dir, else DefaultSpoolDir.
	SpoolDir string
	// TrustedKeys verify approve and reject events; empty: none is applied.
	TrustedKeys verify.KeySet
	// Tracing is the OpenTelemetry provider of the OTEL_* environment
	// (tracing.Setup; off unless it names an exporter).
	Tracing *tracing.Provider

	cfg       Config
	sandboxes sandbox.Set
}

// Prepare validates c and composes its parts, in this order: the ep id,
// the registry, the principals, the HTTP mode (NewHTTPOptions), the
// upstreams, the credentials (credential.LoadBroker; no secret may be a
// principal's static token), the NATS login, the spool directory
// (DefaultSpoolDir when none is given), the trusted keys (TrustedKeys),
// the workspaces (Workspaces) and, with c.Sandbox.Enabled, a sandbox per
// stdio upstream (sandbox.ForUpstreams; ctx bounds its trial runs). The
// first error stops it; a configuration error wraps ErrUsage, a sandbox
// that cannot be set up does not.
func Prepare(ctx context.Context, c Config) (*Setup, error) {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LookupEnv == nil {
		c.LookupEnv = os.LookupEnv
	}
	s := &Setup{cfg: c}
	if err := s.configure(); err != nil {
		return nil, usageError{err}
	}
	var err error
	if s.Tracing, err = tracing.Setup(ctx, "talos-mcp-gateway", c.Version, nil); err != nil {
		return nil, err
	}
	if s.sandboxes, err = s.sandbox(ctx); err != nil {
		if errors.Is(err, sandbox.ErrConfig) {
			err = usageError{err}
		}
		return nil, err
	}
	return s, nil
}

// configure is Prepare up to the sandboxes; every error is a usage error.
func (s *Setup) configure() error {
	c := &s.cfg
	if !schemas.ValidID(c.EPID) {
		return fmt.Errorf("--ep-id %q must match %s", c.EPID, schemas.IDPattern)
	}
	var err error
	if s.Registry, err = enforce.LoadRegistry(c.Registry); err != nil {
		return err
	}
	s.Discovery = enforce.Discovery{Registry: s.Registry, BlockNetwork: c.BlockNetworkOutbound, AllowNetwork: c.AllowNetworkTool}
	if s.Principals, err = c.principals(); err != nil {
		return err
	}
	if s.HTTP, err = NewHTTPOptions(c.HTTP, s.Principals, c.Logger); err != nil {
		return err
	}
	if c.MetricsAddr != "" {
		if c.HTTP.Listen != "" {
			return errors.New("--metrics-addr is for the stdio mode: with --listen, /metrics and /healthz are served beside /mcp")
		}
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr %q: %w", c.MetricsAddr, err)
		}
	}
	if s.Upstreams, err = mcpup.ParseSpecs(c.Upstreams); err != nil {
		return fmt.Errorf("--upstream: %w", err)
	}
	ups := make([]credential.Upstream, len(s.Upstreams))
	for i, u := range s.Upstreams {
		ups[i] = credential.Upstream{ServerID: u.ServerID, URL: u.URL}
	}
	if s.Credentials, err = credential.LoadBroker(c.Credentials, ups, c.LookupEnv, credential.Options{}); err != nil {
		return err
	}
	if err := refuseStaticSecrets(s.Principals, s.Credentials); err != nil {
		return fmt.Errorf("--credentials %s: %w", c.Credentials, err)
	}
	if s.NATS, err = natsOptions(c.NATS, c.EPID, c.Logger); err != nil {
		return err
	}
	if s.SpoolDir = c.SpoolDir; s.SpoolDir == "" {
		if s.SpoolDir, err = DefaultSpoolDir(c.EPID, c.LookupEnv); err != nil {
			return err
		}
	}
	if s.TrustedKeys, err = TrustedKeys(c.TrustedKeys, c.NATS.UsersFile, c.Logger); err != nil {
		return err
	}
	s.Workspaces, err = Workspaces(c.Workspaces, s.Upstreams, s.Registry, c.Logger)
	return err
}

// principals is the stdio principal (EPID its default agent id), or the
// HTTP callers of the principals file.
func (c *Config) principals() ([]*Principal, error) {
	if c.HTTP.Listen == "" {
		if c.Principals != "" {
			return nil, errors.New("--principals is for --listen (HTTP); stdio serves the one principal of --capability/--agent-key")
		}
		p, err := LoadPrincipal("stdio", c.AgentID, c.Capability, c.AgentKey)
		if err != nil {
			return nil, err
		}
		if p.AgentID == "" {
			p.AgentID = c.EPID
		}
		return []*Principal{p}, nil
	}
	if c.Principals == "" {
		return nil, errors.New("--listen needs --principals (who may call, and as whom)")
	}
	if c.Capability != "" || c.AgentKey != "" {
		return nil, errors.New("with --listen, capabilities and keys are per principal, in --principals")
	}
	return LoadPrincipals(c.Principals)
}

// DefaultSpoolDir is the spool of enforcement point epID when
// --spool-dir is not given: $XDG_STATE_HOME/talos-mcp-gateway/<ep_id>,
// else $HOME/.local/state/talos-mcp-gateway/<ep_id>. The user's state
// directory outlives a reboot (a temporary directory may not), and one
// per ep id keeps two gateways apart; without either variable (as an
// absolute path), --spool-dir is required.
func DefaultSpoolDir(epID string, lookupEnv func(string) (string, bool)) (string, error) {
	if d, ok := lookupEnv("XDG_STATE_HOME"); ok && filepath.IsAbs(d) {
		return filepath.Join(d, "talos-mcp-gateway", epID), nil
	}
	if d, ok := lookupEnv("HOME"); ok && filepath.IsAbs(d) {
		return filepath.Join(d, ".local", "state", "talos-mcp-gateway", epID), nil
	}
	return "", errors.New("--spool-dir is required: neither $XDG_STATE_HOME nor $HOME names a directory for the default")
}

// natsOptions log in as enforcement point epID, keep reconnecting
// forever, and log why they cannot connect (natsStatus).
func natsOptions(l natsauth.Login, epID string, log *slog.Logger) ([]nats.Option, error) {
	creds, err := l.Options(schemas.NATSRoleEnforcement, epID)
	if err != nil {
		return nil, fmt.Errorf("--nats-auth: %w", err)
	}
	status := &natsStatus{log: log, url: natsauth.Redact(l.URL)}
	return append(append([]nats.Option{
		nats.Name("talos-mcp-gateway " + epID),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(2 * time.Second),
	}, status.options()...), creds...), nil
}

// sandbox is the sandboxes of --sandbox; without it, no sandbox flag may
// be given. An error that is the flags' wraps ErrUsage or
// sandbox.ErrConfig.
func (s *Setup) sandbox(ctx context.Context) (sandbox.Set, error) {
	sc, specs := s.cfg.Sandbox, s.Upstreams
	if !sc.Enabled {
		if len(sc.ReadOnly)+len(sc.Egress)+len(sc.Env) > 0 {
			return nil, usageError{errors.New("the --sandbox-* flags need --sandbox")}
		}
		return nil, nil
	}
	egress, err := ServerFlag{Name: "sandbox-egress", StdioOnly: true}.Parse(sc.Egress, specs)
	if err != nil {
		return nil, usageError{err}
	}
	env, err := ServerFlag{Name: "sandbox-env", StdioOnly: true}.Parse(sc.Env, specs)
	if err != nil {
		return nil, usageError{err}
	}
	return sandbox.ForUpstreams(ctx, specs, s.Registry, sandbox.Upstreams{Workspaces: s.Workspaces, ReadOnly: sc.ReadOnly,
		Egress: egress, Env: env, LookupEnv: s.cfg.LookupEnv, Bwrap: sc.Bwrap, Logger: s.cfg.Logger})
}

// upstreamSandboxes is how each stdio upstream runs, for its calls'
// upstream_sandbox: its sandbox's record, else (without --sandbox)
// unconfined.
func (s *Setup) upstreamSandboxes() map[string]schemas.UpstreamSandbox {
	out := s.sandboxes.Records()
	for _, sp := range s.Upstreams {
		if _, ok := out[sp.ServerID]; !ok && len(sp.Command) > 0 {
			out[sp.ServerID] = schemas.UpstreamSandbox{Network: schemas.SandboxNetworkUnconfined}
		}
	}
	return out
}

// Close stops the sandboxes and exports the spans still queued; call it
// after the upstreams are closed.
func (s *Setup) Close() {
	s.sandboxes.Close()
	s.Tracing.Close(5 * time.Second)
}

// ConnectUpstreams connects the upstreams (ConnectUpstreams) with their
// credentials, the gateway named to them as talos-mcp-gateway.
func (s *Setup) ConnectUpstreams(ctx context.Context) ([]*Upstream, error) {
	return ConnectUpstreams(ctx, s.Upstreams, &mcp.Implementation{Name: "talos-mcp-gateway", Version: s.cfg.Version}, s.cfg.Logger, s.Credentials, s.Tracing)
}

// New is the Gateway of the setup over connected upstreams and NATS
// (New); an error wraps ErrUsage.
func (s *Setup) New(nc *nats.Conn, ups []*Upstream) (*Gateway, error) {
	c := &s.cfg
	g, err := New(Options{
		EPID: c.EPID, Registry: s.Registry, Discovery: s.Discovery, UpstreamSandboxes: s.upstreamSandboxes(),
		DecisionTimeout: c.DecisionTimeout, ApprovalTimeout: c.ApprovalTimeout,
		MaxEnvelopeBytes: c.MaxEnvelopeBytes, StdioSession: c.SessionID, Logger: c.Logger, Version: c.Version,
		Credentials:     s.Credentials,
		Workspaces:      s.Workspaces,
		SpoolDir:        s.SpoolDir,
		TrustedKeys:     s.TrustedKeys,
		Tracing:         s.Tracing,
		RelayUngoverned: c.RelayUngoverned,
	}, nc, ups)
	if err != nil {
		return nil, usageError{err}
	}
	return g, nil
}

// Serve serves g until ctx ends: streamable HTTP (ListenHTTP) when the
// setup has HTTP options, else the stdio principal over stdin and stdout.
// The end of ctx is not an error.
func (s *Setup) Serve(ctx context.Context, g *Gateway) error {
	if s.HTTP != nil {
		return g.ListenHTTP(ctx, *s.HTTP)
	}
	g.stdio = true
	if s.cfg.MetricsAddr != "" {
		stop, err := g.serveOps(s.cfg.MetricsAddr)
		if err != nil {
			return err
		}
		defer stop()
	}
	err := g.Server(s.Principals[0]).Run(ctx, g.serverTransport(&mcp.StdioTransport{}))
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
