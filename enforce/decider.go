package enforce

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// DeciderOptions bounds what a Decider accepts and which checks it runs.
// Zero values mean the schemas.Limits defaults and no optional checks.
type DeciderOptions struct {
	MaxEnvelopeBytes int
	MaxDepth         int
	// Capabilities, if set, authorizes every valid phase-pre call that
	// carries a capability (CP-PA1), per request.
	Capabilities *Authorizer
	// RequireCapability denies a phase-pre call without a capability
	// (NO_CAPABILITY). Without it such a call is decided by the registry
	// and rules alone (dev mode, tests).
	RequireCapability bool
	// Preflight configures CSP MUST 7 (input_schema, size, paths).
	// The input schemas come from the registry in force.
	Preflight PreflightConfig
	// Policy, if set, is the rule set (DENY_NO_MATCHING_RULE) and
	// RateLimiter applies its rate limits (DENY_RATE_LIMIT).
	Policy      *Policy
	RateLimiter *RateLimiter
	// Ledger, if set, is the call ledger shared by every worker: each
	// valid phase-pre call claims its (session_id, correlation_id) pair
	// there (REPLAY when another call holds it) together with its
	// decision, idempotency keys hold across workers
	// (IDEMPOTENCY_KEY_REUSED), and post events are matched to their pre
	// decisions. Nil means none of these checks.
	Ledger CallLedger
	// ReplayCache bounds the worker's local memory of pair owners, which
	// spares the ledger a write for a replay it already knows.
	ReplayCache ReplayCacheOptions
	// ReplayWindow is how long the Ledger remembers a pair (default
	// DefaultReplayWindow, the ledger's too). A phase-pre envelope issued
	// longer ago than that is denied REPLAY: the ledger could no longer
	// tell whether its correlation_id was used, so a captured envelope
	// cannot be played again once its pair is forgotten.
	ReplayWindow time.Duration
	// Records is how many final ledger records of pre calls the worker
	// keeps for their post events (RecordCache), which then need no
	// ledger read: 0 means DefaultRecordSlots, a negative number none.
	Records int
	// Redactor, if set, makes the Decider build a ToolCallEvent
	// (UTS FR-EVT-007) for every call, with redacted, hashed payloads.
	Redactor Redactor
}

// DefaultReplayWindow is how long a call ledger remembers a call unless
// configured otherwise, and so how old a pre envelope may be.
const DefaultReplayWindow = 24 * time.Hour

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
// A decision is made in steps so that a worker can batch what is
// expensive across calls: Begin does the local work; the caller verifies
// the sender signature it returns (Pending.Signature, Pending.Verified)
// and runs the ledger operations it asks for (Pending.Ops), then Resume
// finishes the decision or asks for more operations. DecideCall runs the
// steps for one call.
//
// The current State is swapped atomically (Apply, SetState): Begin reads
// it once, so a decision is made under exactly one control seq, which its
// receipt names (ControlSeq, RegistryDigest).
type Decider struct {
	state atomic.Pointer[State]
	lim   schemas.Limits
	o     DeciderOptions
	cache *ReplayCache // pair owners this worker has seen; nil without a ledger
	// records are the final records of pre calls this worker answered,
	// for their post events; nil without a ledger or with Records < 0.
	records *RecordCache
	pf      atomic.Pointer[preflightFor]
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
	// ReceiptID is the CloudEvent id to seal the receipt with: the id the
	// ledger records for the call (a redelivered call gets its first
	// delivery's).
	ReceiptID string
	Details   []string
	// ToolCall is the call's ToolCallEvent when this envelope completes its
	// record (a malformed envelope, a denied pre, any post); nil otherwise
	// or without a Redactor. The worker sets its ReceiptID and signs it.
	ToolCall *schemas.ToolCallEvent

	call          CallKey
	record        *PreRecord // the ledger's record of this call, as Begin or the ledger left it; nil if none is kept
	claimedBefore bool
	approv        bool       // record the decision for approve/reject if it is require_approval
	recordsGen    uint64     // the RecordCache's generation when the call began (Recorded)
	final         *PreRecord // the record once Stored's operations ran; nil before Stored
	// from is the decision's Pending, for EventFor to build the
	// ToolCallEvent of another receipt of this envelope; nil without a
	// Redactor or for a malformed envelope.
	from *Pending
}

// ClaimedBefore reports whether ReceiptID is the one an earlier delivery
// of this call (a redelivery, or another copy of the call) claimed in the
// call ledger, and when that delivery decided it (the ledger record's
// decided_at; zero if unreadable). Only then can a receipt with this id
// be in the audit stream already, stored no earlier than that: a call
// whose claim this delivery won was never sealed before, and a call
// without a claim gets a new id each delivery.
func (o *Decided) ClaimedBefore() (decidedAt time.Time, ok bool) {
	if !o.claimedBefore {
		return time.Time{}, false
	}
	if o.record != nil {
		decidedAt, _ = time.Parse(time.RFC3339Nano, o.record.DecidedAt)
	}
	return decidedAt, true
}

// EventFor returns the ToolCallEvent that agrees with the receipt the audit
// stream holds for this call, given that receipt's decision and reason
// codes. Usually that receipt is this delivery's, and the event is
// ToolCall. A redelivered call is answered with its first delivery's
// receipt, which may have been decided otherwise (a kill switch applied in
// between, a capability expired): the event is then rebuilt from the stored
// decision, so the record never contradicts its receipt, and it is nil when
// the stored decision leaves the call to be recorded by its post event (a
// pre call allowed or parked for approval).
func (o *Decided) EventFor(decision string, codes []string) *schemas.ToolCallEvent {
	if o.from == nil || (o.Receipt.Decision == decision && slices.Equal(o.Receipt.ReasonCodes, codes)) {
		return o.ToolCall
	}
	if o.Receipt.Phase == schemas.PhasePre && decision != schemas.DecisionDeny {
		return nil
	}
	r := o.Receipt
	r.Decision, r.ReasonCodes = decision, codes
	return o.from.event(&r)
}

// Stored returns the ledger operations to run once the call's receipt is
// in the audit stream and before its decision is answered, given the id
// and decision of the receipt that was stored (this delivery's, or an
// earlier delivery's the stream kept instead). They bring the ledger in
// line with the audit trail: the call's record is rewritten if it names
// another receipt or decision, and a call parked for approval is recorded
// for approve and reject. Usually there are none. Once they ran, the
// record is final (Decider.Recorded).
func (o *Decided) Stored(receiptID, decision string) []*LedgerOp {
	if o == nil || o.record == nil {
		return nil
	}
	var ops []*LedgerOp
	rec := *o.record
	if rec.ReceiptID != receiptID || rec.Decision != decision {
		rec.ReceiptID, rec.Decision = receiptID, decision
		ops = append(ops, &LedgerOp{Kind: OpUpdateCall, Call: o.call, Pre: rec})
	}
	o.final = &rec
	if o.approv && decision == schemas.DecisionRequireApproval {
		appr := rec
		appr.EPID, appr.ToolCallID = "", ""
		ops = append(ops, &LedgerOp{Kind: OpRecordApproval, Call: o.call, Pre: appr})
	}
	return ops
}

// NewDecider returns a Decider whose State is the one before any control
// event, enforcing with e (its mode and registry as the bootstrap).
func NewDecider(e *Engine, o DeciderOptions) (*Decider, error) {
	if e == nil {
		return nil, errors.New("enforce: NewDecider: nil Engine")
	}
	d := &Decider{lim: schemas.Limits{MaxBytes: o.MaxEnvelopeBytes, MaxDepth: o.MaxDepth}, o: o}
	if o.Ledger != nil {
		d.cache = NewReplayCache(o.ReplayCache)
		if o.Records >= 0 {
			d.records = NewRecordCache(cmp.Or(o.Records, DefaultRecordSlots))
		}
	}
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
// seq). On an applied replay.flush it also forgets the local replay
// cache's pairs of cmd.SessionID ("" = every session) and every record of
// the RecordCache.
//
// Apply MUST NOT be called from more than one goroutine at a time (the
// control consumer owns it); Decide may run concurrently with it.
func (d *Decider) Apply(seq uint64, rec *schemas.ControlRecord, at time.Time) error {
	next, err := d.state.Load().Apply(seq, rec, at)
	if err == nil && d.cache != nil && rec.Command.Verb == schemas.VerbReplayFlush {
		// Flush before the swap: a call that sees this seq cannot see a
		// pair the flush removed from the local cache.
		d.cache.Flush(rec.Command.SessionID)
		if d.records != nil {
			d.records.Clear()
		}
	}
	d.state.Store(next)
	return err
}

// Ledger is the call ledger of DeciderOptions (nil without one): the
// ledger operations Begin and Resume ask for run on it.
func (d *Decider) Ledger() CallLedger { return d.o.Ledger }

// ReplayCache is the local cache of pair owners (nil without a ledger).
func (d *Decider) ReplayCache() *ReplayCache { return d.cache }

// Decide is DecideCall for callers that need only the receipt data and
// details (tests, tools).
func (d *Decider) Decide(subject string, raw []byte, now time.Time) (schemas.Receipt, []string, error) {
	out, err := d.DecideCall(subject, raw, now)
	if err != nil {
		return schemas.Receipt{}, nil, err
	}
	return out.Receipt, out.Details, nil
}

// DecideCall decides one call with every step in turn (see Decider): the
// sender signature is verified alone and each ledger operation waits for
// its answer. An error means there is no decision (a store could not
// answer): the caller MUST NOT answer or ack the call, so it is retried
// (fail closed).
func (d *Decider) DecideCall(subject string, raw []byte, now time.Time) (*Decided, error) {
	p, err := d.Begin(subject, raw, now, "")
	if err != nil {
		return nil, err
	}
	if s := p.Signature(); s != nil {
		p.Verified(verify.Verify(s.Pub, s.Message, s.Sig))
	}
	for {
		if ops := p.Ops(); len(ops) > 0 {
			d.o.Ledger.Do(ops)
		}
		out, err := d.Resume(p)
		if out != nil || err != nil {
			return out, err
		}
	}
}

// Pending is a call between Begin and the end of Resume. It is used by one
// goroutine at a time.
type Pending struct {
	d         *Decider
	now       time.Time
	st        *State
	pc        *schemas.ParsedCall // nil for a malformed envelope
	cls       Classification      // of pc, under st's registry
	r         schemas.Receipt
	receiptID string
	done      *Decided // the decision, once made

	// The codes found so far, kept apart so that REPLAY and the capability
	// codes join at their place once known (see finishLocal).
	engine           Outcome
	incident, incDet []string
	after, afterDet  []string
	replay           bool
	stale            bool // issued before the replay window: treated as a replay
	auth             AuthResult
	checked          bool // engine checks passed VAL-HTC-001: the other checks ran
	o                Outcome

	sender   *verify.SigCheck
	opsReady bool
	ops      []*LedgerOp // to run before the next Resume
	claim    *LedgerOp   // OpClaimCall (pre) or OpLookupCall (post)
	idem     *LedgerOp
	idemKey  string
	stage    int
	call     CallKey
	record   *PreRecord
	// claimedBefore: an earlier delivery claimed the call's pair and named
	// the receipt id this one seals with (claimed).
	claimedBefore bool
	recordsGen    uint64
	// What a post event's ToolCallEvent says of its pre decision (finish).
	prior *PreRecord
	flags []string
}

// event builds the ToolCallEvent of this envelope for receipt r.
func (p *Pending) event(r *schemas.Receipt) *schemas.ToolCallEvent {
	return p.d.event(p.pc, &p.cls, r, p.prior, p.flags, p.now)
}

// Signature is the sender signature the call still needs verified, or nil.
// Call Verified with the outcome before Ops and Resume.
func (p *Pending) Signature() *verify.SigCheck { return p.sender }

// TraceParent is the trace context the envelope carries: its trace_id and
// parent_span_id ("" for a malformed envelope).
func (p *Pending) TraceParent() (traceID, parentSpanID string) {
	if p.pc == nil {
		return "", ""
	}
	return p.pc.Call.TraceID, p.pc.Call.ParentSpanID
}

// Verified records the outcome of verifying Signature.
func (p *Pending) Verified(ok bool) {
	if p.sender == nil {
		return
	}
	p.sender = nil
	p.auth.SenderVerified(ok)
}

// Ops are the ledger operations to run (CallLedger.Do) before the next
// Resume; none means Resume can go on at once.
func (p *Pending) Ops() []*LedgerOp {
	if !p.opsReady && p.done == nil && p.sender == nil {
		p.opsReady = true
		p.firstOps()
	}
	return p.ops
}

// Begin starts deciding the call raw, received on subject
// (talos.call.<phase>.<ep_id>.<server_id>), at now: it parses the envelope
// and runs every check that needs no shared store but the rate limiter.
// receiptID is the id the call's receipt will be sealed with unless the
// ledger holds another for the call ("" picks a new UUIDv7). A valid
// envelope gets the incident codes of the State (KILL_SWITCH, SESSION_QUARANTINED, and in
// phase pre NETWORK_OUTBOUND_BLOCKED), and in phase pre the replay
// (REPLAY) and capability checks, before the Engine's codes, and the
// preflight, rule and rate checks after them; a malformed one gets
// VAL-HTC-001 only. A post event is flagged post_after_deny when its pre
// decision was not allow, unless it was require_approval and the State
// holds the call's approval. The subject's ep_id is the enforcement point
// that published the call (NATS binds it to the publisher's user): the
// receipt names it, and an envelope claiming another ep_id gets
// DENY_EP_ID_MISMATCH alone, with no ledger claim or other check. An error
// means the rate store could not answer.
func (d *Decider) Begin(subject string, raw []byte, now time.Time, receiptID string) (*Pending, error) {
	if receiptID == "" {
		receiptID = uuid.Must(uuid.NewV7()).String()
	}
	st := d.state.Load()
	e := st.engine
	subjPhase, subjEP, subjServer, subjOK := schemas.ParseCallSubject(subject)
	envHash := sha256.Sum256(raw)
	p := &Pending{d: d, now: now, st: st, receiptID: receiptID}
	p.r = schemas.Receipt{
		EnvelopeHash:   hex.EncodeToString(envHash[:]),
		Timestamp:      now.UTC().Format(schemas.TimeFormat),
		Mode:           string(e.Mode()),
		RegistryDigest: e.Registry().Digest(),
		ControlSeq:     st.Seq(),
		ContentHashAlg: schemas.ContentHashAlg,
		ReasonCodes:    []string{},
		DocumentHashes: []schemas.DocumentHash{},
		Phase:          subjPhase,
		EPID:           subjEP,
		ServerID:       subjServer,
	}
	pc, err := schemas.ParseToolCall(raw, d.lim)
	if err == nil {
		// The subject routes the call; it must agree with the envelope.
		switch {
		case !subjOK:
			err = &schemas.ValidationError{Code: schemas.CodeEnvelopeInvalid,
				Details: []string{"subject: not talos.call.<phase>.<ep_id>.<server_id>"}}
		case pc.Call.Phase != subjPhase || pc.Call.ServerID != subjServer:
			err = &schemas.ValidationError{Code: schemas.CodeEnvelopeInvalid,
				Details: []string{"envelope phase/server_id differ from the subject it was published on"}}
		}
	}
	if err != nil {
		o := InvalidOutcome(err)
		// Nothing in a malformed envelope is trusted; a tool_call_id that
		// matches its pattern is kept only to name the record. The reply
		// goes to the publisher the subject names, never to the ep_id the
		// envelope claims.
		r := &p.r
		r.ToolCallID, _, _ = schemas.BestEffortIDs(raw)
		fill(r, o)
		r.EventType = kindOf(r.Phase)
		p.done = &Decided{Receipt: *r, ReceiptID: receiptID, Details: o.Details}
		if d.o.Redactor != nil {
			p.done.ToolCall = malformedEvent(raw, r, now)
		}
		return p, nil
	}
	p.pc = pc
	c := &pc.Call
	pre := c.Phase == schemas.PhasePre
	p.cls = e.classify(pc)
	if pre {
		p.engine = e.decidePre(pc, &p.cls)
	} else {
		p.engine = e.decidePost(pc, &p.cls)
	}
	p.o = p.engine
	switch {
	case slices.Contains(p.engine.ReasonCodes, schemas.CodeEnvelopeInvalid):
	case c.EPID != subjEP:
		p.o = misattributed(p.engine, c.EPID, subjEP)
	default:
		p.checked = true
		p.incident, p.incDet = st.Check(c)
		if pre && authorized(c) {
			p.auth = d.authorize(st, pc, &p.cls, &p.engine, now)
			p.sender = p.auth.Sender
			if p.after, p.afterDet, err = d.preflight(st, pc, &p.cls, now); err != nil {
				return nil, err
			}
		}
	}
	fillCall(&p.r, c)
	p.call = CallKey{EPID: subjEP, SessionID: c.SessionID, CorrelationID: c.CorrelationID, ToolCallID: c.ToolCallID}
	return p, nil
}

// authorized reports whether a phase-pre call is authorized and
// preflighted. A refused request's report (DENY_UNAUTHENTICATED) has
// nothing to authorize or preflight, nor has a server's request of its
// client, made during a call that was (the incident state still applies).
func authorized(c *schemas.ToolCall) bool {
	return c.ServerID != schemas.ServerUnauthenticated && !schemas.IsServerRequest(c.MCPMethod)
}

// misattributed is the outcome of a valid envelope whose ep_id (claimed)
// is not the enforcement point that published it: DENY_EP_ID_MISMATCH and
// nothing else (no other check is trusted to speak for a call its sender
// misnamed), with the hashes the engine took, so the receipt still says
// which request and result were sent. A post envelope's tool effect is not
// recorded.
func misattributed(o Outcome, claimed, publisher string) Outcome {
	v := newVerdict()
	v.add(schemas.CodeDenyEPIDMismatch, fmt.Sprintf("ep_id: the envelope names enforcement point %q; it was published by %q", claimed, publisher))
	out := v.finish()
	out.ToolClass, out.RequestHash, out.ResponseHash = o.ToolClass, o.RequestHash, o.ResponseHash
	out.DocumentHashes, out.BatchTotalBytes = o.DocumentHashes, o.BatchTotalBytes
	return out
}

// fillCall fills the receipt with what a valid envelope says of its call:
// its ids (but ep_id, which the subject gives), the enforcement point's
// token handling (mode none when it reports none; CSP MUST 5, CRED-03) and
// its upstream's sandbox when it reports one (CSP MUST 8).
func fillCall(r *schemas.Receipt, c *schemas.ToolCall) {
	r.EventType = kindOf(c.Phase)
	r.Tool = c.ToolName
	r.AgentID = c.Actor.AgentID
	r.ToolID = c.ServerID + "/" + c.ToolName
	r.ToolCallID = c.ToolCallID
	r.TraceID = c.TraceID
	r.CorrelationID = c.CorrelationID
	r.SessionID = c.SessionID
	r.ToolName = c.ToolName
	r.MCPMethod, r.ParentToolCallID = c.MCPMethod, c.ParentToolCallID
	r.TokenHandling = &schemas.TokenHandling{Mode: schemas.TokenModeNone}
	if c.TokenHandling != nil {
		th := *c.TokenHandling
		r.TokenHandling = &th
	}
	if c.UpstreamSandbox != nil {
		us := *c.UpstreamSandbox
		r.UpstreamSandbox = &us
	}
}

// outcome merges what is known into the call's Outcome and fills the
// receipt from it: incident codes, REPLAY and the capability codes before
// the Engine's, preflight's after them.
func (p *Pending) outcome() {
	if p.checked {
		before := slices.Concat(p.incident, p.replayCodes(), p.auth.Codes)
		bDetails := slices.Concat(p.incDet, p.replayDetails(), p.auth.Details)
		p.o = merge(p.engine, before, bDetails, p.after, p.afterDet)
	}
	r := &p.r
	// The Authorizer hashed the chain it verified; otherwise (post phase,
	// no authorizer, undecodable chain) hash the member here.
	r.CapabilityHash = p.auth.ChainHash
	if r.CapabilityHash == "" && len(p.pc.Call.Capability) > 0 {
		if h, err := memberHash(p.pc, "capability"); err == nil {
			r.CapabilityHash = h
		}
	}
	r.CapabilityIDs = p.auth.CapabilityIDs
	fill(r, p.o)
}

func (p *Pending) replayCodes() []string {
	if p.replay || p.stale {
		return []string{schemas.CodeReplay}
	}
	return nil
}

func (p *Pending) replayDetails() []string {
	switch {
	case p.stale:
		return []string{"issued_at: older than the replay window, so the correlation_id can no longer be checked"}
	case p.replay:
		return []string{"correlation_id: already used in this session by another tool call"}
	}
	return nil
}

// staleAt reports whether a pre envelope issued at issuedAt is too old for
// the ledger to vouch for its correlation_id at now. An unreadable time is
// not judged here (the schema requires RFC 3339).
func (d *Decider) staleAt(issuedAt string, now time.Time) bool {
	t, err := time.Parse(time.RFC3339Nano, issuedAt)
	if err != nil {
		return false
	}
	return now.Sub(t) > d.window()
}

// window is how long the ledger remembers a call.
func (d *Decider) window() time.Duration {
	if d.o.ReplayWindow <= 0 {
		return DefaultReplayWindow
	}
	return d.o.ReplayWindow
}

// Recorded tells the Decider that the ledger operations of o.Stored ran:
// the call's record is final, and its post event may take it from the
// RecordCache. Calls without a record of their own (no ledger, a replay,
// a post) and calls whose Stored was not asked are ignored.
func (d *Decider) Recorded(o *Decided) {
	if d.records == nil || o == nil || o.final == nil {
		return
	}
	decided, err := time.Parse(time.RFC3339Nano, o.final.DecidedAt)
	if err != nil {
		return // not kept: its post asks the ledger
	}
	// The ledger keeps a record for the window from its last write, which
	// came after its decision. A flush applied since the call began may
	// have purged the record: Put then keeps nothing.
	d.records.Put(o.call, *o.final, decided.Add(d.window()), o.recordsGen)
}

// firstOps decides as far as it can without the ledger and sets the first
// ledger operations: a pre call claims its (session, correlation) pair with
// its decision (unless the local cache knows another call holds it: then
// it is a replay, decided without a write), a post event looks up its pre
// decision.
func (p *Pending) firstOps() {
	d, c := p.d, &p.pc.Call
	pre := c.Phase == schemas.PhasePre
	if pre && d.o.Ledger != nil && p.checked {
		if known, same := d.cache.Lookup(c.SessionID, c.CorrelationID, p.call.ID()); known && !same {
			p.replay = true
		}
		p.stale = d.staleAt(c.IssuedAt, p.now)
	}
	p.outcome()
	if d.o.Ledger == nil || !p.checked {
		return
	}
	if d.records != nil {
		p.recordsGen = d.records.Gen()
	}
	switch {
	case pre && !p.replay && !p.stale:
		p.claim = &LedgerOp{Kind: OpClaimCall, Call: p.call, Pre: PreRecord{
			Decision: p.r.Decision, ReceiptID: p.receiptID, CapabilityIDs: p.r.CapabilityIDs, DecidedAt: p.r.Timestamp}}
	case !pre && d.o.Redactor != nil:
		p.claim = &LedgerOp{Kind: OpLookupCall, Call: p.call}
		if d.records != nil {
			if rec, ok := d.records.Get(p.call, p.now); ok {
				p.claim.Held, p.claim.Found = rec, true
				return // answered here: no ledger read
			}
		}
	}
	if p.claim != nil {
		p.ops = []*LedgerOp{p.claim}
	}
}

// Resume continues a call once the operations of Ops ran: it returns the
// decision, or nil and no error when more operations are needed (run Ops
// again, then Resume). An error means there is no decision; the call
// MUST NOT be answered or acked, so it is retried (fail closed).
func (d *Decider) Resume(p *Pending) (*Decided, error) {
	if p.done != nil {
		return p.done, nil
	}
	if p.sender != nil {
		return nil, errors.New("enforce: Resume before the sender signature was verified")
	}
	p.Ops()
	p.ops = nil
	pre := p.pc.Call.Phase == schemas.PhasePre
	switch p.stage {
	case 0:
		if p.claim != nil && p.claim.Err != nil {
			return nil, fmt.Errorf("enforce: call ledger: %w", p.claim.Err)
		}
		if pre {
			if err := p.claimed(); err != nil {
				return nil, err
			}
			if p.idem = p.idempotencyOp(); p.idem != nil {
				p.ops, p.stage = []*LedgerOp{p.idem}, 1
				return nil, nil
			}
		}
	case 1:
		if p.idem.Err != nil {
			return nil, fmt.Errorf("enforce: call ledger: %w", p.idem.Err)
		}
		p.idempotencyHeld()
	}
	return d.finish(p), nil
}

// claimed applies the pair claim of a pre call: won, the record is the
// call's own; held by this very call (a redelivery: the same tool_call_id
// from the same enforcement point), the call keeps the receipt id the
// ledger names; held by another call, it is a replay.
func (p *Pending) claimed() error {
	op, c, d := p.claim, &p.pc.Call, p.d
	if op == nil {
		return nil
	}
	switch {
	case op.Won:
		rec := op.Pre
		rec.EPID, rec.ToolCallID = p.call.EPID, c.ToolCallID
		p.record = &rec
		d.cache.Add(c.SessionID, c.CorrelationID, p.call.ID())
	case op.Held.ToolCallID == "":
		return errors.New("enforce: call ledger: a claim was refused without naming its holder")
	case op.Held.ToolCallID == c.ToolCallID && op.Held.EPID == p.call.EPID:
		rec := op.Held
		p.record = &rec
		if rec.ReceiptID != "" {
			p.receiptID, p.claimedBefore = rec.ReceiptID, true
		}
		d.cache.Add(c.SessionID, c.CorrelationID, p.call.ID())
	default:
		d.cache.Add(c.SessionID, c.CorrelationID, schemas.EPCallID(op.Held.EPID, op.Held.ToolCallID))
		p.replay = true
		p.outcome()
	}
	return nil
}

// idempotencyOp is the claim of the idempotency key of an allowed pre call
// that carries one: a denied call never takes a key.
func (p *Pending) idempotencyOp() *LedgerOp {
	c := &p.pc.Call
	if p.d.o.Ledger == nil || p.r.Decision != schemas.DecisionAllow || c.IdempotencyKey == "" {
		return nil
	}
	agent := p.auth.Holder
	if agent == "" {
		agent = c.Actor.AgentID
	}
	p.idemKey = IdempotencyKey(agent, c.ServerID, c.ToolName, c.IdempotencyKey)
	return &LedgerOp{Kind: OpClaimIdempotency, IdemKey: p.idemKey,
		Idem: IdemRecord{RequestHash: p.r.RequestHash, EPID: p.call.EPID, ToolCallID: c.ToolCallID, ReceiptID: p.receiptID}}
}

// idempotencyHeld applies the idempotency claim: a call whose (agent,
// server, tool, idempotency_key) an earlier allowed call holds is denied
// IDEMPOTENCY_KEY_REUSED if its request differs, and is allowed naming
// that call (idempotent_of) if it is the same request.
func (p *Pending) idempotencyHeld() {
	op, c, r := p.idem, &p.pc.Call, &p.r
	held := op.HeldIdem
	switch {
	case op.Won || (held.ToolCallID == c.ToolCallID && held.EPID == p.call.EPID):
	case held.RequestHash == r.RequestHash:
		r.IdempotentOf = &schemas.IdempotentOf{ToolCallID: held.ToolCallID, ReceiptID: held.ReceiptID}
	default:
		p.after = append(p.after, schemas.CodeIdempotencyKeyReused)
		p.afterDet = append(p.afterDet, "idempotency_key: already used by tool call "+held.ToolCallID+" with a different request_hash")
		p.outcome()
	}
}

// finish builds the Decided: the ledger bookkeeping, and the ToolCallEvent
// of a call whose record this envelope completes (a denied pre call, a post
// event).
func (d *Decider) finish(p *Pending) *Decided {
	c := &p.pc.Call
	pre := c.Phase == schemas.PhasePre
	out := &Decided{Receipt: p.r, ReceiptID: p.receiptID, Details: p.o.Details, call: p.call, record: p.record, claimedBefore: p.claimedBefore, recordsGen: p.recordsGen,
		approv: pre && d.o.Ledger != nil && p.record != nil}
	p.done = out
	if d.o.Redactor == nil {
		return out
	}
	if !pre && p.claim != nil {
		rec := p.claim.Held
		switch {
		case !p.claim.Found:
			p.flags = append(p.flags, schemas.FlagPostWithoutPre)
		case rec.Decision == schemas.DecisionAllow,
			// A responder released the parked call: it ran as approved.
			rec.Decision == schemas.DecisionRequireApproval && approved(p.st, p.call.EPID, c.ToolCallID):
			p.prior = &rec
		default:
			p.flags = append(p.flags, schemas.FlagPostAfterDeny)
			p.prior = &rec
		}
	}
	out.from = p
	// A call that may still run (allowed, or parked for approval) is
	// recorded by its post event.
	if !pre || out.Receipt.Decision == schemas.DecisionDeny {
		out.ToolCall = p.event(&out.Receipt)
	}
	return out
}

// approved reports whether a responder approved the parked call
// toolCallID of enforcement point epID in st (rejected or unresolved:
// false).
func approved(st *State, epID, toolCallID string) bool {
	verb, _, ok := st.Approval(epID, toolCallID)
	return ok && verb == schemas.VerbApprove
}

// authorize runs the capability checks of a phase-pre call, leaving the
// sender signature to verify (AuthResult.Sender). It also derives the
// call's method (the action of an action-based tool) and resource (the
// argument at the tool's resource_pointer) from the registry.
func (d *Decider) authorize(st *State, pc *schemas.ParsedCall, cls *Classification, o *Outcome, now time.Time) AuthResult {
	c := &pc.Call
	chain, has := pc.Doc["capability"]
	if d.o.Capabilities == nil || (!has && !d.o.RequireCapability) {
		return AuthResult{}
	}
	req := &AuthRequest{
		ServerID: c.ServerID, ToolName: c.ToolName, MCPMethod: c.MCPMethod, Class: o.ToolClass,
		RequestHash:   c.RequestHash,
		CorrelationID: c.CorrelationID, SessionID: c.SessionID, IssuedAt: c.IssuedAt,
		SenderSignature: pc.Doc["sender_signature"],
		AgentID:         c.Actor.AgentID,
		Now:             now,
		Revoked:         st.Revoked,
		DeferSender:     true,
	}
	if req.RequestHash == "" {
		req.RequestHash = o.RequestHash
	}
	if has {
		req.Chain = chain
		req.ChainRaw = c.Capability
	}
	req.Method, req.Resource, req.HasResource = cls.Action, cls.Resource, cls.HasResource
	return d.o.Capabilities.Authorize(req)
}

// preflight runs CSP MUST 7 on a classified phase-pre call: the
// registry's definition pin (DENY_TOOL_DRIFT), input_schema, size and path
// rules, the policy's rules and its rate limits. An error means the rate store could not answer.
func (d *Decider) preflight(st *State, pc *schemas.ParsedCall, cls *Classification, now time.Time) ([]string, []string, error) {
	c := &pc.Call
	var codes, details []string
	if d.o.Policy != nil {
		if ok, _ := d.o.Policy.Match(c.Actor.AgentID, c.ServerID, c.ToolName); !ok {
			codes = append(codes, schemas.CodeDenyNoMatchingRule)
			details = append(details, "policy: no rule allows this agent, server and tool")
		}
	}
	if drift, why := DefinitionDrift(cls.Tool, c.ToolDefinitionSHA256); drift {
		codes = append(codes, schemas.CodeDenyToolDrift)
		details = append(details, why)
	}
	if tool := cls.Tool; tool != nil {
		pf := d.preflightOf(st.Registry())
		if pf.err != nil {
			codes = append(codes, schemas.CodeDenySchemaViolation)
			details = append(details, "registry: input schemas do not compile: "+pf.err.Error())
		} else {
			args := pc.Arguments()
			n := argsLen(pc)
			cs, ds := pf.p.Check(c.ServerID, tool, args, n, c.WorkspaceRoot)
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
