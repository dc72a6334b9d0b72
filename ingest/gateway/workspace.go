package gateway

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
)

// workspaceFlag is --workspace: one absolute directory per upstream.
var workspaceFlag = ServerFlag{Name: "workspace", Value: "dir", Unique: true, Check: func(id, dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("--workspace %s=%s: not an absolute path", id, dir)
	}
	return nil
}}

// Workspaces reads the gateway's --workspace values ('<server_id>=<dir>'):
// one directory per upstream, the workspace the gateway serves for it
// (Options.Workspaces). It is the sandbox's writable directory (CSP MUST
// 8) and the root sent in every call envelope to that server, which
// preflight confines path arguments to for registry tools whose
// workspace_root is "enforcement_point" (CSP MUST 7, VAL-03). A directory
// must be absolute (it is cleaned); one that differs from an explicit
// workspace_root of the server's registry entries is refused, since the
// worker would deny every call with paths. A server whose registry defers
// to the gateway but that has no directory is logged: its calls with path
// arguments are denied (fail closed).
func Workspaces(vals []string, specs []mcpup.Spec, reg *enforce.Registry, log *slog.Logger) (map[string]string, error) {
	given, err := workspaceFlag.Parse(vals, specs)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(given))
	for id, dirs := range given {
		out[id] = filepath.Clean(dirs[0])
	}
	for _, s := range specs {
		deferred, explicit := reg.WorkspaceRoots(s.ServerID)
		dir, have := out[s.ServerID]
		for _, r := range explicit {
			if have && filepath.Clean(r) != dir {
				return nil, fmt.Errorf("--workspace %s=%s: the registry's workspace_root for %s is %s", s.ServerID, dir, s.ServerID, r)
			}
		}
		if deferred && !have && log != nil {
			log.Warn("the registry takes this server's workspace root from the gateway, but it has no --workspace: its calls with path arguments are denied",
				"server_id", s.ServerID, "fix", "--workspace "+s.ServerID+"=<dir>")
		}
	}
	return out, nil
}
