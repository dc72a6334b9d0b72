package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// DeciderOptions bounds what a Decider accepts. Zero values mean the
// schemas.Limits defaults.
type DeciderOptions struct {
	MaxEnvelopeBytes int
	MaxDepth         int
}

// Decider turns one raw call message into unsigned receipt data: it parses
// the envelope (VAL-HTC-001 on any failure), runs the Engine, and fills
// every receipt field. It answers every input and is safe for concurrent
// use; it never copies argument or result values into the receipt, only
// their hashes.
type Decider struct {
	e   *Engine
	lim schemas.Limits
}

// NewDecider returns a Decider over e.
func NewDecider(e *Engine, o DeciderOptions) (*Decider, error) {
	return &Decider{e: e, lim: schemas.Limits{MaxBytes: o.MaxEnvelopeBytes, MaxDepth: o.MaxDepth}}, nil
}

// Decide decides the call raw, received on subject
// (talos.call.<phase>.<server_id>), at now. The receipt's Chain and
// Signature are left for the signer.
func (d *Decider) Decide(subject string, raw []byte, now time.Time) (schemas.Receipt, []string, error) {
	subjPhase, subjServer := splitCallSubject(subject)
	envHash := sha256.Sum256(raw)
	r := schemas.Receipt{
		EnvelopeHash:   hex.EncodeToString(envHash[:]),
		Timestamp:      now.UTC().Format(schemas.TimeFormat),
		Mode:           string(d.e.Mode()),
		RegistryDigest: d.e.Registry().Digest(),
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
		o = d.e.DecidePost(pc)
	} else {
		o = d.e.DecidePre(pc)
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
