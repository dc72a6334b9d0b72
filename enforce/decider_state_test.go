package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

func deciderWith(t testing.TB, ledger CallLedger) *Decider {
	t.Helper()
	d, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{Ledger: ledger})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// decideEnv marshals env and decides it on its own subject.
func decideEnv(t testing.TB, d *Decider, env map[string]any) (schemas.Receipt, []string, error) {
	t.Helper()
	raw, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return d.Decide(fmt.Sprintf("talos.call.%s.%s.%s", env["phase"], env["ep_id"], env["server_id"]), raw, t0)
}

func mustDecide(t testing.TB, d *Decider, env map[string]any) (schemas.Receipt, []string) {
	t.Helper()
	r, details, err := decideEnv(t, d, env)
	if err != nil {
		t.Fatal(err)
	}
	return r, details
}

func listDir() map[string]any {
	return envelope("pre", "files", "list_dir", map[string]any{"path": "/"})
}

// TestDeciderKillSwitch: a kill switch applied through Decider.Apply
// denies the next call, and every receipt names the control seq.
func TestDeciderKillSwitch(t *testing.T) {
	d := deciderWith(t, nil)
	if r, _ := mustDecide(t, d, listDir()); r.Decision != schemas.DecisionAllow || r.ControlSeq != 0 {
		t.Fatalf("before: %s %v seq %d", r.Decision, r.ReasonCodes, r.ControlSeq)
	}
	if err := d.Apply(7, ctl(schemas.VerbKillSwitchSet, scope("tool:files/list_dir")), t0); err != nil {
		t.Fatal(err)
	}
	r, details := mustDecide(t, d, listDir())
	if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeKillSwitch}) ||
		r.ResultCode != schemas.CodeKillSwitch || r.ControlSeq != 7 {
		t.Errorf("killed: %s %v result %s seq %d", r.Decision, r.ReasonCodes, r.ResultCode, r.ControlSeq)
	}
	if len(details) != 1 || !strings.Contains(details[0], "tool:files/list_dir") {
		t.Errorf("details %q", details)
	}
	// A sibling tool is not stopped, but is decided under seq 7 too.
	sib, _ := mustDecide(t, d, envelope("pre", "files", "read_file", map[string]any{"path": "/"}))
	if sib.Decision != schemas.DecisionAllow || sib.ControlSeq != 7 {
		t.Errorf("sibling: %s %v seq %d", sib.Decision, sib.ReasonCodes, sib.ControlSeq)
	}
	// The post phase is stopped too.
	post, _ := mustDecide(t, d, envelope("post", "files", "list_dir", map[string]any{"path": "/"}))
	if post.Decision != schemas.DecisionDeny || post.ReasonCodes[0] != schemas.CodeKillSwitch || post.EventType != schemas.KindEffect {
		t.Errorf("post: %s %v", post.Decision, post.ReasonCodes)
	}
	if err := d.Apply(8, ctl(schemas.VerbKillSwitchClear, scope("tool:files/list_dir")), t0); err != nil {
		t.Fatal(err)
	}
	if r, _ := mustDecide(t, d, listDir()); r.Decision != schemas.DecisionAllow || r.ControlSeq != 8 {
		t.Errorf("cleared: %s %v seq %d", r.Decision, r.ReasonCodes, r.ControlSeq)
	}
	if d.State().Seq() != 8 {
		t.Errorf("State().Seq() = %d", d.State().Seq())
	}
}

// TestDeciderIncidentCodesFirst: incident codes come before the engine's,
// and a malformed envelope gets VAL-HTC-001 only.
func TestDeciderIncidentCodesFirst(t *testing.T) {
	store := newCountingLedger()
	d := deciderWith(t, store)
	for i, r := range []*schemas.ControlRecord{
		ctl(schemas.VerbKillSwitchSet, scope("global")),
		ctl(schemas.VerbQuarantineSet, session("s1")),
	} {
		if err := d.Apply(uint64(i+1), r, t0); err != nil {
			t.Fatal(err)
		}
	}
	r, details := mustDecide(t, d, envelope("pre", "files", "delete_file", map[string]any{}))
	want := []string{schemas.CodeKillSwitch, schemas.CodeSessionQuarantined, schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}
	if !slices.Equal(r.ReasonCodes, want) || r.ResultCode != schemas.CodeKillSwitch || len(details) < 3 {
		t.Errorf("codes %v result %s details %q", r.ReasonCodes, r.ResultCode, details)
	}
	claims := store.claims.Load()
	raw, _ := json.Marshal(listDir())
	raw = append(raw, '}')
	bad, _, err := d.Decide("talos.call.pre.gw-1.files", raw, t0)
	if err != nil || !slices.Equal(bad.ReasonCodes, []string{schemas.CodeEnvelopeInvalid}) || bad.ControlSeq != 2 {
		t.Errorf("malformed: %v %v seq %d", err, bad.ReasonCodes, bad.ControlSeq)
	}
	if store.claims.Load() != claims {
		t.Error("a malformed envelope was replay-checked")
	}

	// A dev-mode warning does not survive a kill switch: the call is denied.
	dev, _ := NewDecider(testEngine(t, ModeDev), DeciderOptions{})
	if err := dev.Apply(1, ctl(schemas.VerbKillSwitchSet, scope("server:files")), t0); err != nil {
		t.Fatal(err)
	}
	w, _ := mustDecide(t, dev, envelope("pre", "files", "delete_file", map[string]any{}))
	if w.Decision != schemas.DecisionDeny || !slices.Equal(w.ReasonCodes, []string{schemas.CodeKillSwitch, schemas.CodeToolUnclassifiedAllowedDev}) {
		t.Errorf("dev: %s %v", w.Decision, w.ReasonCodes)
	}
}

func withCall(env map[string]any, toolCallID string) map[string]any {
	return with(env, "tool_call_id", toolCallID)
}

const (
	callA = "0190f5b2-7c1e-7a3b-8d4e-00000000000a"
	callB = "0190f5b2-7c1e-7a3b-8d4e-00000000000b"
)

// countingLedger is a MemLedger that counts pair claims and call lookups.
type countingLedger struct {
	*MemLedger
	claims, lookups atomic.Int64
}

func newCountingLedger() *countingLedger { return &countingLedger{MemLedger: NewMemLedger()} }

func (l *countingLedger) Do(ops []*LedgerOp) {
	for _, op := range ops {
		switch op.Kind {
		case OpClaimCall:
			l.claims.Add(1)
		case OpLookupCall:
			l.lookups.Add(1)
		}
	}
	l.MemLedger.Do(ops)
}

// TestDeciderReplay: two workers over one call ledger.
func TestDeciderReplay(t *testing.T) {
	store := newCountingLedger()
	w1 := deciderWith(t, store)
	w2 := deciderWith(t, store)

	firstOut, err := w1.DecideCall("talos.call.pre.gw-1.files", mustJSON(t, withCall(listDir(), callA)), t0)
	if err != nil || firstOut.Receipt.Decision != schemas.DecisionAllow {
		t.Fatalf("first use: %v %+v", err, firstOut)
	}
	if _, ok := firstOut.ClaimedBefore(); ok {
		t.Error("first use: its receipt id reported as claimed before")
	}
	r, details := mustDecide(t, w2, withCall(listDir(), callB))
	if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeReplay}) || r.ResultCode != schemas.CodeReplay {
		t.Errorf("replay on the other worker: %s %v", r.Decision, r.ReasonCodes)
	}
	if len(details) != 1 || !strings.Contains(details[0], "correlation_id") || strings.Contains(details[0], "q3V2bH7pR9sT1uW4xY6zAb") {
		t.Errorf("details %q", details)
	}
	claims := store.claims.Load()
	if r, _ := mustDecide(t, w2, withCall(listDir(), callB)); !slices.Equal(r.ReasonCodes, []string{schemas.CodeReplay}) {
		t.Errorf("B again on w2: %s %v", r.Decision, r.ReasonCodes)
	}
	if store.claims.Load() != claims {
		t.Error("a replay the worker had seen went to the ledger again")
	}
	out, err := w2.DecideCall("talos.call.pre.gw-1.files", mustJSON(t, withCall(listDir(), callA)), t0)
	if err != nil || out.Receipt.Decision != schemas.DecisionAllow {
		t.Fatalf("redelivery of A on w2: %v %+v", err, out)
	}
	if at, ok := out.ClaimedBefore(); !ok || !at.Equal(t0.Truncate(time.Millisecond)) {
		t.Errorf("redelivery of A: claimed before %v at %v, want at the first delivery's decision, %v", ok, at, t0)
	}
	if first, _ := store.pairs[[2]string{"s1", "q3V2bH7pR9sT1uW4xY6zAb"}]; out.ReceiptID != first.ReceiptID || first.ReceiptID == "" {
		t.Errorf("redelivery of A sealed as %q, the ledger names %q", out.ReceiptID, first.ReceiptID)
	}
	// Phase post shares the pre call's correlation_id: not a replay.
	post, _ := mustDecide(t, w1, withCall(envelope("post", "files", "list_dir", map[string]any{"path": "/"}), callB))
	if slices.Contains(post.ReasonCodes, schemas.CodeReplay) {
		t.Errorf("post checked for replay: %v", post.ReasonCodes)
	}
	// Replay codes come after incident codes and before the engine's.
	if err := w2.Apply(1, ctl(schemas.VerbKillSwitchSet, scope("global")), t0); err != nil {
		t.Fatal(err)
	}
	r, _ = mustDecide(t, w2, with(withCall(listDir(), callB), "tool_class", "write"))
	if want := []string{schemas.CodeKillSwitch, schemas.CodeReplay, schemas.CodeToolClassDeclarationMismatch}; !slices.Equal(r.ReasonCodes, want) {
		t.Errorf("order: %v, want %v", r.ReasonCodes, want)
	}
}

func TestDeciderReplayStoreError(t *testing.T) {
	store := NewMemLedger()
	d := deciderWith(t, store)
	boom := errors.New("kv: no quorum")
	store.Err = boom
	r, details, err := decideEnv(t, d, listDir())
	if !errors.Is(err, boom) || r.Decision != "" || details != nil {
		t.Fatalf("Decide = %q %v %v", r.Decision, details, err)
	}
	// Without a flight recorder a post event needs no ledger, so it is
	// still decided.
	if _, _, err := decideEnv(t, d, envelope("post", "files", "list_dir", map[string]any{})); err != nil {
		t.Errorf("post: %v", err)
	}
	store.Err = nil
	if r, _ := mustDecide(t, d, listDir()); r.Decision != schemas.DecisionAllow {
		t.Errorf("after recovery: %s %v", r.Decision, r.ReasonCodes)
	}
}

// TestDeciderApplyFlush: replay.flush applied through the Decider flushes
// the local cache of pair owners; with the ledger flushed too (the control
// service's part), the pair is free again.
func TestDeciderApplyFlush(t *testing.T) {
	ledger := NewMemLedger()
	d := deciderWith(t, ledger)
	mustDecide(t, d, withCall(listDir(), callA))
	if r, _ := mustDecide(t, d, withCall(listDir(), callB)); !slices.Contains(r.ReasonCodes, schemas.CodeReplay) {
		t.Fatalf("not a replay: %v", r.ReasonCodes)
	}
	if err := d.Apply(1, ctl(schemas.VerbReplayFlush, session("other")), t0); err != nil {
		t.Fatal(err)
	}
	ledger.Flush("other")
	if r, _ := mustDecide(t, d, withCall(listDir(), callB)); !slices.Contains(r.ReasonCodes, schemas.CodeReplay) {
		t.Errorf("flush of another session forgot s1: %v", r.ReasonCodes)
	}
	if err := d.Apply(2, ctl(schemas.VerbReplayFlush, session("s1")), t0); err != nil {
		t.Fatal(err)
	}
	if known, _ := d.ReplayCache().Lookup("s1", "q3V2bH7pR9sT1uW4xY6zAb", ""); known {
		t.Error("the local cache kept a flushed pair")
	}
	ledger.Flush("s1")
	if r, _ := mustDecide(t, d, withCall(listDir(), callB)); r.Decision != schemas.DecisionAllow || r.ControlSeq != 2 {
		t.Errorf("after flush: %s %v seq %d", r.Decision, r.ReasonCodes, r.ControlSeq)
	}
}

// TestDeciderApplyInvalid: an invalid event still advances the seq.
func TestDeciderApplyInvalid(t *testing.T) {
	d := deciderWith(t, nil)
	err := d.Apply(4, ctl(schemas.VerbKillSwitchSet, scope("nope")), t0)
	var ce *CommandError
	if !errors.As(err, &ce) || d.State().Seq() != 4 {
		t.Fatalf("err %v seq %d", err, d.State().Seq())
	}
	if r, _ := mustDecide(t, d, listDir()); r.Decision != schemas.DecisionAllow || r.ControlSeq != 4 {
		t.Errorf("%s %v seq %d", r.Decision, r.ReasonCodes, r.ControlSeq)
	}
	if err := d.Apply(4, ctl(schemas.VerbKillSwitchSet, scope("global")), t0); !errors.Is(err, ErrStaleSeq) {
		t.Errorf("stale seq: %v", err)
	}
	if r, _ := mustDecide(t, d, listDir()); r.Decision != schemas.DecisionAllow {
		t.Errorf("stale event applied: %v", r.ReasonCodes)
	}
}

// TestDeciderStateSwapConsistent: while Apply toggles a global kill switch
// (set on odd seqs), every concurrent decision agrees with the seq it
// names: a decision is made under exactly one State.
func TestDeciderStateSwapConsistent(t *testing.T) {
	d := deciderWith(t, nil)
	raw, _ := json.Marshal(listDir())
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				r, _, err := d.Decide("talos.call.pre.gw-1.files", raw, t0)
				if err != nil {
					t.Error(err)
					return
				}
				killed := r.Decision == schemas.DecisionDeny
				if killed != (r.ControlSeq%2 == 1) {
					t.Errorf("seq %d decided %s %v", r.ControlSeq, r.Decision, r.ReasonCodes)
					return
				}
			}
		})
	}
	for seq := uint64(1); seq <= 400; seq++ {
		verb := schemas.VerbKillSwitchClear
		if seq%2 == 1 {
			verb = schemas.VerbKillSwitchSet
		}
		if err := d.Apply(seq, ctl(verb, scope("global")), t0); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
}

// BenchmarkDecideKillSwitches100: deciding under 100 kill switches that do
// not match costs no more than a few map lookups over deciding under none.
func BenchmarkDecideKillSwitches100(b *testing.B) {
	raw, _ := json.Marshal(listDir())
	for _, n := range []int{0, 100} {
		b.Run(fmt.Sprintf("switches=%d", n), func(b *testing.B) {
			d := deciderWith(b, nil)
			for i := range n {
				sc := []string{"agent:a%d", "session:x%d", "server:srv%d", "tool:files/t%d"}[i%4]
				if err := d.Apply(uint64(i+1), ctl(schemas.VerbKillSwitchSet, scope(fmt.Sprintf(sc, i))), t0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				r, _, err := d.Decide("talos.call.pre.gw-1.files", raw, t0)
				if err != nil || r.Decision != schemas.DecisionAllow {
					b.Fatal(r.ReasonCodes, err)
				}
			}
		})
	}
}

// BenchmarkStateCheck100: the incident check alone, 100 kill switches.
func BenchmarkStateCheck100(b *testing.B) {
	s := freshState(b)
	for i := range 100 {
		s, _ = s.Apply(uint64(i+1), ctl(schemas.VerbKillSwitchSet, scope(fmt.Sprintf("agent:a%d", i))), t0)
	}
	c := call("files", "read_file", "agent-x", "s1")
	b.ReportAllocs()
	for b.Loop() {
		if codes, _ := s.Check(c); codes != nil {
			b.Fatal(codes)
		}
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDeciderReplayWindow: a pre envelope issued longer ago than the
// replay window is a replay (the ledger has forgotten its pair by then),
// decided without a ledger write; within the window it is decided as usual.
func TestDeciderReplayWindow(t *testing.T) {
	store := newCountingLedger()
	d := deciderWith(t, store)
	old := withCall(listDir(), callA)
	old["issued_at"] = t0.Add(-25 * time.Hour).Format(time.RFC3339Nano)
	r, details := mustDecide(t, d, old)
	if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeReplay}) {
		t.Fatalf("envelope issued 25 h ago: %s %v", r.Decision, r.ReasonCodes)
	}
	if len(details) != 1 || !strings.Contains(details[0], "replay window") {
		t.Errorf("details %q", details)
	}
	if n := store.claims.Load(); n != 0 {
		t.Errorf("%d ledger claims for a stale envelope", n)
	}
	long, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{Ledger: store, ReplayWindow: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := mustDecide(t, long, old); r.Decision != schemas.DecisionAllow {
		t.Errorf("within a 48 h window: %s %v", r.Decision, r.ReasonCodes)
	}
}
