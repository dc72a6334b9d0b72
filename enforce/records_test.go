package enforce

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

func recordKey(id string) CallKey {
	return CallKey{EPID: "gw-1", SessionID: "s1", CorrelationID: "corr-" + id, ToolCallID: id}
}

func recordOf(k CallKey, caps ...string) PreRecord {
	return PreRecord{EPID: k.EPID, ToolCallID: k.ToolCallID, Decision: schemas.DecisionAllow,
		ReceiptID: "rcpt-" + k.ToolCallID, CapabilityIDs: caps, DecidedAt: "2026-03-04T05:06:07.890Z"}
}

// TestRecordCache: a record comes back as it was put, until it expires,
// is overwritten by the ring or cleared; a record too long for a slot is
// not kept; a slot whose ep_id or tool_call_id differs from the call asked
// for is never returned for it.
func TestRecordCache(t *testing.T) {
	exp := t0.Add(time.Hour)
	get := func(c *RecordCache, k CallKey) (PreRecord, bool) { return c.Get(k, t0) }

	c := NewRecordCache(2)
	a, b, cc, d := recordKey("a"), recordKey("b"), recordKey("c"), recordKey("d")
	c.Put(a, recordOf(a, "cap-1", "cap-2"), exp, 0)
	if got, ok := get(c, a); !ok || !reflect.DeepEqual(got, recordOf(a, "cap-1", "cap-2")) {
		t.Fatalf("get a: %+v %v", got, ok)
	}
	other := a
	other.SessionID = "s2"
	if _, ok := get(c, other); ok {
		t.Fatal("a call of another session took a's record")
	}
	if _, ok := c.Get(a, exp); ok {
		t.Fatal("a record returned at its expiry")
	}

	// The ring: b fills the second slot, c overwrites a's, d b's.
	c.Put(b, recordOf(b), exp, 0)
	c.Put(cc, recordOf(cc), exp, 0)
	if _, ok := get(c, a); ok {
		t.Fatal("a kept past the ring")
	}
	if got, ok := get(c, b); !ok || !reflect.DeepEqual(got, recordOf(b)) {
		t.Fatalf("get b: %+v %v", got, ok)
	}
	// Put again in place: b's new record, still in its slot.
	nb := recordOf(b)
	nb.Decision = schemas.DecisionDeny
	c.Put(b, nb, exp, 0)
	if got, _ := get(c, b); got.Decision != schemas.DecisionDeny {
		t.Fatalf("b after its update: %+v", got)
	}
	c.Put(d, recordOf(d), exp, 0)
	if _, ok := get(c, b); ok {
		t.Fatal("b kept past the ring")
	}
	for _, k := range []CallKey{cc, d} {
		if _, ok := get(c, k); !ok {
			t.Fatalf("%s lost", k.ToolCallID)
		}
	}

	long := recordKey("long")
	c.Put(long, recordOf(long, strings.Repeat("x", recordSlotBytes)), exp, 0)
	if _, ok := get(c, long); ok {
		t.Fatal("a record longer than a slot was kept")
	}
	if _, ok := get(c, d); !ok {
		t.Fatal("a record not kept took a slot")
	}

	// A slot found under another call's hash (a collision) is not its.
	c.mu.Lock()
	c.index[c.key(recordKey("e"))] = c.index[c.key(d)]
	c.mu.Unlock()
	if _, ok := get(c, recordKey("e")); ok {
		t.Fatal("another call's record returned on a hash collision")
	}

	c.Clear()
	if _, ok := get(c, cc); ok {
		t.Fatal("a record kept past Clear")
	}
	// A record of a call that began before the Clear is not kept.
	c.Put(a, recordOf(a), exp, 0)
	if _, ok := get(c, a); ok {
		t.Fatal("a record of the generation before a Clear was kept")
	}
	c.Put(a, recordOf(a), exp, c.Gen())
	if _, ok := get(c, a); !ok {
		t.Fatal("a record of the current generation was not kept")
	}
}

// TestPostTakesRecordedPre: a post event whose pre call this worker
// answered (Recorded) takes the pre's record from the RecordCache, with
// no ledger read, and its ToolCallEvent is the one the ledger's record
// gives (that of a decider without the cache, Records < 0); a pre not
// Recorded, a flush since, or a flush between the pre's start and its
// Recorded leave the post to the ledger.
func TestPostTakesRecordedPre(t *testing.T) {
	l := newCountingLedger()
	newDecider := func(records int) *Decider {
		d, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{Ledger: l, Redactor: nopRedactor{}, Records: records})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d, plain := newDecider(0), newDecider(-1)
	decide := func(d *Decider, id, phase string) *Decided {
		t.Helper()
		env := withCall(envelope(phase, "files", "list_dir", map[string]any{"path": "/"}), id)
		env["correlation_id"] = "corr-" + strings.ReplaceAll(id, "-", "") + "-x"
		if phase == schemas.PhasePost {
			env["result"] = text("found")
		}
		raw, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		out, err := d.DecideCall("talos.call."+phase+".gw-1.files", raw, t0)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// pre decides and stores id's pre call; record tells d it is final.
	pre := func(id string) (record func()) {
		t.Helper()
		out := decide(d, id, schemas.PhasePre)
		if out.Receipt.Decision != schemas.DecisionAllow {
			t.Fatalf("pre %s: %s %v", id, out.Receipt.Decision, out.Receipt.ReasonCodes)
		}
		l.Do(out.Stored(out.ReceiptID, out.Receipt.Decision))
		return func() { d.Recorded(out) }
	}
	// post decides id's post event with d and returns its event and how
	// many ledger lookups it took; the same post decided by plain (no
	// cache) must give the same event.
	post := func(id string) int64 {
		t.Helper()
		before := l.lookups.Load()
		got := decide(d, id, schemas.PhasePost).ToolCall
		n := l.lookups.Load() - before
		want := decide(plain, id, schemas.PhasePost).ToolCall
		if got == nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("post %s: event %+v, the ledger's gives %+v", id, got, want)
		}
		if len(got.Flags) != 0 {
			t.Fatalf("post %s: flags %v", id, got.Flags)
		}
		return n
	}

	const (
		recorded    = "0190f5b2-7c1e-7a3b-8d4e-00000000d001"
		unrecorded  = "0190f5b2-7c1e-7a3b-8d4e-00000000d002"
		acrossFlush = "0190f5b2-7c1e-7a3b-8d4e-00000000d003"
	)
	pre(recorded)()
	pre(unrecorded)
	if n := post(recorded); n != 0 {
		t.Fatalf("a recorded pre's post read the ledger %d times", n)
	}
	if n := post(unrecorded); n != 1 {
		t.Fatalf("an unrecorded pre's post read the ledger %d times, want 1", n)
	}
	if err := d.Apply(1, ctl(schemas.VerbReplayFlush, nil), t0); err != nil {
		t.Fatal(err)
	}
	if n := post(recorded); n != 1 {
		t.Fatalf("after a flush, the post read the ledger %d times, want 1", n)
	}
	// A pre call answered after a flush it began before: the flush may
	// have purged its record, so it is not kept.
	record := pre(acrossFlush)
	if err := d.Apply(2, ctl(schemas.VerbReplayFlush, nil), t0); err != nil {
		t.Fatal(err)
	}
	record()
	if n := post(acrossFlush); n != 1 {
		t.Fatalf("a pre answered across a flush: its post read the ledger %d times, want 1", n)
	}
}
