package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
)

// sent is one envelope the run sent and the decision it got.
type sent struct {
	call *schemas.ToolCall // nil for raw bytes
	d    *schemas.Decision
	err  error
}

// run is one conformance run's state. Rows are kept by ID so that the
// report lists them in the matrices' order whatever order they ran in.
type run struct {
	cfg     Config
	session string // every call's session_id: the run's own
	rows    map[string]Result
	sent    []*sent
	// calls the event checks look for: a purpose → the call.
	byPurpose map[string]*sent
}

func newRun(cfg Config) *run {
	return &run{cfg: cfg, session: "conformance-" + uuid.NewString()[:8], rows: map[string]Result{}, byPurpose: map[string]*sent{}}
}

func (r *run) set(res Result) { r.rows[res.Group+"|"+res.ID+"|"+res.Check] = res }

// envelope is a pre envelope of tool with args in the run's session,
// signed when the run has a signer.
func (r *run) envelope(t Tool, args any, idemKey string) (*schemas.ToolCall, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	spec := ep.CallSpec{EPID: r.cfg.Client.EPID(), Server: t.Server, Tool: t.Name, Args: raw, Session: r.session, IdempotencyKey: idemKey}
	return spec.Envelope(r.cfg.Signer)
}

// call sends a pre envelope (built by envelope) and records it under
// purpose.
func (r *run) call(ctx context.Context, purpose string, t Tool, args any, idemKey string) *sent {
	c, err := r.envelope(t, args, idemKey)
	if err != nil {
		return r.record(purpose, &sent{err: err})
	}
	return r.send(ctx, purpose, c)
}

// send sends a built envelope and records its decision.
func (r *run) send(ctx context.Context, purpose string, c *schemas.ToolCall) *sent {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	d, err := r.cfg.Client.Call(ctx, c)
	return r.record(purpose, &sent{call: c, d: d, err: err})
}

func (r *run) record(purpose string, s *sent) *sent {
	r.sent = append(r.sent, s)
	if purpose != "" {
		r.byPurpose[purpose] = s
	}
	return s
}

// receipts are the receipt ids of the decisions among ss.
func receiptIDs(ss ...*sent) []string {
	var ids []string
	for _, s := range ss {
		if s != nil && s.d != nil && s.d.ReceiptID != "" {
			ids = append(ids, s.d.ReceiptID)
		}
	}
	return ids
}

// describe is a decision as the report words it.
func describe(s *sent) string {
	switch {
	case s == nil:
		return "not sent"
	case s.err != nil:
		return "no decision: " + s.err.Error()
	case len(s.d.ReasonCodes) == 0:
		return s.d.Decision
	}
	return s.d.Decision + " " + strings.Join(s.d.ReasonCodes, ",")
}

// denied reports that s was denied with every code of want.
func denied(s *sent, want ...string) bool {
	if s == nil || s.err != nil || s.d.Decision != schemas.DecisionDeny {
		return false
	}
	for _, w := range want {
		if !slices.Contains(s.d.ReasonCodes, w) {
			return false
		}
	}
	return true
}

func allowed(s *sent) bool { return s != nil && s.err == nil && s.d.Decision == schemas.DecisionAllow }

// expectDeny is a row that passes when s was denied with want.
func expectDeny(group, id, check, what string, s *sent, want ...string) Result {
	res := Result{Group: group, ID: id, Check: check, ReceiptIDs: receiptIDs(s)}
	if denied(s, want...) {
		res.Status, res.Reason = Pass, fmt.Sprintf("%s: %s", what, describe(s))
	} else {
		res.Status, res.Reason = Fail, fmt.Sprintf("%s: want deny %s, got %s", what, strings.Join(want, "+"), describe(s))
	}
	return res
}

// receiptData reads the data of a decision's receipt (unverified: the
// receipt rows verify signatures).
func receiptData(s *sent) (*schemas.Receipt, bool) {
	if s == nil || s.d == nil {
		return nil, false
	}
	var ev struct {
		Data schemas.Receipt `json:"data"`
	}
	if err := json.Unmarshal(s.d.Receipt, &ev); err != nil {
		return nil, false
	}
	return &ev.Data, true
}
