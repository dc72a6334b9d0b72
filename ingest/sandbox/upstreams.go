package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
)

// ErrConfig is wrapped by the errors ForUpstreams returns for options that
// cannot be honoured as given (a server without a workspace, a variable
// that is not set): the operator's to fix, unlike ErrSetup. The message is
// the underlying error's.
var ErrConfig = errors.New("sandbox: bad configuration")

// configError marks err as ErrConfig without changing its message.
type configError struct{ err error }

func (e configError) Error() string   { return e.err.Error() }
func (e configError) Unwrap() []error { return []error{e.err, ErrConfig} }

// Upstreams configures the sandboxes of a gateway's stdio upstreams
// (ForUpstreams). The zero value of each field means its default.
type Upstreams struct {
	// Workspaces is the workspace the gateway serves per server_id. A
	// server without one gets the one explicit workspace_root its registry
	// entries declare; with none, or several, it is an error.
	Workspaces map[string]string
	// ReadOnly are host paths every sandbox sees read-only (Config.ReadOnly).
	ReadOnly []string
	// Egress is the allowlist per server_id (Config.Egress).
	Egress map[string][]string
	// Env names, per server_id, variables of the gateway's environment the
	// server is given (a sandboxed server gets no other); each MUST be set.
	Env map[string][]string
	// LookupEnv reads the gateway's environment (default os.LookupEnv).
	LookupEnv func(string) (string, bool)
	// Init is Config.Init (default: this process's executable).
	Init string
	// Bwrap is the bubblewrap program (Config.Bwrap).
	Bwrap string
	// Logger receives what was set up, and the proxies' refusals (default:
	// discard).
	Logger *slog.Logger
}

// Set is the sandboxes of a gateway's upstreams.
type Set []*Sandbox

// Close stops the sandboxes' egress proxies; call it once their upstreams
// have exited.
func (s Set) Close() {
	for _, sb := range s {
		_ = sb.Close()
	}
}

// Records is how each sandboxed server runs (Sandbox.Record), by
// server_id; empty for an empty Set.
func (s Set) Records() map[string]schemas.UpstreamSandbox {
	out := make(map[string]schemas.UpstreamSandbox, len(s))
	for _, sb := range s {
		out[sb.cfg.ServerID] = sb.Record()
	}
	return out
}

// ForUpstreams prepares a sandbox (New) for every stdio upstream in specs,
// in order, and sets its spec's Wrap and, from o.Env, its Env; streamable
// HTTP upstreams run elsewhere and are left alone. The registry says
// whether a server may have a network (enforce.Registry.ServerNetworkOutbound)
// and supplies a workspace o.Workspaces lacks. On an error the sandboxes
// already prepared are closed; the error wraps ErrConfig or ErrSetup, or
// says the executable for Init cannot be found. The caller closes the Set
// after the upstreams.
func ForUpstreams(ctx context.Context, specs []mcpup.Spec, reg *enforce.Registry, o Upstreams) (Set, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.LookupEnv == nil {
		o.LookupEnv = os.LookupEnv
	}
	if o.Init == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("--sandbox: the gateway's own executable: %w", err)
		}
		o.Init = self
	}
	var out Set
	for i := range specs {
		s := &specs[i]
		if len(s.Command) == 0 {
			continue
		}
		sb, err := o.prepare(ctx, s, reg)
		if err != nil {
			out.Close()
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

// prepare is one stdio upstream's sandbox.
func (o *Upstreams) prepare(ctx context.Context, s *mcpup.Spec, reg *enforce.Registry) (*Sandbox, error) {
	id := s.ServerID
	workspace, err := workspaceOf(reg, id, o.Workspaces[id])
	if err != nil {
		return nil, configError{err}
	}
	network := reg.ServerNetworkOutbound(id)
	for _, name := range o.Env[id] {
		v, ok := o.LookupEnv(name)
		if !ok {
			return nil, configError{fmt.Errorf("--sandbox-env %s=%s: %s is not set", id, name, name)}
		}
		s.Env = append(s.Env, name+"="+v)
	}
	egress := o.Egress[id]
	sb, err := New(ctx, Config{ServerID: id, Workspace: workspace, ReadOnly: o.ReadOnly,
		Network: network, Egress: egress, Init: o.Init, Bwrap: o.Bwrap, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	if network && len(egress) == 0 {
		o.Logger.Warn("sandboxed upstream is network_outbound but has no --sandbox-egress: it has no network", "server_id", id)
	}
	o.Logger.Info("upstream sandboxed", "server_id", id, "workspace", workspace, "network_outbound", network, "egress", egress)
	s.Wrap = sb.Wrap
	return sb, nil
}

// workspaceOf is a server's workspace: the gateway's (given), else the one
// explicit workspace_root its registry entries declare.
func workspaceOf(reg *enforce.Registry, serverID, given string) (string, error) {
	_, roots := reg.WorkspaceRoots(serverID)
	switch {
	case given != "":
		return given, nil
	case len(roots) == 1:
		return roots[0], nil
	case len(roots) > 1:
		return "", fmt.Errorf("--sandbox: the registry declares several workspace_root values for server %q; choose one with --workspace %s=<dir>", serverID, serverID)
	}
	return "", fmt.Errorf("--sandbox: no workspace for server %q: give --workspace %s=<dir> (or an absolute workspace_root in its registry entries)", serverID, serverID)
}

// ExitIfInit makes a program that embeds the sandbox's init (its
// executable is Upstreams.Init) run it: when this process was started as
// `<exe> InitCommand ...`, it runs RunInit and exits with its status;
// otherwise it returns at once. Call it first thing in main.
func ExitIfInit() {
	if len(os.Args) > 1 && os.Args[1] == InitCommand {
		os.Exit(RunInit(os.Args[2:]))
	}
}
