package enforce

import (
	"slices"

	"github.com/talos-audit/talos/schemas"
)

// Tool trust and exposure rules (CSP MUST 1; CM-TRUST, CM-BUILTIN,
// CM-SUBAGENT, CM-EGRESS), shared by the workers (which decide calls) and
// the enforcement points (which decide what tools/list shows). Upstream
// servers' own annotations are advisory: only the registry's metadata
// counts here.

// Trust levels and subagent access values of the registry.
const (
	TrustInternal  = "internal"
	TrustVerified  = "verified"
	TrustCommunity = "community"
	TrustUnknown   = "unknown"

	SubagentFull     = "full"
	SubagentReadOnly = "read_only"
	SubagentDenied   = "denied"
)

// RequiresApproval reports whether a call of t needs a human approval:
// the registry's requires_approval if set, else true for community and
// unknown trust. A tool without trust_level was classified by the
// operator who listed it and needs none.
func RequiresApproval(t *schemas.Tool) bool {
	if t.RequiresApproval != nil {
		return *t.RequiresApproval
	}
	return t.TrustLevel == TrustCommunity || t.TrustLevel == TrustUnknown
}

// Protected reports whether t's name may not be shadowed by another
// server: it is built_in or comes from an internal server.
func Protected(t *schemas.Tool) bool {
	return (t.BuiltIn != nil && *t.BuiltIn) || t.TrustLevel == TrustInternal
}

// NetworkOutbound reports whether t's primary purpose is an outbound
// network request (the exfiltration guard's target).
func NetworkOutbound(t *schemas.Tool) bool { return t.NetworkOutbound != nil && *t.NetworkOutbound }

// SubagentAccess is t's subagent_access, "full" when the registry does
// not say (entries written before the CM-SUBAGENT metadata keep working for
// delegated capabilities; set "denied" or "read_only" to narrow them).
func SubagentAccess(t *schemas.Tool) string {
	if t.SubagentAccess == "" {
		return SubagentFull
	}
	return t.SubagentAccess
}

// ReadOnlyActions lists the names of t's read-only actions, in registry
// order (nil for a tool that is not action-based).
func ReadOnlyActions(t *schemas.Tool) []string {
	var out []string
	for _, a := range t.Actions {
		if a.ReadOnly {
			out = append(out, a.Name)
		}
	}
	return out
}

// ShadowedBy reports whether {serverID, toolName} shadows a protected
// tool of the same name on another server, and names that server. A
// protected tool never shadows anything (two protected tools of one name
// are the operator's choice).
func (r *Registry) ShadowedBy(serverID, toolName string) (holder string, shadowed bool) {
	if t, ok := r.Lookup(serverID, toolName); ok && Protected(t) {
		return "", false
	}
	for _, s := range r.protected[toolName] {
		if s != serverID {
			return s, true
		}
	}
	return "", false
}

// ActionAllowed reports whether a caller limited to read-only actions may
// call action of t (always true for a tool that is not action-based; a
// tool's own class is checked by the engine).
func ActionAllowed(t *schemas.Tool, action string, readOnlyOnly bool) bool {
	if !readOnlyOnly || t.ActionPointer == "" {
		return true
	}
	return slices.Contains(ReadOnlyActions(t), action)
}

// ServerNetworkOutbound reports whether the registry marks any tool or
// resource of serverID network_outbound (CM-EGRESS): the server may need a network,
// which a sandbox grants only through its egress allowlist.
func (r *Registry) ServerNetworkOutbound(serverID string) bool {
	for i := range r.manifests {
		m := &r.manifests[i]
		if m.ServerID != serverID {
			continue
		}
		for j := range m.Tools {
			if NetworkOutbound(&m.Tools[j]) {
				return true
			}
		}
		for j := range m.Resources {
			if n := m.Resources[j].NetworkOutbound; n != nil && *n {
				return true
			}
		}
	}
	return false
}

// WorkspaceRoots says how the registry roots serverID's path arguments:
// deferred when any of its tools takes the root from the enforcement point
// (schemas.WorkspaceFromEnforcementPoint), and the explicit roots its tools
// declare, as written, sorted and without repeats.
func (r *Registry) WorkspaceRoots(serverID string) (deferred bool, explicit []string) {
	for i := range r.manifests {
		m := &r.manifests[i]
		if m.ServerID != serverID {
			continue
		}
		for j := range m.Tools {
			switch root := m.Tools[j].WorkspaceRoot; root {
			case "":
			case schemas.WorkspaceFromEnforcementPoint:
				deferred = true
			default:
				explicit = append(explicit, root)
			}
		}
	}
	slices.Sort(explicit)
	return deferred, slices.Compact(explicit)
}
