package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// DeciderOptions bounds what a Decider accepts. Zero values mean the
// schemas.Limits defaults and no replay checks.
type DeciderOptions struct {
	MaxEnvelopeBytes int
	MaxDepth         int
	// Replay, if set, checks every valid phase-pre call's correlation_id
	// (REPLAY); nil means no replay checks.
	Replay *ReplayGuard
}

// Decider turns one raw call message into unsigned receipt data: it parses
// the envelope (VAL-HTC-001 on any failure), runs the Engine of the current
// State, adds the incident and replay checks, and fills every receipt
// field. It answers every input it can decide and is safe for concurrent
// use; it never copies argument or result values into the receipt, only
// their hashes.
//
// The current State is swapped atomically (Apply, SetState): each Decide
// reads it once, so a decision is made under exactly one control seq,
// which its receipt names (ControlSeq, RegistryDigest).
type Decider struct {
	state  atomic.Pointer[State]
	lim    schemas.Limits
	replay *ReplayGuard
}

// NewDecider returns a Decider whose State is the one before any control
// event, enforcing with e (its mode and registry as the bootstrap).
func NewDecider(e *Engine, o DeciderOptions) (*Decider, error) {
	if e == nil {
		return nil, errors.New("enforce: NewDecider: nil Engine")
	}
	d := &Decider{lim: schemas.Limits{MaxBytes: o.MaxEnvelopeBytes, MaxDepth: o.MaxDepth}, replay: o.Replay}
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

// Decide decides the call raw, received on subject
// (talos.call.<phase>.<server_id>), at now. The receipt's Chain and
// Signature are left for the signer. A valid envelope gets the incident
// codes of the State (KILL_SWITCH, SESSION_QUARANTINED) before the
// Engine's, and in phase pre the replay check (REPLAY); a malformed one
// gets VAL-HTC-001 only. An error means there is no decision (the replay
// store could not answer): the caller MUST NOT answer or ack the call, so
// it is retried (fail closed).
func (d *Decider) Decide(subject string, raw []byte, now time.Time) (schemas.Receipt, []string, error) {
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
		return r, o.Details, nil
	}
	c := &pc.Call
	var o Outcome
	if c.Phase == schemas.PhasePost {
		o = e.DecidePost(pc)
	} else {
		o = e.DecidePre(pc)
	}
	if !slices.Contains(o.ReasonCodes, schemas.CodeEnvelopeInvalid) {
		codes, details := st.Check(c)
		if c.Phase == schemas.PhasePre && d.replay != nil {
			replayed, err := d.replay.Check(c.SessionID, c.CorrelationID, c.ToolCallID)
			if err != nil {
				return schemas.Receipt{}, nil, err
			}
			if replayed {
				codes = append(codes, schemas.CodeReplay)
				details = append(details, "correlation_id: already used in this session by another tool call")
			}
		}
		o = prepend(o, codes, details)
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
	if len(c.Capability) > 0 {
		if h, err := memberHash(pc, "capability"); err == nil {
			r.CapabilityHash = h
		}
	}
	fill(&r, o)
	return r, o.Details, nil
}

// prepend puts codes (with their details) before o's, deduplicated, and
// decides again over all of them (deny if any is not a warning), as the
// engine's own checks do.
func prepend(o Outcome, codes, details []string) Outcome {
	if len(codes) == 0 {
		return o
	}
	v := &verdict{out: o, seen: map[string]bool{}}
	v.out.ReasonCodes = make([]string, 0, len(codes)+len(o.ReasonCodes))
	v.out.Details = append(details, o.Details...)
	for _, c := range codes {
		v.add(c, "")
	}
	for _, c := range o.ReasonCodes {
		v.add(c, "")
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
