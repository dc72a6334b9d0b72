package enforce

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Discovery at an enforcement point (CSP MUST 3; CM-SUBAGENT, CM-EGRESS,
// CM-WRAPPER): which registry-classified tools a caller's tools/list
// shows, and the enforcement point's own refusal of a call to a tool or
// action it hides.
// The worker decides every call again, independently; these rules only
// keep an agent from seeing what it could not call.

// Viewer is what discovery knows of a caller: the effective scopes of its
// capability chain and the narrowing the chain carries.
type Viewer struct {
	// Scopes are the chain holder's effective scopes (the last
	// delegation's child_scope, else the capability's); nil means no
	// capability, so discovery is limited by the registry only.
	Scopes   []Scope
	ReadOnly bool // some link carries constraints.read_only
	Subagent bool // the chain has at least one delegation
}

// ViewerOf derives the Viewer of a capability chain's holder.
func ViewerOf(chain *schemas.CapabilityChain) (Viewer, error) {
	scopes := chain.Capability.Scopes
	v := Viewer{ReadOnly: chain.Capability.Constraints != nil && chain.Capability.Constraints.ReadOnly}
	for _, d := range chain.Delegations {
		scopes = d.ChildScope
		v.ReadOnly = v.ReadOnly || (d.Constraints != nil && d.Constraints.ReadOnly)
	}
	v.Subagent = len(chain.Delegations) > 0
	v.Scopes = []Scope{}
	for _, s := range scopes {
		sc, err := ParseScope(s)
		if err != nil {
			return Viewer{}, fmt.Errorf("capability scope: %w", err)
		}
		v.Scopes = append(v.Scopes, sc)
	}
	return v, nil
}

// Covers reports whether the viewer's scopes allow tool on server with
// action ("" for a tool that is not action-based). Resource segments are
// not known before a call and are left to the worker.
func (v Viewer) Covers(server, tool, action string) bool {
	if v.Scopes == nil {
		return true
	}
	for _, s := range v.Scopes {
		s.HasResource = false
		if s.Covers(server, tool, action, "", false) {
			return true
		}
	}
	return false
}

// Discovery is the enforcement-point-wide part of discovery: the registry
// and the exfiltration guard. Set it up once; it is read-only after.
type Discovery struct {
	Registry     *Registry
	BlockNetwork bool
	AllowNetwork []string // tool names or <server_id>/<tool_name> exempt from the guard
}

// Visibility is what one viewer may see of one upstream tool: either
// hidden, with the reason codes a call to it is refused with, or visible
// with the actions it may call (nil for a tool that is not action-based).
type Visibility struct {
	Hidden  bool
	Codes   []string
	Detail  string
	Tool    *schemas.Tool
	Actions []string
}

// See decides whether v sees tool name of server. Only the registry's
// metadata counts; the upstream's annotations are advisory and never
// widen anything.
func (d *Discovery) See(v Viewer, server, name string) Visibility {
	return d.SeeMethod(v, server, "", name)
}

// SeeMethod is See for what a call of method (an envelope's mcp_method)
// names: a tool, or a prompt or resource of the registry by its name.
func (d *Discovery) SeeMethod(v Viewer, server, method, name string) Visibility {
	hide := func(detail string, codes ...string) Visibility {
		return Visibility{Hidden: true, Codes: append([]string{schemas.CodeToolHidden}, codes...), Detail: detail}
	}
	t, ok := d.Registry.LookupMethod(server, method, name)
	if !ok {
		return hide("the registry does not classify "+server+"/"+name, schemas.CodeUnknownTool)
	}
	if holder, shadowed := d.Registry.ShadowedBy(server, name); shadowed && schemas.MethodOf(method) == schemas.MethodToolsCall {
		return hide("shadows the protected tool of server "+holder, schemas.CodeToolShadowed)
	}
	if d.BlockNetwork && NetworkOutbound(t) && !slices.Contains(d.AllowNetwork, name) &&
		!slices.Contains(d.AllowNetwork, server+"/"+name) {
		return hide("network_outbound tools are blocked for this session", schemas.CodeNetworkOutboundBlocked)
	}
	access := SubagentAccess(t)
	if v.Subagent && access == SubagentDenied {
		return hide("subagent_access is denied", schemas.CodeSubagentDenied)
	}
	readOnly := v.ReadOnly || (v.Subagent && access == SubagentReadOnly)
	if t.ActionPointer == "" {
		if readOnly && t.ToolClass == schemas.ClassWrite {
			return hide("a write tool, and this caller may only read", schemas.CodeToolClassMismatch)
		}
		if !v.Covers(server, name, "") {
			return hide("no capability scope covers it", schemas.CodeScopeMismatch)
		}
		return Visibility{Tool: t}
	}
	var actions []string
	for _, act := range t.Actions {
		if (readOnly && !act.ReadOnly) || !v.Covers(server, name, act.Name) {
			continue
		}
		actions = append(actions, act.Name)
	}
	if len(actions) == 0 {
		return hide("no action of it is open to this caller", schemas.CodeToolClassMismatch)
	}
	return Visibility{Tool: t, Actions: actions}
}

// CheckCall is the enforcement point's own refusal of a call (the worker
// decides again, independently): a hidden tool, or an action outside the
// visible ones. It returns nil when discovery has no objection.
func (d *Discovery) CheckCall(v Viewer, server, name string, args json.RawMessage) (codes []string, detail string) {
	vis := d.See(v, server, name)
	if vis.Hidden {
		return vis.Codes, vis.Detail
	}
	if vis.Actions == nil {
		return nil, ""
	}
	var doc any
	_ = json.Unmarshal(args, &doc)
	val, _ := jsonkit.ResolvePointer(doc, vis.Tool.ActionPointer)
	action, _ := val.(string)
	if !slices.Contains(vis.Actions, action) {
		return []string{schemas.CodeToolHidden, schemas.CodeToolClassMismatch},
			"the action at " + vis.Tool.ActionPointer + " is not one of " + strings.Join(vis.Actions, ", ")
	}
	return nil, ""
}
