package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonpointer"
)

// principal is who a downstream MCP session speaks for: the agent, its
// capability chain and what that chain lets it see (seed 003 MUST 3).
type principal struct {
	name    string
	agentID string
	signer  *ingest.CallSigner // nil: calls carry no capability
	// scopes are the chain holder's effective scopes (the last
	// delegation's child_scope, else the capability's); nil means no
	// capability, so discovery is limited by the registry only.
	scopes   []enforce.Scope
	readOnly bool // some link carries constraints.read_only
	subagent bool // the chain has at least one delegation
	// tokenSHA256 is the hex sha256 of the principal's HTTP bearer token
	// (--principals); "" for the stdio principal.
	tokenSHA256 string
}

// loadPrincipal reads a capability chain and the holder's key. Both are
// optional; a key needs a chain.
func loadPrincipal(name, agentID, capFile, keyFile string) (*principal, error) {
	p := &principal{name: name, agentID: agentID}
	if capFile == "" {
		if keyFile != "" {
			return nil, fmt.Errorf("%s: an agent key needs a capability (the key signs for the chain's holder)", name)
		}
		return p, nil
	}
	raw, err := os.ReadFile(capFile)
	if err != nil {
		return nil, fmt.Errorf("%s: capability: %w", name, err)
	}
	var key *receipts.PrivateKey
	if keyFile != "" {
		if key, err = receipts.LoadPrivateKey(keyFile); err != nil {
			return nil, fmt.Errorf("%s: agent key: %w", name, err)
		}
	}
	if p.signer, err = ingest.NewCallSigner(raw, key); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var chain schemas.CapabilityChain
	if err := json.Unmarshal(raw, &chain); err != nil {
		return nil, fmt.Errorf("%s: capability: %w", name, err)
	}
	scopes := chain.Capability.Scopes
	p.readOnly = chain.Capability.Constraints != nil && chain.Capability.Constraints.ReadOnly
	for _, d := range chain.Delegations {
		scopes = d.ChildScope
		p.readOnly = p.readOnly || (d.Constraints != nil && d.Constraints.ReadOnly)
	}
	p.subagent = len(chain.Delegations) > 0
	p.scopes = []enforce.Scope{}
	for _, s := range scopes {
		sc, err := enforce.ParseScope(s)
		if err != nil {
			return nil, fmt.Errorf("%s: capability scope: %w", name, err)
		}
		p.scopes = append(p.scopes, sc)
	}
	if p.agentID == "" {
		p.agentID = p.signer.Holder()
	}
	return p, nil
}

// covers reports whether the principal's scopes allow tool on server with
// action ("" for a tool that is not action-based). Resource segments are
// not known before a call and are left to the worker.
func (p *principal) covers(server, tool, action string) bool {
	if p.scopes == nil {
		return true
	}
	for _, s := range p.scopes {
		s.HasResource = false
		if s.Covers(server, tool, action, "", false) {
			return true
		}
	}
	return false
}

// accessPolicy is the gateway-wide part of discovery: the registry and the
// exfiltration guard.
type accessPolicy struct {
	reg          *enforce.Registry
	blockNetwork bool
	allowNetwork []string // tool names or <server_id>/<tool_name> exempt from the guard
}

// view is what one principal may see of one upstream tool: either hidden,
// with the reason codes a call to it is refused with, or visible with the
// actions it may call (nil for a tool that is not action-based).
type view struct {
	hidden  bool
	codes   []string
	detail  string
	tool    *schemas.Tool
	actions []string
}

// see decides whether p sees tool name of server (seeds 003 MUST 3, 004).
// Only the registry's metadata counts; the upstream's annotations are
// advisory and never widen anything.
func (a *accessPolicy) see(p *principal, server, name string) view {
	hide := func(detail string, codes ...string) view {
		return view{hidden: true, codes: append([]string{schemas.CodeToolHidden}, codes...), detail: detail}
	}
	t, ok := a.reg.Lookup(server, name)
	if !ok {
		return hide("the registry does not classify "+server+"/"+name, schemas.CodeUnknownTool)
	}
	if holder, shadowed := a.reg.ShadowedBy(server, name); shadowed {
		return hide("shadows the protected tool of server "+holder, schemas.CodeToolShadowed)
	}
	if a.blockNetwork && enforce.NetworkOutbound(t) && !slices.Contains(a.allowNetwork, name) &&
		!slices.Contains(a.allowNetwork, server+"/"+name) {
		return hide("network_outbound tools are blocked for this session", schemas.CodeNetworkOutboundBlocked)
	}
	access := enforce.SubagentAccess(t)
	if p.subagent && access == enforce.SubagentDenied {
		return hide("subagent_access is denied", schemas.CodeSubagentDenied)
	}
	readOnly := p.readOnly || (p.subagent && access == enforce.SubagentReadOnly)
	if t.ActionPointer == "" {
		if readOnly && t.ToolClass == schemas.ClassWrite {
			return hide("a write tool, and this caller may only read", schemas.CodeToolClassMismatch)
		}
		if !p.covers(server, name, "") {
			return hide("no capability scope covers it", schemas.CodeScopeMismatch)
		}
		return view{tool: t}
	}
	var actions []string
	for _, act := range t.Actions {
		if (readOnly && !act.ReadOnly) || !p.covers(server, name, act.Name) {
			continue
		}
		actions = append(actions, act.Name)
	}
	if len(actions) == 0 {
		return hide("no action of it is open to this caller", schemas.CodeToolClassMismatch)
	}
	return view{tool: t, actions: actions}
}

// checkCall is the gateway's own refusal of a call (the worker decides
// again, independently): a hidden tool, or an action outside the visible
// ones. It returns nil when the gateway has no objection.
func (a *accessPolicy) checkCall(p *principal, server, name string, args json.RawMessage) (codes []string, detail string) {
	v := a.see(p, server, name)
	if v.hidden {
		return v.codes, v.detail
	}
	if v.actions == nil {
		return nil, ""
	}
	var doc any
	_ = json.Unmarshal(args, &doc)
	val, _ := jsonpointer.Resolve(doc, v.tool.ActionPointer)
	action, _ := val.(string)
	if !slices.Contains(v.actions, action) {
		return []string{schemas.CodeToolHidden, schemas.CodeToolClassMismatch},
			"the action at " + v.tool.ActionPointer + " is not one of " + strings.Join(v.actions, ", ")
	}
	return nil, ""
}
