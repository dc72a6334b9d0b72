package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// DeciderOptions bounds what a Decider accepts and which checks it runs.
// Zero values mean the schemas.Limits defaults and no optional checks.
type DeciderOptions struct {
	MaxEnvelopeBytes int
	MaxDepth         int
	// Replay, if set, checks every valid phase-pre call's correlation_id
	// (REPLAY); nil means no replay checks.
	Replay *ReplayGuard
	// Capabilities, if set, authorizes every valid phase-pre call that
	// carries a capability (seed 002), per request.
	Capabilities *Authorizer
	// RequireCapability denies a phase-pre call without a capability
	// (NO_CAPABILITY). Without it such a call is decided by the registry
	// and rules alone (dev mode, tests).
	RequireCapability bool
	// Preflight configures seed 003 MUST 7 (input_schema, size, paths).
	// The input schemas come from the registry in force.
	Preflight PreflightConfig
	// Policy, if set, is the rule set (DENY_NO_MATCHING_RULE) and
	// RateLimiter applies its rate limits (DENY_RATE_LIMIT).
	Policy      *Policy
	RateLimiter *RateLimiter
	// Ledger, if set, makes idempotency keys hold across workers
	// (IDEMPOTENCY_KEY_REUSED) and matches post events to pre decisions.
	Ledger CallLedger
	// Redactor, if set, makes the Decider build a ToolCallEvent (seed 001
	// FR-EVT-007) for every call, with redacted, hashed payloads.
	Redactor Redactor
}

// Redactor replaces secrets in a JSON tree (see enforce/redact). Redact
// MUST NOT modify v; pointers in findings are prefixed with base.
type Redactor interface {
	Redact(v any, base string) (any, []schemas.Redaction, error)
}

// Decider turns one raw call message into unsigned receipt data: it parses
// the envelope (VAL-HTC-001 on any failure), runs the Engine of the current
// State, adds the incident, replay, capability and preflight checks, and
// fills every receipt field. It answers every input it can decide and is
// safe for concurrent use; it never copies argument or result values into
// the receipt, only their hashes.
//
// The current State is swapped atomically (Apply, SetState): each Decide
// reads it once, so a decision is made under exactly one control seq,
// which its receipt names (ControlSeq, RegistryDigest).
type Decider struct {
	state  atomic.Pointer[State]
	lim    schemas.Limits
	o      DeciderOptions
	replay *ReplayGuard
	pf     atomic.Pointer[preflightFor]
}

// preflightFor is the Preflight compiled for one registry.
type preflightFor struct {
	reg *Registry
	p   *Preflight
	err error
}

// Decided is one decision, ready to sign.
type Decided struct {
	Receipt schemas.Receipt
	Details []string
	// ToolCall is the call's ToolCallEvent when this envelope completes its
	// record (a malformed envelope, a denied pre, any post); nil otherwise
	// or without a Redactor. The worker sets its ReceiptID and signs it.
	ToolCall *schemas.ToolCallEvent
	// Commit, if set, MUST be called with the stored receipt's id before
	// the decision is answered; an error means the ledger could not record
	// it and the call must be retried.
	Commit func(receiptID string) error
}

// NewDecider returns a Decider whose State is the one before any control
// event, enforcing with e (its mode and registry as the bootstrap).
func NewDecider(e *Engine, o DeciderOptions) (*Decider, error) {
	if e == nil {
		return nil, errors.New("enforce: NewDecider: nil Engine")
	}
	d := &Decider{lim: schemas.Limits{MaxBytes: o.MaxEnvelopeBytes, MaxDepth: o.MaxDepth}, o: o, replay: o.Replay}
	d.state.Store(stateFor(e))
	return d, nil
}

// State is the State calls are currently decided under.
func (d *Decider) State() *State { return d.state.Load() }

// SetState makes s the State later calls are decided under (for a worker
// that rebuilt its State elsewhere). A nil s is ignored.
func (d *Decider) SetState(s *State) {
	if s != nil {
		d.state.Store(s)
	}
}

// Apply applies the control event stored at TALOS_CONTROL sequence seq to
// the current State (State.Apply) and swaps the result in; calls decided
// after Apply returns see it. It returns State.Apply's error, after
// swapping in the State it returned (an invalid command still consumes its
// seq). On an applied replay.flush it also flushes the replay guard's
// local cache for cmd.SessionID ("" = every session).
//
// Apply MUST NOT be called from more than one goroutine at a time (the
// control consumer owns it); Decide may run concurrently with it.
func (d *Decider) Apply(seq uint64, rec *schemas.ControlRecord, at time.Time) error {
	next, err := d.state.Load().Apply(seq, rec, at)
	if err == nil && d.replay != nil && rec.Command.Verb == schemas.VerbReplayFlush {
		// Flush before the swap: a call that sees this seq cannot see a
		// pair the flush removed from the local cache.
		d.replay.Flush(rec.Command.SessionID)
	}
	d.state.Store(next)
	return err
}

// Decide is DecideCall for callers that need only the receipt data and
// details (tests, tools).
func (d *Decider) Decide(subject string, raw []byte, now time.Time) (schemas.Receipt, []string, error) {
	out, err := d.DecideCall(subject, raw, now)
	if err != nil {
		return schemas.Receipt{}, nil, err
	}
	return out.Receipt, out.Details, nil
}

// DecideCall decides the call raw, received on subject
// (talos.call.<phase>.<server_id>), at now. The receipt's Chain and
// Signature are left for the signer. A valid envelope gets the incident
// codes of the State (KILL_SWITCH, SESSION_QUARANTINED, and in phase pre
// NETWORK_OUTBOUND_BLOCKED), and in phase pre the replay (REPLAY) and
// capability checks, before the Engine's codes, and
// the preflight, rule and rate checks after them; a malformed one gets
// VAL-HTC-001 only. A post event is flagged post_after_deny when its pre
// decision was not allow, unless it was require_approval and the State
// holds the call's approval. An error means there is no decision (a store
// could not answer): the caller MUST NOT answer or ack the call, so it is
// retried (fail closed).
func (d *Decider) DecideCall(subject string, raw []byte, now time.Time) (*Decided, error) {
	st := d.state.Load()
	e := st.engine
	subjPhase, subjServer := splitCallSubject(subject)
	envHash := sha256.Sum256(raw)
	r := schemas.Receipt{
		EnvelopeHash:   hex.EncodeToString(envHash[:]),
		Timestamp:      now.UTC().Format(schemas.TimeFormat),
		Mode:           string(e.Mode()),
		RegistryDigest: e.Registry().Digest(),
		ControlSeq:     st.Seq(),
		ContentHashAlg: schemas.ContentHashAlg,
		ReasonCodes:    []string{},
		DocumentHashes: []schemas.DocumentHash{},
		Phase:          subjPhase,
		ServerID:       subjServer,
	}
	pc, err := schemas.ParseToolCall(raw, d.lim)
	if err == nil {
		// The subject routes the call; it must agree with the envelope.
		if pc.Call.Phase != subjPhase || pc.Call.ServerID != subjServer {
			err = &schemas.ValidationError{Code: schemas.CodeEnvelopeInvalid,
				Details: []string{"envelope phase/server_id differ from the subject it was published on"}}
		}
	}
	if err != nil {
		o := InvalidOutcome(err)
		// Nothing in a malformed envelope is trusted; ids that match their
		// patterns are kept only to route the reply and name the record.
		r.ToolCallID, r.EPID, _ = schemas.BestEffortIDs(raw)
		fill(&r, o)
		r.EventType = kindOf(r.Phase)
		out := &Decided{Receipt: r, Details: o.Details}
		if d.o.Redactor != nil {
			out.ToolCall = malformedEvent(raw, &r, now)
		}
		return out, nil
	}
	c := &pc.Call
	pre := c.Phase == schemas.PhasePre
	var o Outcome
	if pre {
		o = e.DecidePre(pc)
	} else {
		o = e.DecidePost(pc)
	}
	var auth AuthResult
	if !slices.Contains(o.ReasonCodes, schemas.CodeEnvelopeInvalid) {
		before, bDetails := st.Check(c)
		var after, aDetails []string
		if pre {
			if d.replay != nil {
				replayed, err := d.replay.Check(c.SessionID, c.CorrelationID, c.ToolCallID)
				if err != nil {
					return nil, err
				}
				if replayed {
					before = append(before, schemas.CodeReplay)
					bDetails = append(bDetails, "correlation_id: already used in this session by another tool call")
				}
			}
			var codes, details []string
			codes, details, auth = d.authorize(st, pc, &o, now)
			before, bDetails = append(before, codes...), append(bDetails, details...)
			if after, aDetails, err = d.preflight(st, pc, now); err != nil {
				return nil, err
			}
		}
		o = merge(o, before, bDetails, after, aDetails)
	}
	r.EventType = kindOf(c.Phase)
	r.Tool = c.ToolName
	r.AgentID = c.Actor.AgentID
	r.ToolID = c.ServerID + "/" + c.ToolName
	r.ToolCallID = c.ToolCallID
	r.TraceID = c.TraceID
	r.CorrelationID = c.CorrelationID
	r.SessionID = c.SessionID
	r.EPID = c.EPID
	r.ToolName = c.ToolName
	// The Authorizer hashed the chain it verified; otherwise (post phase,
	// no authorizer, undecodable chain) hash the member here.
	r.CapabilityHash = auth.ChainHash
	if r.CapabilityHash == "" && len(c.Capability) > 0 {
		if h, err := memberHash(pc, "capability"); err == nil {
			r.CapabilityHash = h
		}
	}
	r.CapabilityIDs = auth.CapabilityIDs
	fill(&r, o)
	out := &Decided{Receipt: r, Details: o.Details}
	if pre {
		if err := d.ledgerPre(out, pc, auth, o, now); err != nil {
			return nil, err
		}
	}
	// A call that may still run (allowed, or parked for approval) is
	// recorded by its post event.
	if d.o.Redactor == nil || (pre && out.Receipt.Decision != schemas.DecisionDeny) {
		return out, nil
	}
	var prior *PreRecord
	var flags []string
	if !pre && d.o.Ledger != nil {
		rec, found, err := d.o.Ledger.LookupPre(c.ToolCallID)
		if err != nil {
			return nil, err
		}
		switch {
		case !found:
			flags = append(flags, schemas.FlagPostWithoutPre)
		case rec.Decision == schemas.DecisionAllow,
			// A responder released the parked call: it ran as approved.
			rec.Decision == schemas.DecisionRequireApproval && approved(st, c.ToolCallID):
			prior = &rec
		default:
			flags = append(flags, schemas.FlagPostAfterDeny)
			prior = &rec
		}
	}
	out.ToolCall = d.event(st, pc, &out.Receipt, prior, flags, now)
	return out, nil
}

// approved reports whether a responder approved the parked call
// toolCallID in st (rejected or unresolved: false).
func approved(st *State, toolCallID string) bool {
	verb, _, ok := st.Approval(toolCallID)
	return ok && verb == schemas.VerbApprove
}

// authorize runs the capability checks of a phase-pre call. It also
// derives the call's method (the action of an action-based tool) and
// resource (the argument at the tool's resource_pointer) from the
// registry.
func (d *Decider) authorize(st *State, pc *schemas.ParsedCall, o *Outcome, now time.Time) ([]string, []string, AuthResult) {
	c := &pc.Call
	chain, has := pc.Doc["capability"]
	if d.o.Capabilities == nil || (!has && !d.o.RequireCapability) {
		return nil, nil, AuthResult{}
	}
	req := &AuthRequest{
		ServerID: c.ServerID, ToolName: c.ToolName, Class: o.ToolClass,
		RequestHash:   c.RequestHash,
		CorrelationID: c.CorrelationID, SessionID: c.SessionID, IssuedAt: c.IssuedAt,
		SenderSignature: pc.Doc["sender_signature"],
		AgentID:         c.Actor.AgentID,
		Now:             now,
		Revoked:         st.Revoked,
	}
	if req.RequestHash == "" {
		req.RequestHash = o.RequestHash
	}
	if has {
		req.Chain = chain
	}
	if tool, ok := st.Registry().Lookup(c.ServerID, c.ToolName); ok {
		args := pc.Arguments()
		if tool.ActionPointer != "" {
			if v, found := resolvePointer(args, tool.ActionPointer); found {
				req.Method, _ = v.(string)
			}
		}
		if tool.ResourcePointer != "" {
			if v, found := resolvePointer(args, tool.ResourcePointer); found {
				req.Resource, req.HasResource = v.(string)
			}
		}
	}
	res := d.o.Capabilities.Authorize(req)
	return res.Codes, res.Details, res
}

// preflight runs seed 003 MUST 7 on a classified phase-pre call: the
// registry's input_schema, size and path rules, the policy's rules and its
// rate limits. An error means the rate store could not answer.
func (d *Decider) preflight(st *State, pc *schemas.ParsedCall, now time.Time) ([]string, []string, error) {
	c := &pc.Call
	var codes, details []string
	if d.o.Policy != nil {
		if ok, _ := d.o.Policy.Match(c.Actor.AgentID, c.ServerID, c.ToolName); !ok {
			codes = append(codes, schemas.CodeDenyNoMatchingRule)
			details = append(details, "policy: no rule allows this agent, server and tool")
		}
	}
	if tool, ok := st.Registry().Lookup(c.ServerID, c.ToolName); ok {
		pf := d.preflightOf(st.Registry())
		if pf.err != nil {
			codes = append(codes, schemas.CodeDenySchemaViolation)
			details = append(details, "registry: input schemas do not compile: "+pf.err.Error())
		} else {
			args := pc.Arguments()
			n := argsLen(pc)
			cs, ds := pf.p.Check(c.ServerID, tool, args, n)
			codes, details = append(codes, cs...), append(details, ds...)
		}
	}
	if d.o.RateLimiter != nil {
		cs, ds, err := d.o.RateLimiter.Check(c.Actor.AgentID, c.ServerID, c.ToolName, now)
		if err != nil {
			return nil, nil, err
		}
		codes, details = append(codes, cs...), append(details, ds...)
	}
	return codes, details, nil
}

// preflightOf is the Preflight of reg, compiled once per registry.
func (d *Decider) preflightOf(reg *Registry) *preflightFor {
	if cur := d.pf.Load(); cur != nil && cur.reg == reg {
		return cur
	}
	p, err := NewPreflight(reg, d.o.Preflight)
	next := &preflightFor{reg: reg, p: p, err: err}
	d.pf.Store(next)
	return next
}

// argsLen is the byte length of request.arguments as received.
func argsLen(pc *schemas.ParsedCall) int {
	if len(pc.Call.Request.Arguments) > 0 {
		return len(pc.Call.Request.Arguments)
	}
	b, err := json.Marshal(pc.Arguments())
	if err != nil {
		return 0
	}
	return len(b)
}

// ledgerPre applies idempotency to an allowed phase-pre call and arranges
// for its pre decision to be recorded once its receipt is stored. A call
// whose (agent, server, tool, idempotency_key) an earlier allowed call
// holds is denied IDEMPOTENCY_KEY_REUSED if its request differs, and is
// allowed naming that call (idempotent_of) if it is the same request. A
// denied call never takes a key.
func (d *Decider) ledgerPre(out *Decided, pc *schemas.ParsedCall, auth AuthResult, o Outcome, now time.Time) error {
	l := d.o.Ledger
	if l == nil {
		return nil
	}
	c := &pc.Call
	r := &out.Receipt
	var idemKey string
	if r.Decision == schemas.DecisionAllow && c.IdempotencyKey != "" {
		agent := auth.Holder
		if agent == "" {
			agent = c.Actor.AgentID
		}
		key := IdempotencyKey(agent, c.ServerID, c.ToolName, c.IdempotencyKey)
		held, claimed, err := l.ClaimIdempotency(key, IdemRecord{RequestHash: r.RequestHash, ToolCallID: c.ToolCallID})
		if err != nil {
			return err
		}
		switch {
		case claimed || held.ToolCallID == c.ToolCallID:
			idemKey = key
		case held.RequestHash == r.RequestHash:
			r.IdempotentOf = &schemas.IdempotentOf{ToolCallID: held.ToolCallID, ReceiptID: held.ReceiptID}
		default:
			o = merge(o, nil, nil, []string{schemas.CodeIdempotencyKeyReused},
				[]string{"idempotency_key: already used by tool call " + held.ToolCallID + " with a different request_hash"})
			fill(r, o)
			out.Details = o.Details
		}
	}
	decision, capIDs, requestHash, toolCallID := r.Decision, r.CapabilityIDs, r.RequestHash, c.ToolCallID
	at := now.UTC().Format(schemas.TimeFormat)
	out.Commit = func(receiptID string) error {
		if idemKey != "" {
			if err := l.SetIdempotencyReceipt(idemKey, IdemRecord{RequestHash: requestHash, ToolCallID: toolCallID, ReceiptID: receiptID}); err != nil {
				return err
			}
		}
		return l.RecordPre(toolCallID, PreRecord{Decision: decision, ReceiptID: receiptID, CapabilityIDs: capIDs, DecidedAt: at})
	}
	return nil
}

// merge puts before (with its details) ahead of o's codes and after
// behind them, deduplicated, and decides again over all of them (deny if
// any is neither a warning nor an approval code, else require_approval if
// any is an approval code), as the engine's own checks do.
func merge(o Outcome, before, bDetails, after, aDetails []string) Outcome {
	if len(before) == 0 && len(after) == 0 {
		return o
	}
	v := &verdict{out: o, seen: map[string]bool{}}
	v.out.ReasonCodes = make([]string, 0, len(before)+len(o.ReasonCodes)+len(after))
	v.out.Details = slices.Concat(bDetails, o.Details, aDetails)
	for _, list := range [][]string{before, o.ReasonCodes, after} {
		for _, c := range list {
			v.add(c, "")
		}
	}
	return v.finish()
}

// fill copies an Outcome into the receipt.
func fill(r *schemas.Receipt, o Outcome) {
	r.Decision = o.Decision
	if o.ReasonCodes != nil {
		r.ReasonCodes = o.ReasonCodes
	}
	r.ToolClass = o.ToolClass
	r.RequestHash = o.RequestHash
	r.ResponseHash = o.ResponseHash
	if o.DocumentHashes != nil {
		r.DocumentHashes = o.DocumentHashes
	}
	r.BatchTotalBytes = o.BatchTotalBytes
	r.Effect = o.Effect
	r.ResultCode = o.Decision
	if o.Decision != schemas.DecisionAllow && len(o.ReasonCodes) > 0 {
		r.ResultCode = o.ReasonCodes[0]
	}
}

// kindOf is the receipt kind of a phase.
func kindOf(phase string) string {
	if phase == schemas.PhasePost {
		return schemas.KindEffect
	}
	return schemas.KindDecision
}

// splitCallSubject reads talos.call.<phase>.<server_id>; unknown parts are "".
func splitCallSubject(subject string) (phase, server string) {
	rest, ok := strings.CutPrefix(subject, "talos.call.")
	if !ok {
		return schemas.PhasePre, ""
	}
	phase, server, _ = strings.Cut(rest, ".")
	if phase != schemas.PhasePost {
		phase = schemas.PhasePre
	}
	if !schemas.ValidID(server) {
		server = ""
	}
	return phase, server
}
