package enforce

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

const (
	parkedA = "0190f5b2-7c1e-7a3b-8d4e-00000000a001"
	parkedB = "0190f5b2-7c1e-7a3b-8d4e-00000000b002"
)

func approve(id string) *schemas.ControlRecord { return ctl(schemas.VerbApprove, target(id)) }
func reject(id string) *schemas.ControlRecord  { return ctl(schemas.VerbReject, target(id)) }

// applyAll applies recs to s at seqs 1.., failing on any error.
func applyAll(t *testing.T, s *State, recs ...*schemas.ControlRecord) *State {
	t.Helper()
	for i, r := range recs {
		var err error
		if s, err = s.Apply(s.Seq()+1, r, t0); err != nil {
			t.Fatalf("apply %d (%s): %v", i, r.Verb, err)
		}
	}
	return s
}

// TestApprovalApply: approve and reject record their resolution (actor,
// reason, seq, time) by tool_call_id; nothing else changes; the first
// resolution stands and a second is CTL_CONFLICT, at Precheck and at
// Apply (which still consumes the seq).
func TestApprovalApply(t *testing.T) {
	s0 := freshState(t)
	if _, _, ok := s0.Approval("gw-1", parkedA); ok {
		t.Fatal("a fresh State holds an approval")
	}
	s := applyAll(t, s0, approve(parkedA), reject(parkedB))
	verb, e, ok := s.Approval("gw-1", parkedA)
	if !ok || verb != schemas.VerbApprove || e != entry(parkedA, schemas.VerbApprove, 1) {
		t.Fatalf("Approval(A) = %s %+v %v", verb, e, ok)
	}
	verb, e, ok = s.Approval("gw-1", parkedB)
	if !ok || verb != schemas.VerbReject || e != entry(parkedB, schemas.VerbReject, 2) {
		t.Fatalf("Approval(B) = %s %+v %v", verb, e, ok)
	}
	if _, _, ok := s0.Approval("gw-1", parkedA); ok {
		t.Fatal("Apply changed the State it was called on")
	}
	if v := s.View(); len(v.KillSwitches)+len(v.Quarantines)+len(v.Revocations) != 0 || v.Seq != 2 {
		t.Fatalf("approvals leaked into the incident view: %+v", v)
	}

	for _, again := range []*schemas.ControlRecord{approve(parkedA), reject(parkedA), approve(parkedB)} {
		code, detail := s.Precheck(again.Command)
		if code != schemas.CtlConflict || !strings.Contains(detail, "already") || !strings.Contains(detail, "alice") {
			t.Fatalf("second %s precheck: %q %q", again.Verb, code, detail)
		}
		next, err := s.Apply(s.Seq()+1, again, t0)
		var ce *CommandError
		if !errors.As(err, &ce) || ce.Code != schemas.CtlConflict || next.Seq() != s.Seq()+1 {
			t.Fatalf("second %s apply: %v (seq %d)", again.Verb, err, next.Seq())
		}
		if verb, _, _ := next.Approval("gw-1", parkedA); verb != schemas.VerbApprove {
			t.Fatalf("the first resolution was replaced: %s", verb)
		}
	}

	for name, rec := range map[string]*schemas.ControlRecord{
		"not a uuid":  approve("call-1"),
		"no target":   ctl(schemas.VerbReject, nil),
		"braced uuid": approve("{" + parkedA + "}"),
	} {
		if code, _ := s0.Precheck(rec.Command); code != schemas.CtlInvalid {
			t.Errorf("%s: precheck %q, want %s", name, code, schemas.CtlInvalid)
		}
	}
}

// TestApprovalReplay: two States built from the same records hold the same
// resolutions, and a Decider applying them answers like the State.
func TestApprovalReplay(t *testing.T) {
	recs := []*schemas.ControlRecord{
		ctl(schemas.VerbKillSwitchSet, scope("global")),
		approve(parkedA),
		ctl(schemas.VerbKillSwitchClear, scope("global")),
		reject(parkedB),
		approve(parkedB), // refused: B is rejected
	}
	build := func() *State {
		s := freshState(t)
		for i, r := range recs {
			next, err := s.Apply(uint64(i+1), r, t0)
			if err != nil && i != 4 {
				t.Fatal(err)
			}
			s = next
		}
		return s
	}
	a, b := build(), build()
	d := deciderWith(t, nil)
	for i, r := range recs {
		_ = d.Apply(uint64(i+1), r, t0)
	}
	for _, id := range []string{parkedA, parkedB, "0190f5b2-7c1e-7a3b-8d4e-00000000c003"} {
		va, ea, oa := a.Approval("gw-1", id)
		vb, eb, ob := b.Approval("gw-1", id)
		vd, ed, od := d.State().Approval("gw-1", id)
		if va != vb || ea != eb || oa != ob || va != vd || ea != ed || oa != od {
			t.Fatalf("%s: replays differ: %s %+v %v / %s %+v %v / %s %+v %v", id, va, ea, oa, vb, eb, ob, vd, ed, od)
		}
	}
	if v, e, _ := a.Approval("gw-1", parkedB); v != schemas.VerbReject || e.Seq != 4 {
		t.Fatalf("B: %s at seq %d, want reject at 4", v, e.Seq)
	}
	if a.Seq() != 5 {
		t.Fatalf("seq %d, want 5 (the refused approve consumes its seq)", a.Seq())
	}
}

// TestAwaitsApproval: approve and reject must name one call whose pre
// decision, in the ledger, is require_approval; the target they resolve
// names its enforcement point. A tool_call_id two enforcement points used
// must be qualified with the ep_id.
func TestAwaitsApproval(t *testing.T) {
	const shared = "0190f5b2-7c1e-7a3b-8d4e-00000000d004"
	l := NewMemLedger()
	parked := PreRecord{Decision: schemas.DecisionRequireApproval, ReceiptID: "r-a"}
	l.Do([]*LedgerOp{
		{Kind: OpRecordApproval, Call: CallKey{EPID: "gw-1", ToolCallID: parkedA}, Pre: parked},
		{Kind: OpRecordApproval, Call: CallKey{EPID: "gw-1", ToolCallID: parkedB}, Pre: PreRecord{Decision: schemas.DecisionAllow, ReceiptID: "r-b"}},
		{Kind: OpRecordApproval, Call: CallKey{EPID: "gw-1", ToolCallID: shared}, Pre: parked},
		{Kind: OpRecordApproval, Call: CallKey{EPID: "gw-2", ToolCallID: shared}, Pre: parked},
	})
	s := freshState(t)
	cases := []struct {
		name, target, code, detail string
		cmd                        *schemas.ControlCommand
	}{
		{"awaits", "gw-1:" + parkedA, "", "", approve(parkedA).Command},
		{"reject awaits", "gw-1:" + parkedA, "", "", reject(parkedA).Command},
		{"qualified", "gw-1:" + parkedA, "", "", approve("gw-1:" + parkedA).Command},
		{"other enforcement point", "", schemas.CtlNotFound, "awaits approval", approve("gw-2:" + parkedA).Command},
		{"allowed call", "", schemas.CtlInvalid, "allow", approve(parkedB).Command},
		{"unknown call", "", schemas.CtlNotFound, "no call with this tool_call_id awaits approval", reject("0190f5b2-7c1e-7a3b-8d4e-00000000c003").Command},
		{"two parked it", "", schemas.CtlInvalid, "gw-1, gw-2", approve(shared).Command},
		{"one of two named", "gw-2:" + shared, "", "", approve("gw-2:" + shared).Command},
		{"not a uuid", "", schemas.CtlInvalid, "tool_call_id", approve("pre.x").Command},
		{"other verbs pass", "", "", "", ctl(schemas.VerbRevoke, target(parkedB)).Command},
	}
	for _, tc := range cases {
		target, code, detail := s.AwaitsApproval(l, tc.cmd)
		if target != tc.target || code != tc.code || !strings.Contains(detail, tc.detail) {
			t.Errorf("%s: %q %q %q, want %q %q with %q", tc.name, target, code, detail, tc.target, tc.code, tc.detail)
		}
	}
	// Resolved already: the resolved target conflicts, whichever way the
	// command names it.
	rec := approve(parkedA)
	rec.Target = "gw-1:" + parkedA
	done := applyAll(t, s, rec)
	if verb, _, ok := done.Approval("gw-1", parkedA); !ok || verb != schemas.VerbApprove {
		t.Fatalf("the resolved approval is not recorded under its enforcement point: %s %v", verb, ok)
	}
	if _, _, ok := done.Approval("gw-2", parkedA); ok {
		t.Fatal("an approval of gw-1's call counts for gw-2's call with the same id")
	}
	for _, cmd := range []*schemas.ControlCommand{reject(parkedA).Command, reject("gw-1:" + parkedA).Command} {
		if _, code, _ := done.AwaitsApproval(l, cmd); code != schemas.CtlConflict {
			t.Errorf("%s after approval: %q, want %s", cmd.Target, code, schemas.CtlConflict)
		}
	}
	// A record whose target names another call than the command's is not
	// applied.
	bad := approve(parkedB)
	bad.Target = "gw-1:" + parkedA
	if _, err := s.Apply(1, bad, t0); err == nil {
		t.Error("a record whose target names another call was applied")
	}
	l.Err = errors.New("kv down")
	if _, code, detail := s.AwaitsApproval(l, approve(parkedA).Command); code != schemas.CtlInternal || strings.Contains(detail, "kv down") {
		t.Errorf("ledger error: %q %q", code, detail)
	}
	if _, code, _ := s.AwaitsApproval(nil, approve(parkedA).Command); code != "" {
		t.Errorf("nil ledger: %q", code)
	}
}

// nopRedactor redacts nothing (the flight recorder runs without a key).
type nopRedactor struct{}

func (nopRedactor) Redact(v any, _ string) (any, []schemas.Redaction, error) { return v, nil, nil }

// TestApprovalPostFlags: a call parked for approval is not recorded at
// pre (its post event completes the record); its post event is flagged
// post_after_deny unless the State holds its approval (rejected or
// unresolved: flagged).
func TestApprovalPostFlags(t *testing.T) {
	l := NewMemLedger()
	d, err := NewDecider(trustEngine(t), DeciderOptions{Ledger: l, Redactor: nopRedactor{}})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(env map[string]any) *Decided {
		t.Helper()
		raw, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		out, err := d.DecideCall("talos.call."+env["phase"].(string)+".gw-1.community", raw, t0)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	call := func(id, phase string) map[string]any {
		env := withCall(envelope(phase, "community", "search", map[string]any{"q": "x"}), id)
		// One correlation id per call (the ledger refuses a second call
		// with the same pair as a replay).
		env["correlation_id"] = "corr-" + strings.ReplaceAll(id, "-", "") + "-x"
		if phase == schemas.PhasePost {
			env["result"] = text("found")
		}
		return env
	}
	flags := func(id string) []string {
		t.Helper()
		out := decide(call(id, schemas.PhasePost))
		if out.ToolCall == nil {
			t.Fatal("no ToolCallEvent for a post event")
		}
		return out.ToolCall.Flags
	}

	const unresolved = "0190f5b2-7c1e-7a3b-8d4e-00000000c003"
	for i, id := range []string{parkedA, parkedB, unresolved} {
		pre := decide(call(id, schemas.PhasePre))
		if pre.Receipt.Decision != schemas.DecisionRequireApproval || pre.ToolCall != nil {
			t.Fatalf("pre %d: %s, event %v", i, pre.Receipt.Decision, pre.ToolCall != nil)
		}
		ops := pre.Stored(pre.ReceiptID, pre.Receipt.Decision)
		if len(ops) != 1 || ops[0].Kind != OpRecordApproval {
			t.Fatalf("pre %d: ops once stored %+v, want the approval record only", i, ops)
		}
		l.Do(ops)
		if recs, _ := l.LookupApprovals(id); recs["gw-1"].Decision != schemas.DecisionRequireApproval || recs["gw-1"].ReceiptID != pre.ReceiptID || len(recs) != 1 {
			t.Fatalf("ledger holds %+v", recs)
		}
	}
	if f := flags(parkedA); !slices.Equal(f, []string{schemas.FlagPostAfterDeny}) {
		t.Fatalf("post before the approval: flags %v", f)
	}
	if err := d.Apply(1, approve(parkedA), t0); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(2, reject(parkedB), t0); err != nil {
		t.Fatal(err)
	}
	if f := flags(parkedA); len(f) != 0 {
		t.Fatalf("post after the approval: flags %v", f)
	}
	if f := flags(parkedB); !slices.Equal(f, []string{schemas.FlagPostAfterDeny}) {
		t.Fatalf("post after a rejection: flags %v", f)
	}
	if f := flags(unresolved); !slices.Equal(f, []string{schemas.FlagPostAfterDeny}) {
		t.Fatalf("post of an unresolved call: flags %v", f)
	}
}

// TestEventForStoredDecision: a redelivered call is answered with the
// receipt its first delivery stored; its ToolCallEvent follows that
// receipt's decision, not the redelivery's own.
func TestEventForStoredDecision(t *testing.T) {
	d, err := NewDecider(trustEngine(t), DeciderOptions{Ledger: NewMemLedger(), Redactor: nopRedactor{}})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(env map[string]any) *Decided {
		t.Helper()
		raw, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		out, err := d.DecideCall("talos.call."+env["phase"].(string)+".gw-1.community", raw, t0)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	pre := decide(withCall(envelope(schemas.PhasePre, "community", "search", map[string]any{"q": "x"}), parkedA))
	if pre.Receipt.Decision != schemas.DecisionRequireApproval || pre.ToolCall != nil {
		t.Fatalf("pre: %s, event %v", pre.Receipt.Decision, pre.ToolCall != nil)
	}
	if ev := pre.EventFor(pre.Receipt.Decision, pre.Receipt.ReasonCodes); ev != nil {
		t.Error("an event for the delivery's own undenied decision")
	}
	// Stored first: a deny (a kill switch was on then). The record is a denial.
	ev := pre.EventFor(schemas.DecisionDeny, []string{schemas.CodeKillSwitch})
	if ev == nil || ev.Decision != schemas.DecisionDeny || !slices.Equal(ev.ReasonCodes, []string{schemas.CodeKillSwitch}) || ev.OK || ev.Error == nil {
		t.Fatalf("event for a stored deny: %+v", ev)
	}
	if ev.ToolCallID != parkedA {
		t.Errorf("event names %s", ev.ToolCallID)
	}
	// A delivery that denies, where an allow was stored: no record yet (the post event makes it).
	denied := decide(withCall(envelope(schemas.PhasePre, "community", "search", map[string]any{"q": "x", "extra": 1}), parkedB))
	if denied.Receipt.Decision != schemas.DecisionDeny || denied.ToolCall == nil {
		t.Fatalf("denied pre: %s, event %v", denied.Receipt.Decision, denied.ToolCall != nil)
	}
	if ev := denied.EventFor(schemas.DecisionAllow, nil); ev != nil {
		t.Errorf("event for a stored allow: %+v", ev)
	}
	if ev := denied.EventFor(denied.Receipt.Decision, denied.Receipt.ReasonCodes); ev != denied.ToolCall {
		t.Error("the same decision does not give the delivery's own event")
	}
}
