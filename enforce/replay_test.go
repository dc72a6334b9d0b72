package enforce

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestReplayCacheBounds(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{PerSession: 3, Sessions: 2})
	for i := 1; i <= 4; i++ {
		c.Add("s1", fmt.Sprintf("c%d", i), fmt.Sprintf("call-%d", i))
	}
	if known, _ := c.Lookup("s1", "c1", ""); known {
		t.Error("c1 survived past PerSession")
	}
	if known, same := c.Lookup("s1", "c4", "call-4"); !known || !same {
		t.Errorf("c4: known %v, owned by call-4 %v", known, same)
	}
	if _, same := c.Lookup("s1", "c4", "call-3"); same {
		t.Error("c4 owned by call-3 too")
	}
	if c.Len() != 3 {
		t.Errorf("Len %d, want 3", c.Len())
	}
	// A lookup makes c2 recent, so c3 is evicted next.
	if known, _ := c.Lookup("s1", "c2", ""); !known {
		t.Fatal("c2 missing")
	}
	c.Add("s1", "c5", "call-5")
	if known, _ := c.Lookup("s1", "c3", ""); known {
		t.Error("c3 should have been the least recently used")
	}
	if known, _ := c.Lookup("s1", "c2", ""); !known {
		t.Error("c2 was evicted although recently used")
	}

	// Sessions: s1 is touched last, so s2 is evicted by s3.
	c.Add("s2", "c1", "x")
	c.Lookup("s1", "c2", "")
	c.Add("s3", "c1", "y")
	if c.Sessions() != 2 {
		t.Errorf("Sessions %d, want 2", c.Sessions())
	}
	if known, _ := c.Lookup("s2", "c1", ""); known {
		t.Error("s2 survived past Sessions")
	}
	if known, _ := c.Lookup("s1", "c5", ""); !known {
		t.Error("s1 evicted although recently used")
	}
	// The same correlation id in another session is another pair.
	if _, same := c.Lookup("s3", "c1", "y"); !same {
		t.Error("s3/c1 not owned by y")
	}

	c.Flush("s3")
	if known, _ := c.Lookup("s3", "c1", ""); known || c.Len() != 3 {
		t.Errorf("Flush(s3): Len %d", c.Len())
	}
	c.Flush("")
	if c.Len() != 0 || c.Sessions() != 0 {
		t.Errorf("Flush all: Len %d Sessions %d", c.Len(), c.Sessions())
	}
}

// TestReplayCachePairs: past Pairs, whole least recently used sessions
// are forgotten; the count follows every eviction, flush and update.
func TestReplayCachePairs(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{PerSession: 4, Sessions: 10, Pairs: 6})
	for s := 1; s <= 3; s++ {
		for i := 1; i <= 2; i++ {
			c.Add(fmt.Sprintf("s%d", s), fmt.Sprintf("c%d", i), "o")
		}
	}
	if c.Len() != 6 || c.Sessions() != 3 {
		t.Fatalf("Len %d Sessions %d, want 6 and 3", c.Len(), c.Sessions())
	}
	c.Lookup("s1", "c1", "")     // s1 recent: s2 is now the oldest
	c.Add("s1", "c1", "another") // an update is not a new pair
	c.Add("s3", "c3", "o")       // 7 pairs: s2 goes whole
	if known, _ := c.Lookup("s2", "c1", ""); known {
		t.Error("s2 survived past Pairs")
	}
	if c.Len() != 5 || c.Sessions() != 2 {
		t.Errorf("Len %d Sessions %d, want 5 and 2", c.Len(), c.Sessions())
	}
	if _, same := c.Lookup("s1", "c1", "another"); !same {
		t.Error("s1/c1 not owned by the update")
	}
	// One session over Pairs loses its oldest pairs, not itself.
	c.Flush("")
	d := NewReplayCache(ReplayCacheOptions{PerSession: 10, Pairs: 3})
	for i := 1; i <= 5; i++ {
		d.Add("s", fmt.Sprintf("c%d", i), "o")
	}
	if known, _ := d.Lookup("s", "c2", ""); known || d.Len() != 3 {
		t.Errorf("Len %d, want 3 with c2 gone", d.Len())
	}
	if known, _ := d.Lookup("s", "c5", ""); !known {
		t.Error("the newest pair was evicted")
	}
	if c.Len() != 0 {
		t.Errorf("Flush all: Len %d", c.Len())
	}
}

// TestReplayCacheDefaults: 10k ids per session (CP-CID), 4096 sessions.
func TestReplayCacheDefaults(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{})
	for i := range DefaultReplayPerSession + 1 {
		c.Add("s", fmt.Sprint(i), "o")
	}
	if c.Len() != DefaultReplayPerSession {
		t.Errorf("Len %d, want %d", c.Len(), DefaultReplayPerSession)
	}
	if known, _ := c.Lookup("s", "0", ""); known {
		t.Error("oldest id kept past the default bound")
	}
	c.Flush("")
	for i := range DefaultReplaySessions + 1 {
		c.Add(fmt.Sprint(i), "c", "o")
	}
	if c.Sessions() != DefaultReplaySessions {
		t.Errorf("Sessions %d, want %d", c.Sessions(), DefaultReplaySessions)
	}
	if known, _ := c.Lookup("0", "c", ""); known {
		t.Error("oldest session kept past the default bound")
	}
}

// TestMemLedgerClaims: the in-memory ledger gives a (session,
// correlation) pair to exactly one tool call, however many claim it at
// once, hands a redelivery its own record back, and forgets a flushed
// session's pairs.
func TestMemLedgerClaims(t *testing.T) {
	l := NewMemLedger()
	const n = 32
	ops := make([]*LedgerOp, n)
	var wg sync.WaitGroup
	for i := range n {
		ops[i] = &LedgerOp{Kind: OpClaimCall, Call: CallKey{SessionID: "s1", CorrelationID: "corr", ToolCallID: fmt.Sprintf("call-%d", i)},
			Pre: PreRecord{Decision: "allow", ReceiptID: fmt.Sprintf("r-%d", i)}}
		wg.Go(func() { l.Do([]*LedgerOp{ops[i]}) })
	}
	wg.Wait()
	var owner *LedgerOp
	for _, op := range ops {
		if op.Won {
			if owner != nil {
				t.Fatalf("%s and %s both won the pair", owner.Call.ToolCallID, op.Call.ToolCallID)
			}
			owner = op
		} else if op.Held.ToolCallID == "" || op.Held.ToolCallID == op.Call.ToolCallID {
			t.Errorf("%s lost to %q", op.Call.ToolCallID, op.Held.ToolCallID)
		}
	}
	if owner == nil {
		t.Fatal("nobody won the pair")
	}
	again := &LedgerOp{Kind: OpClaimCall, Call: owner.Call}
	lookup := &LedgerOp{Kind: OpLookupCall, Call: owner.Call}
	other := &LedgerOp{Kind: OpLookupCall, Call: CallKey{SessionID: "s1", CorrelationID: "corr", ToolCallID: "not-the-owner"}}
	l.Do([]*LedgerOp{again, lookup, other})
	if again.Won || again.Held.ToolCallID != owner.Call.ToolCallID || again.Held.ReceiptID != owner.Pre.ReceiptID {
		t.Errorf("redelivery: won %v held %+v", again.Won, again.Held)
	}
	if !lookup.Found || lookup.Held.ReceiptID != owner.Pre.ReceiptID || other.Found {
		t.Errorf("lookups: %+v %+v", lookup, other)
	}
	l.Flush("other")
	if l.Do([]*LedgerOp{again}); again.Won {
		t.Error("a flush of another session forgot s1")
	}
	l.Flush("s1")
	fresh := &LedgerOp{Kind: OpClaimCall, Call: CallKey{SessionID: "s1", CorrelationID: "corr", ToolCallID: "late"}}
	if l.Do([]*LedgerOp{fresh}); !fresh.Won {
		t.Error("the flushed pair is still held")
	}
	boom := errors.New("kv down")
	l.Err = boom
	failed := &LedgerOp{Kind: OpClaimCall, Call: CallKey{SessionID: "s2", CorrelationID: "c", ToolCallID: "x"}}
	if l.Do([]*LedgerOp{failed}); !errors.Is(failed.Err, boom) || failed.Won {
		t.Errorf("with an error: %+v", failed)
	}
	if _, err := l.LookupApprovals("x"); !errors.Is(err, boom) {
		t.Errorf("LookupApprovals: %v", err)
	}
}

func TestReplayCacheConcurrent(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{PerSession: 50, Sessions: 8})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				s := fmt.Sprintf("s%d", (w+i)%12)
				c.Add(s, fmt.Sprint(i), "o")
				c.Lookup(s, fmt.Sprint(i-1), "o")
				if i%100 == 0 {
					c.Flush(s)
				}
			}
		})
	}
	wg.Wait()
	if c.Sessions() > 8 || c.Len() > 8*50 {
		t.Fatalf("bounds exceeded: %d sessions, %d ids", c.Sessions(), c.Len())
	}
}

// TestPairLRUModel: a session's pointer-free LRU against a plain list in
// order of use, over random adds, gets and removals of the oldest (which
// move the last slot into the freed one).
func TestPairLRUModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		max := 1 + rng.IntN(8)
		l := newPairLRU(max)
		var order []pairKey // most recently used first
		owners := map[pairKey]uint64{}
		touch := func(k pairKey) {
			order = slices.DeleteFunc(order, func(x pairKey) bool { return x == k })
			order = slices.Insert(order, 0, k)
		}
		for step := range 400 {
			k := pairKey{uint64(rng.IntN(12)), 7}
			switch op := rng.IntN(5); {
			case op < 2:
				o := rng.Uint64()
				_, had := owners[k]
				full := !had && len(order) == max
				if added, evicted := l.add(k, o); added == had || evicted != full {
					t.Fatalf("round %d step %d: add reported new %v, evicting %v; had %v, full %v", round, step, added, evicted, had, full)
				}
				if full {
					oldest := order[len(order)-1]
					order = order[:len(order)-1]
					delete(owners, oldest)
				}
				owners[k] = o
				touch(k)
			case op < 4:
				o, ok := l.get(k)
				want, had := owners[k]
				if ok != had || o != want {
					t.Fatalf("round %d step %d: get %v = %d %v, want %d %v", round, step, k, o, ok, want, had)
				}
				if had {
					touch(k)
				}
			default:
				l.removeOldest()
				if len(order) > 0 {
					delete(owners, order[len(order)-1])
					order = order[:len(order)-1]
				}
			}
			if l.len() != len(order) || len(l.slots) != len(order) {
				t.Fatalf("round %d step %d: %d pairs in %d slots, want %d", round, step, l.len(), len(l.slots), len(order))
			}
			// Walk head to tail: the order of use.
			var got []pairKey
			for i := l.head; i >= 0; i = l.slots[i].next {
				got = append(got, l.slots[i].key)
			}
			if !slices.Equal(got, order) {
				t.Fatalf("round %d step %d: order %v, want %v", round, step, got, order)
			}
		}
	}
}

// BenchmarkReplayCacheFull fills a default cache (65,536 pairs in 100
// sessions, ids the length of real ones) and reports what it holds: heap
// MiB and objects, and the time of a collection with it alive.
func BenchmarkReplayCacheFull(b *testing.B) {
	var heapMiB, objects, gcMs float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := NewReplayCache(ReplayCacheOptions{})
		for i := range DefaultReplayPairs {
			c.Add(fmt.Sprintf("sess-%03d-0195f0c2-7a1b-7c3d-9e8f", i%100), fmt.Sprintf("corr-%017d", i),
				fmt.Sprintf("ep-%03d:0195f0c2-7a1b-7c3d-9e8f-%012d", i%100, i))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		start := time.Now()
		runtime.GC()
		gcMs = float64(time.Since(start).Microseconds()) / 1000
		heapMiB = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
		objects = float64(after.HeapObjects - before.HeapObjects)
		if c.Len() != DefaultReplayPairs {
			b.Fatalf("%d pairs, want %d", c.Len(), DefaultReplayPairs)
		}
		runtime.KeepAlive(c)
	}
	b.ReportMetric(heapMiB, "heap-MiB")
	b.ReportMetric(objects, "objects")
	b.ReportMetric(gcMs, "gc-ms")
}
