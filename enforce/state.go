package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// StateConfig configures the initial State. The zero value is valid: prod
// mode, an empty bootstrap registry, random UUIDv7 effect ids.
type StateConfig struct {
	Mode Mode
	// Bootstrap is the registry enforced until a registry.pin (talosd
	// --registry); nil means an empty registry.
	Bootstrap   *Registry
	NewEffectID func() string
}

// State is an immutable snapshot of enforcement state: the incident state
// (kill switches, quarantines, revocations), the registry pin and the
// resolutions of calls parked for approval, as of the TALOS_CONTROL
// sequence Seq. A worker builds it by applying every control
// event in stream order, starting from NewState; two workers that applied
// the same events hold equal States (same View, same decisions). A State
// is safe for concurrent use and never changes: Apply returns a new one.
type State struct {
	seq       uint64
	engine    *Engine   // built for the effective registry
	bootstrap *Registry // enforced while nothing is pinned
	pinned    string    // digest of the pinned bundle; "" = bootstrap
	pinnedSeq uint64

	kills   entryMap[scopeKey]
	quars   entryMap[string]   // by session id
	revoked entryMap[string]   // by capability id or agent:<id>
	bundles map[string]*bundle // by digest; copied on publish
	// approved and rejected hold the resolution of each call parked for
	// approval, by tool_call_id; a call is in at most one of them, once.
	approved, rejected entryMap[string]
}

// bundle is one published registry bundle, parsed once at publish.
type bundle struct {
	reg  *Registry
	info schemas.PublishedBundle
}

// scopeKey is a parsed kill-switch scope: {global}, {server, id},
// {tool, server_id, tool_name}, {agent, id}, {session, id}, and the
// exfiltration guard's {egress, global}, {egress, agent, id},
// {egress, session, id}. Lookups build keys without allocating.
type scopeKey struct{ kind, a, b string }

// ErrStaleSeq is returned by State.Apply for a sequence at or below the
// State's own: that event, or a later one, was already applied.
var ErrStaleSeq = errors.New("enforce: control seq already applied")

// CommandError says why State.Apply could not apply a control event. The
// event's sequence is still consumed, so every worker stays in step. Code
// is one of the schemas.Ctl* refusal codes.
type CommandError struct {
	Seq    uint64
	Verb   string
	Code   string
	Detail string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("enforce: control seq %d (%s): %s: %s", e.Seq, e.Verb, e.Code, e.Detail)
}

// NewState returns the State before any control event: Seq 0, nothing
// set, the bootstrap registry in force.
func NewState(cfg StateConfig) (*State, error) {
	e, err := New(Config{Mode: cfg.Mode, Registry: cfg.Bootstrap, NewEffectID: cfg.NewEffectID})
	if err != nil {
		return nil, err
	}
	return stateFor(e), nil
}

// stateFor is the State before any control event, enforcing with e.
func stateFor(e *Engine) *State {
	seed := maphash.MakeSeed()
	return &State{
		engine:    e,
		bootstrap: e.Registry(),
		kills:     entryMap[scopeKey]{seed: seed},
		quars:     entryMap[string]{seed: seed},
		revoked:   entryMap[string]{seed: seed},
		bundles:   map[string]*bundle{},
		approved:  entryMap[string]{seed: seed},
		rejected:  entryMap[string]{seed: seed},
	}
}

// Seq is the TALOS_CONTROL sequence of the last event applied (0: none).
func (s *State) Seq() uint64 { return s.seq }

// Engine decides calls under this State's effective registry and mode.
func (s *State) Engine() *Engine { return s.engine }

// Registry is the effective registry: the pinned bundle, or the bootstrap
// registry while nothing is pinned.
func (s *State) Registry() *Registry { return s.engine.Registry() }

// Pinned is the digest of the pinned bundle and the control seq of the
// registry.pin that pinned it; "" and 0 while nothing is pinned (the
// bootstrap registry is in force).
func (s *State) Pinned() (digest string, seq uint64) { return s.pinned, s.pinnedSeq }

// Mode is the enforcement mode (fixed at NewState).
func (s *State) Mode() Mode { return s.engine.Mode() }

// Revoked reports whether target (a capability id, or agent:<agent_id>)
// has been revoked. Revocations are permanent.
func (s *State) Revoked(target string) bool {
	_, ok := s.revoked.get(target)
	return ok
}

// Approval is how a responder resolved the call toolCallID of enforcement
// point epID, parked for approval: verb schemas.VerbApprove or
// schemas.VerbReject with its entry (actor, reason, control seq, time), or
// ok false while nobody has. A resolution recorded before approvals named
// the enforcement point (a bare tool_call_id) counts for every one.
func (s *State) Approval(epID, toolCallID string) (verb string, e schemas.StateEntry, ok bool) {
	if verb, e, ok = s.resolution(schemas.EPCallID(epID, toolCallID)); ok {
		return verb, e, ok
	}
	return s.resolution(toolCallID)
}

// resolution is the approve or reject recorded under exactly key.
func (s *State) resolution(key string) (verb string, e schemas.StateEntry, ok bool) {
	if e, ok := s.approved.get(key); ok {
		return schemas.VerbApprove, e, true
	}
	if e, ok := s.rejected.get(key); ok {
		return schemas.VerbReject, e, true
	}
	return "", schemas.StateEntry{}, false
}

// Check returns the incident codes for a call whose envelope is valid, in
// either phase: KILL_SWITCH if a kill switch is set for global, the call's
// server, its tool, its agent (when actor.agent_id is set) or its session;
// SESSION_QUARANTINED if its session is quarantined; and, in phase pre
// only, NETWORK_OUTBOUND_BLOCKED if an egress scope covers the call
// (egress:global, its agent, its session) and the registry in force marks
// its tool network_outbound (the CM-EGRESS exfiltration guard; other
// tools pass). Each detail names a scope or session and the responder's
// reason, never argument values. Both are nil when nothing applies.
func (s *State) Check(call *schemas.ToolCall) (codes, details []string) {
	if s.kills.n > 0 {
		keys := [...]scopeKey{
			{kind: schemas.ScopeGlobal},
			{kind: schemas.ScopeServer, a: call.ServerID},
			{kind: schemas.ScopeTool, a: call.ServerID, b: call.ToolName},
			{kind: schemas.ScopeAgent, a: call.Actor.AgentID},
			{kind: schemas.ScopeSession, a: call.SessionID},
		}
		for _, k := range keys {
			if k.kind == schemas.ScopeAgent && k.a == "" {
				continue
			}
			if e, ok := s.kills.get(k); ok {
				if len(codes) == 0 {
					codes = append(codes, schemas.CodeKillSwitch)
				}
				details = append(details, entryDetail("kill switch "+e.Target, e))
			}
		}
		if call.Phase == schemas.PhasePre {
			codes, details = s.checkEgress(call, codes, details)
		}
	}
	if e, ok := s.quars.get(call.SessionID); ok {
		codes = append(codes, schemas.CodeSessionQuarantined)
		details = append(details, entryDetail("session_id: quarantined", e))
	}
	return codes, details
}

// checkEgress adds NETWORK_OUTBOUND_BLOCKED, with one detail per egress
// scope covering call, when call's tool is network_outbound. The registry
// is consulted only once a scope matches.
func (s *State) checkEgress(call *schemas.ToolCall, codes, details []string) ([]string, []string) {
	keys := [...]scopeKey{
		{kind: schemas.ScopeEgress, a: schemas.ScopeGlobal},
		{kind: schemas.ScopeEgress, a: schemas.ScopeAgent, b: call.Actor.AgentID},
		{kind: schemas.ScopeEgress, a: schemas.ScopeSession, b: call.SessionID},
	}
	blocked := false
	for _, k := range keys {
		if k.a == schemas.ScopeAgent && k.b == "" {
			continue
		}
		e, ok := s.kills.get(k)
		if !ok {
			continue
		}
		if !blocked {
			t, known := s.Registry().LookupMethod(call.ServerID, call.MCPMethod, call.ToolName)
			if !known || !NetworkOutbound(t) {
				return codes, details
			}
			blocked = true
			codes = append(codes, schemas.CodeNetworkOutboundBlocked)
		}
		details = append(details, entryDetail("exfiltration guard "+e.Target+": network_outbound tools are blocked", e))
	}
	return codes, details
}

func entryDetail(what string, e schemas.StateEntry) string {
	d := fmt.Sprintf("%s (control seq %d)", what, e.Seq)
	if e.Reason != "" {
		d += ": " + e.Reason
	}
	return d
}

// Apply returns the State after the control event stored at TALOS_CONTROL
// sequence seq; s is not modified. rec MUST already be verified
// (signature, signed seq) by the caller. at is recorded in entries and
// SHOULD be the event's own time (its CloudEvent time), not the local
// clock, so that every worker records the same State.
//
// A command that is invalid for its verb (bad scope, unpublished digest,
// manifests that do not validate, a verb that does not mutate state, a
// record not accepted) changes nothing but still consumes seq: Apply then
// returns the State with only Seq advanced and a *CommandError, and every
// worker reaches the same State. Setting what is already set replaces its
// entry; clearing what is not set is a no-op. A seq at or below s.Seq()
// returns s itself and ErrStaleSeq.
//
// Cost: a registry.publish parses its manifests; every other verb copies
// only a small part of the maps it changes.
func (s *State) Apply(seq uint64, rec *schemas.ControlRecord, at time.Time) (*State, error) {
	if seq <= s.seq {
		return s, fmt.Errorf("%w: seq %d, state at %d", ErrStaleSeq, seq, s.seq)
	}
	n := *s
	n.seq = seq
	verb := ""
	if rec != nil && rec.Command != nil {
		verb = rec.Command.Verb
	}
	fail := func(code, detail string) (*State, error) {
		return &n, &CommandError{Seq: seq, Verb: verb, Code: code, Detail: detail}
	}
	switch {
	case rec == nil || rec.Command == nil:
		return fail(schemas.CtlMalformed, "control record carries no command")
	case !rec.Accepted:
		return fail(schemas.CtlInvalid, "control record was not accepted (code "+rec.Code+")")
	case rec.Verb != "" && rec.Verb != verb:
		return fail(schemas.CtlVerbMismatch, "record verb "+rec.Verb+" differs from the command's")
	}
	cmd := rec.Command
	op, code, detail := s.prepare(cmd, rec.Target)
	if code != "" {
		return fail(code, detail)
	}
	entry := schemas.StateEntry{Target: op.target, Reason: cmd.Reason, Actor: cmd.Actor, Seq: seq,
		Time: at.UTC().Format(schemas.TimeFormat)}
	switch cmd.Verb {
	case schemas.VerbKillSwitchSet:
		n.kills = n.kills.with(op.scope, entry)
	case schemas.VerbKillSwitchClear:
		n.kills = n.kills.without(op.scope)
	case schemas.VerbQuarantineSet:
		n.quars = n.quars.with(op.target, entry)
	case schemas.VerbQuarantineClear:
		n.quars = n.quars.without(op.target)
	case schemas.VerbRevoke:
		n.revoked = n.revoked.with(op.target, entry)
	case schemas.VerbRegistryPublish:
		b := &bundle{reg: op.reg, info: schemas.PublishedBundle{Digest: op.target, Servers: op.servers,
			Tools: op.tools, Seq: seq, Time: entry.Time, Actor: cmd.Actor}}
		n.bundles = maps.Clone(s.bundles)
		n.bundles[op.target] = b
	case schemas.VerbRegistryPin:
		n.pinned, n.pinnedSeq = op.target, seq
		if reg := s.bundles[op.target].reg; s.engine.Registry().Digest() != reg.Digest() {
			n.engine = &Engine{mode: s.engine.mode, reg: reg, newID: s.engine.newID}
		}
	case schemas.VerbReplayFlush:
		// The replay cache lives outside State (Decider.Apply flushes it);
		// the event only consumes its seq here.
	case schemas.VerbApprove:
		n.approved = n.approved.with(op.target, entry)
	case schemas.VerbReject:
		n.rejected = n.rejected.with(op.target, entry)
	}
	return &n, nil
}

// prepared is a command checked against a State, ready to apply.
type prepared struct {
	target  string   // scope, session id, revoked id, digest or <ep_id>:<tool_call_id>
	scope   scopeKey // kill switches
	reg     *Registry
	servers []string
	tools   int
}

// Precheck is what the control service asks before it accepts a mutating
// command: the refusal code and a detail, or "" if the command would apply
// to s. registry.pin of a digest never published is CTL_NOT_FOUND; a bad
// kill-switch scope, a quarantine without session_id, a revoke without
// target, an approve or reject whose target is neither a tool_call_id (a
// UUID) nor <ep_id>:<tool_call_id>, or a registry.publish whose manifests
// do not validate (or share a server_id, or are none) is CTL_INVALID; an
// approve or reject of a call already approved or rejected is CTL_CONFLICT
// (the first resolution stands); an unknown verb is CTL_UNKNOWN_VERB.
// Read-only verbs pass. Which call an approve or reject resolves, and
// whether it awaits approval at all, is the ledger's to say
// (AwaitsApproval).
func (s *State) Precheck(cmd *schemas.ControlCommand) (code, detail string) {
	if cmd == nil {
		return schemas.CtlMalformed, "no command"
	}
	if !schemas.MutatingVerbs[cmd.Verb] && slices.Contains(schemas.Verbs, cmd.Verb) {
		return "", ""
	}
	_, code, detail = s.prepare(cmd, "")
	return code, detail
}

// prepare validates cmd, a mutating verb, against s. recorded is the
// Target of the control record that carries it ("" before there is one).
func (s *State) prepare(cmd *schemas.ControlCommand, recorded string) (op prepared, code, detail string) {
	switch cmd.Verb {
	case schemas.VerbKillSwitchSet, schemas.VerbKillSwitchClear:
		kind, value, ok := schemas.ParseScope(cmd.Scope)
		if !ok {
			return op, schemas.CtlInvalid, fmt.Sprintf("scope %q: want global, server:<server_id>, tool:<server_id>/<tool_name>, agent:<id>, session:<id> or egress:global|agent:<id>|session:<id>", cmd.Scope)
		}
		op.target, op.scope = cmd.Scope, scopeKey{kind: kind, a: value}
		switch kind {
		case schemas.ScopeTool:
			op.scope.a, op.scope.b, _ = strings.Cut(value, "/")
		case schemas.ScopeEgress:
			op.scope.a, op.scope.b, _ = strings.Cut(value, ":")
		}
	case schemas.VerbQuarantineSet, schemas.VerbQuarantineClear:
		if cmd.SessionID == "" {
			return op, schemas.CtlInvalid, "session_id: required"
		}
		op.target = cmd.SessionID
	case schemas.VerbRevoke:
		if cmd.Target == "" || cmd.Target == schemas.ScopeAgent+":" {
			return op, schemas.CtlInvalid, "target: required (a capability id or agent:<agent_id>)"
		}
		op.target = cmd.Target
	case schemas.VerbRegistryPublish:
		if len(cmd.Manifests) == 0 {
			return op, schemas.CtlInvalid, "manifests: at least one required"
		}
		reg, err := bundleRegistry(cmd.Manifests)
		if err != nil {
			return op, schemas.CtlInvalid, err.Error()
		}
		op.target, op.reg = reg.Digest(), reg
		for i := range reg.manifests {
			op.servers = append(op.servers, reg.manifests[i].ServerID)
			op.tools += len(reg.manifests[i].Tools)
		}
	case schemas.VerbRegistryPin:
		if cmd.Digest == "" {
			return op, schemas.CtlInvalid, "digest: required"
		}
		if s.bundles[cmd.Digest] == nil {
			return op, schemas.CtlNotFound, "digest " + cmd.Digest + ": no bundle with this digest was published"
		}
		op.target = cmd.Digest
	case schemas.VerbReplayFlush:
		op.target = cmd.SessionID
	case schemas.VerbApprove, schemas.VerbReject:
		if op.target, code, detail = approvalKey(cmd.Target, recorded); code != "" {
			return op, code, detail
		}
		if code, detail = s.unresolved(op.target); code != "" {
			return op, code, detail
		}
	default:
		if slices.Contains(schemas.Verbs, cmd.Verb) {
			return op, schemas.CtlInvalid, "verb " + cmd.Verb + " does not change enforcement state"
		}
		return op, schemas.CtlUnknownVerb, fmt.Sprintf("verb %q is not a control verb", cmd.Verb)
	}
	return op, "", ""
}

const approvalTargetHelp = "target: want the tool_call_id (a UUID) of the call awaiting approval, or <ep_id>:<tool_call_id>"

// approvalKey is the key an approve or reject is recorded under: the
// record's target when it names the command's call with its enforcement
// point (the control service resolved a bare tool_call_id in the ledger),
// else the command's own target (a record from before targets named the
// enforcement point, or a Precheck, which has no record yet).
func approvalKey(target, recorded string) (key, code, detail string) {
	ep, id, ok := schemas.ParseApprovalTarget(target)
	if !ok {
		return "", schemas.CtlInvalid, approvalTargetHelp
	}
	if recorded == "" || recorded == target {
		return target, "", ""
	}
	rep, rid, ok := schemas.ParseApprovalTarget(recorded)
	if !ok || rep == "" || rid != id || (ep != "" && rep != ep) {
		return "", schemas.CtlInvalid, fmt.Sprintf("the record's target %q does not name the command's call %q", recorded, target)
	}
	return recorded, "", ""
}

// unresolved refuses (CTL_CONFLICT) an approve or reject of the call key
// names when a responder already resolved it: the first resolution stands.
func (s *State) unresolved(key string) (code, detail string) {
	ep, id, _ := schemas.ParseApprovalTarget(key)
	verb, e, done := s.resolution(id)
	if ep != "" {
		verb, e, done = s.Approval(ep, id)
	}
	if !done {
		return "", ""
	}
	past := "approved"
	if verb == schemas.VerbReject {
		past = "rejected"
	}
	return schemas.CtlConflict, fmt.Sprintf("tool call %s was already %s by %s (control seq %d)", key, past, e.Actor, e.Seq)
}

// AwaitsApproval is the control service's check, after Precheck, that an
// approve or reject names one call parked for approval, and which: the
// call ledger holds the phase-pre decision of a call with the target's
// tool_call_id, from the target's enforcement point if it names one
// (CTL_NOT_FOUND if not), from exactly one enforcement point if it does
// not (CTL_INVALID naming them if several parked a call with that id: the
// responder names one as <ep_id>:<tool_call_id>), and that decision is
// require_approval (CTL_INVALID naming the decision if not); a call
// already resolved is CTL_CONFLICT. target is the call found,
// <ep_id>:<tool_call_id>: the control service records it as the target of
// the command's receipt, and workers and enforcement points act on that
// call only. A ledger error is CTL_INTERNAL (the responder retries). Other
// verbs, and a nil ledger, pass with no target.
func (s *State) AwaitsApproval(l CallLedger, cmd *schemas.ControlCommand) (target, code, detail string) {
	if l == nil || cmd == nil || (cmd.Verb != schemas.VerbApprove && cmd.Verb != schemas.VerbReject) {
		return "", "", ""
	}
	ep, id, ok := schemas.ParseApprovalTarget(cmd.Target)
	if !ok {
		return "", schemas.CtlInvalid, approvalTargetHelp
	}
	recs, err := l.LookupApprovals(id)
	if err != nil {
		return "", schemas.CtlInternal, "the call ledger cannot answer; retry"
	}
	if ep == "" {
		eps := slices.Sorted(maps.Keys(recs))
		switch len(eps) {
		case 0:
			return "", schemas.CtlNotFound, "no call with this tool_call_id awaits approval"
		case 1:
			ep = eps[0]
		default:
			return "", schemas.CtlInvalid, fmt.Sprintf("tool call %s: enforcement points %s each parked a call with this id; name one as <ep_id>:%s", id, strings.Join(eps, ", "), id)
		}
	}
	rec, found := recs[ep]
	target = schemas.EPCallID(ep, id)
	switch {
	case !found:
		return "", schemas.CtlNotFound, "no call with this tool_call_id awaits approval"
	case rec.Decision != schemas.DecisionRequireApproval:
		return "", schemas.CtlInvalid, fmt.Sprintf("tool call %s does not await approval: its decision was %s (receipt %s)", target, rec.Decision, rec.ReceiptID)
	}
	if code, detail = s.unresolved(target); code != "" {
		return "", code, detail
	}
	return target, "", ""
}

func bundleRegistry(manifests []json.RawMessage) (*Registry, error) {
	in := make([][]byte, len(manifests))
	for i, m := range manifests {
		in[i] = m
	}
	return NewRegistry(in...)
}

// BundleDigest validates manifests as NewRegistry does and returns the
// digest the bundle would have (Registry.Digest), so a responder can pin
// what it published.
func BundleDigest(manifests []json.RawMessage) (string, error) {
	reg, err := bundleRegistry(manifests)
	if err != nil {
		return "", err
	}
	return reg.Digest(), nil
}

// View is the state for list and show replies. Entries are sorted by
// target and bundles by publish seq (then digest); slices are never nil,
// so two equal States have byte-identical Views.
func (s *State) View() schemas.IncidentView {
	v := schemas.IncidentView{
		Seq:          s.seq,
		KillSwitches: s.kills.entries(),
		Quarantines:  s.quars.entries(),
		Revocations:  s.revoked.entries(),
		Registry: schemas.RegistryView{Pinned: s.pinned, PinnedSeq: s.pinnedSeq,
			Published: make([]schemas.PublishedBundle, 0, len(s.bundles))},
	}
	for _, b := range s.bundles {
		p := b.info
		p.Servers = slices.Clone(p.Servers)
		v.Registry.Published = append(v.Registry.Published, p)
	}
	slices.SortFunc(v.Registry.Published, func(a, b schemas.PublishedBundle) int {
		if a.Seq != b.Seq {
			if a.Seq < b.Seq {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Digest, b.Digest)
	})
	return v
}

// cowShards is how many shards an entryMap splits its entries into; a write
// copies one shard, so applying N events to a map of M entries costs about
// N·M/cowShards copies rather than N·M.
const cowShards = 32

// entryMap is an immutable map of state entries whose with and without return a new map that
// shares every shard but the one they change. The zero value (with a seed)
// is empty.
type entryMap[K comparable] struct {
	seed   maphash.Seed
	shards *[cowShards]map[K]schemas.StateEntry // nil when empty
	n      int
}

func (m entryMap[K]) shard(k K) int { return int(maphash.Comparable(m.seed, k) % cowShards) }

func (m entryMap[K]) get(k K) (schemas.StateEntry, bool) {
	if m.n == 0 {
		return schemas.StateEntry{}, false
	}
	v, ok := m.shards[m.shard(k)][k]
	return v, ok
}

func (m entryMap[K]) with(k K, v schemas.StateEntry) entryMap[K] {
	i := m.shard(k)
	var shards [cowShards]map[K]schemas.StateEntry
	if m.shards != nil {
		shards = *m.shards
	}
	sh := make(map[K]schemas.StateEntry, len(shards[i])+1)
	maps.Copy(sh, shards[i])
	if _, had := sh[k]; !had {
		m.n++
	}
	sh[k] = v
	shards[i] = sh
	m.shards = &shards
	return m
}

func (m entryMap[K]) without(k K) entryMap[K] {
	if _, ok := m.get(k); !ok {
		return m
	}
	i := m.shard(k)
	shards := *m.shards
	sh := maps.Clone(shards[i])
	delete(sh, k)
	shards[i] = sh
	m.shards = &shards
	m.n--
	return m
}

// entries lists the values sorted by Target; never nil.
func (m entryMap[K]) entries() []schemas.StateEntry {
	out := make([]schemas.StateEntry, 0, m.n)
	if m.shards != nil {
		for _, sh := range m.shards {
			for _, v := range sh {
				out = append(out, v)
			}
		}
	}
	slices.SortFunc(out, func(a, b schemas.StateEntry) int { return strings.Compare(a.Target, b.Target) })
	return out
}
