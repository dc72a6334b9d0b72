package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/ingest/sandbox"
)

// sandboxFlags are the flags of --sandbox (CSP MUST 8); embedded in cli.
// The sandbox's workspace is the server's --workspace (workspace.go).
type sandboxFlags struct {
	Sandbox       bool     `name:"sandbox" help:"Run every stdio upstream under bubblewrap (bwrap): only its workspace writable, system directories read-only, nothing else of the host visible, private /tmp, no network unless the registry marks a tool of the server network_outbound, and then only to --sandbox-egress. A sandbox that cannot be set up is a startup error."`
	SandboxRO     []string `name:"sandbox-ro" sep:"none" help:"A host path every sandbox sees read-only (an upstream's installation outside /usr, e.g. its node_modules). Repeat for several."`
	SandboxEgress []string `name:"sandbox-egress" sep:"none" help:"'<server_id>=<host>:<port>': a destination a network_outbound upstream may reach through the sandbox's egress proxy. Nothing else is reachable."`
	SandboxEnv    []string `name:"sandbox-env" sep:"none" help:"'<server_id>=<NAME>': pass the gateway's environment variable NAME to the upstream (a sandboxed upstream gets no other)."`
	SandboxBwrap  string   `name:"sandbox-bwrap" default:"bwrap" help:"The bubblewrap program."`
}

// perServer splits '<server_id>=<value>' flags into values per server.
func perServer(flag string, vals []string, specs []mcpup.Spec) (map[string][]string, error) {
	out := map[string][]string{}
	for _, v := range vals {
		id, val, ok := strings.Cut(v, "=")
		if !ok || val == "" {
			return nil, fmt.Errorf("--%s %q: want <server_id>=<value>", flag, v)
		}
		known := false
		for _, s := range specs {
			known = known || (s.ServerID == id && len(s.Command) > 0)
		}
		if !known {
			return nil, fmt.Errorf("--%s: %q is not a stdio --upstream", flag, id)
		}
		out[id] = append(out[id], val)
	}
	return out, nil
}

// sandboxes prepares a sandbox for every stdio upstream and sets its
// spec's Wrap; the caller closes them after the upstreams. Without
// --sandbox it checks that no sandbox flag is given.
func (c *cli) sandboxes(ctx context.Context, reg *enforce.Registry, specs []mcpup.Spec, ws map[string]string, log *slog.Logger) ([]*sandbox.Sandbox, error) {
	if !c.Sandbox {
		if len(c.SandboxRO)+len(c.SandboxEgress)+len(c.SandboxEnv) > 0 {
			return nil, usageError{fmt.Errorf("the --sandbox-* flags need --sandbox")}
		}
		return nil, nil
	}
	egress, err := perServer("sandbox-egress", c.SandboxEgress, specs)
	if err != nil {
		return nil, usageError{err}
	}
	envs, err := perServer("sandbox-env", c.SandboxEnv, specs)
	if err != nil {
		return nil, usageError{err}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--sandbox: the gateway's own executable: %w", err)
	}
	var out []*sandbox.Sandbox
	fail := func(err error) ([]*sandbox.Sandbox, error) {
		closeSandboxes(out)
		return nil, err
	}
	for i := range specs {
		s := &specs[i]
		if len(s.Command) == 0 {
			continue // a streamable HTTP upstream runs elsewhere
		}
		workspace, network, err := serverSandboxFacts(reg, s.ServerID, ws[s.ServerID])
		if err != nil {
			return fail(usageError{err})
		}
		for _, name := range envs[s.ServerID] {
			v, ok := os.LookupEnv(name)
			if !ok {
				return fail(usageError{fmt.Errorf("--sandbox-env %s=%s: %s is not set", s.ServerID, name, name)})
			}
			s.Env = append(s.Env, name+"="+v)
		}
		sb, err := sandbox.New(ctx, sandbox.Config{
			ServerID: s.ServerID, Workspace: workspace, ReadOnly: c.SandboxRO,
			Network: network, Egress: egress[s.ServerID], Init: self, Bwrap: c.SandboxBwrap, Logger: log,
		})
		if err != nil {
			return fail(err)
		}
		if network && len(egress[s.ServerID]) == 0 {
			log.Warn("sandboxed upstream is network_outbound but has no --sandbox-egress: it has no network", "server_id", s.ServerID)
		}
		log.Info("upstream sandboxed", "server_id", s.ServerID, "workspace", workspace, "network_outbound", network, "egress", egress[s.ServerID])
		s.Wrap = sb.Wrap
		out = append(out, sb)
	}
	return out, nil
}

// serverSandboxFacts is a server's workspace (its --workspace, else the
// one explicit workspace_root its registry entries declare) and whether the
// registry marks any of its tools network_outbound (CM-EGRESS).
func serverSandboxFacts(reg *enforce.Registry, serverID, flagWS string) (string, bool, error) {
	network := false
	for _, m := range reg.Manifests() {
		if m.ServerID != serverID {
			continue
		}
		for i := range m.Tools {
			network = network || enforce.NetworkOutbound(&m.Tools[i])
		}
	}
	_, roots := registryRoots(reg, serverID)
	switch {
	case flagWS != "":
		return flagWS, network, nil
	case len(roots) == 1:
		for r := range roots {
			return r, network, nil
		}
	case len(roots) > 1:
		return "", false, fmt.Errorf("--sandbox: the registry declares several workspace_root values for server %q; choose one with --workspace %s=<dir>", serverID, serverID)
	}
	return "", false, fmt.Errorf("--sandbox: no workspace for server %q: give --workspace %s=<dir> (or an absolute workspace_root in its registry entries)", serverID, serverID)
}

// closeSandboxes stops the sandboxes' egress proxies; call it once their
// upstreams have exited.
func closeSandboxes(sbs []*sandbox.Sandbox) {
	for _, sb := range sbs {
		_ = sb.Close()
	}
}
