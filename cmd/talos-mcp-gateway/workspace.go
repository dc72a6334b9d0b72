package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
)

// workspaces reads --workspace: one directory per server, the workspace
// the gateway serves for it. It is the sandbox's writable directory (CSP
// MUST 8) and the root the gateway sends in every call envelope to that
// server, which preflight confines path arguments to for registry tools
// whose workspace_root is "enforcement_point" (CSP MUST 7, VAL-03). A
// directory must be absolute; one that differs from an explicit
// workspace_root of the server's registry entries is refused, since the
// worker would deny every call with paths. A server whose registry defers
// to the gateway but that has no --workspace is logged: its calls with
// path arguments are denied (fail closed).
func (c *cli) workspaces(reg *enforce.Registry, specs []mcpup.Spec, log *slog.Logger) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range c.Workspace {
		id, dir, ok := strings.Cut(v, "=")
		if !ok || dir == "" {
			return nil, fmt.Errorf("--workspace %q: want <server_id>=<dir>", v)
		}
		if !upstreamNamed(specs, id) {
			return nil, fmt.Errorf("--workspace: %q is not an --upstream", id)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("--workspace: server %q has more than one", id)
		}
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("--workspace %s=%s: not an absolute path", id, dir)
		}
		out[id] = filepath.Clean(dir)
	}
	for _, s := range specs {
		deferred, explicit := registryRoots(reg, s.ServerID)
		dir, have := out[s.ServerID]
		for r := range explicit {
			if have && filepath.Clean(r) != dir {
				return nil, fmt.Errorf("--workspace %s=%s: the registry's workspace_root for %s is %s", s.ServerID, dir, s.ServerID, r)
			}
		}
		if deferred && !have {
			log.Warn("the registry takes this server's workspace root from the gateway, but it has no --workspace: its calls with path arguments are denied",
				"server_id", s.ServerID, "fix", "--workspace "+s.ServerID+"=<dir>")
		}
	}
	return out, nil
}

// upstreamNamed reports whether specs has a server id.
func upstreamNamed(specs []mcpup.Spec, id string) bool {
	for _, s := range specs {
		if s.ServerID == id {
			return true
		}
	}
	return false
}

// registryRoots says whether any registry entry of serverID takes its
// workspace root from the enforcement point, and which explicit roots its
// entries declare.
func registryRoots(reg *enforce.Registry, serverID string) (deferred bool, explicit map[string]bool) {
	explicit = map[string]bool{}
	for _, m := range reg.Manifests() {
		if m.ServerID != serverID {
			continue
		}
		for i := range m.Tools {
			switch r := m.Tools[i].WorkspaceRoot; r {
			case "":
			case schemas.WorkspaceFromEnforcementPoint:
				deferred = true
			default:
				explicit[r] = true
			}
		}
	}
	return deferred, explicit
}
