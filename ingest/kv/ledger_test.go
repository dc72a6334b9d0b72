package kv_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/testenv"
)

func newLedger(t testing.TB, js jetstream.JetStream, o kv.LedgerOptions) *kv.Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := kv.NewLedger(ctx, js, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// claimOp is the pair claim of call, sent by enforcement point gw, with a
// record naming receipt "r-<call>".
func claimOp(session, corr, call string) *enforce.LedgerOp {
	return &enforce.LedgerOp{Kind: enforce.OpClaimCall,
		Call: enforce.CallKey{EPID: "gw", SessionID: session, CorrelationID: corr, ToolCallID: call},
		Pre:  enforce.PreRecord{Decision: "allow", ReceiptID: "r-" + call, DecidedAt: "2026-11-25T00:00:00.000Z"}}
}

// claim claims (session, corr) for call and checks who holds it after.
func claim(t testing.TB, l *kv.Ledger, session, corr, call, want string) {
	t.Helper()
	op := claimOp(session, corr, call)
	l.Do([]*enforce.LedgerOp{op})
	if op.Err != nil {
		t.Fatal(op.Err)
	}
	owner := call
	if !op.Won {
		owner = op.Held.ToolCallID
		if op.Held.ReceiptID != "r-"+owner {
			t.Fatalf("the holder's record names receipt %q, want r-%s", op.Held.ReceiptID, owner)
		}
	}
	if owner != want {
		t.Fatalf("claim(%s, %s, %s): held by %s, want %s", session, corr, call, owner, want)
	}
}

func check(t testing.TB, l *kv.Ledger, session, corr, wantOwner string) {
	t.Helper()
	owner, seen, err := l.Check(context.Background(), session, corr)
	if err != nil {
		t.Fatal(err)
	}
	if wantOwner != "" {
		wantOwner = "gw:" + wantOwner
	}
	if seen != (wantOwner != "") || owner != wantOwner {
		t.Fatalf("Check(%s, %s) = %q, %v; want %q", session, corr, owner, seen, wantOwner)
	}
}

func pairKeys(t testing.TB, l *kv.Ledger) uint64 {
	t.Helper()
	st, err := l.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Keys
}

// TestLedgerPairsAcrossWorkers runs two ledgers on two connections over
// the same bucket, as two workers do: a (session, correlation) pair is held
// by the first call that claims it, a redelivery gets its own record back,
// racing claimants agree on one winner, and flushes forget only what they
// name.
func TestLedgerPairsAcrossWorkers(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js1 := testenv.ConnectJS(t, ns.URL())
	_, js2 := testenv.ConnectJS(t, ns.URL())
	w1 := newLedger(t, js1, kv.LedgerOptions{})
	w2 := newLedger(t, js2, kv.LedgerOptions{})

	claim(t, w1, "sess-a", "corr-1", "call-1", "call-1") // first claim wins
	claim(t, w2, "sess-a", "corr-1", "call-2", "call-1") // a replay, seen by the other worker
	claim(t, w1, "sess-a", "corr-1", "call-1", "call-1") // the same call again (redelivery)
	claim(t, w2, "sess-a", "corr-1", "call-1", "call-1") // ... on the other worker
	claim(t, w2, "sess-b", "corr-1", "call-3", "call-3") // same correlation id, other session
	claim(t, w2, "sess-a", "corr-2", "call-4", "call-4")
	check(t, w2, "sess-a", "corr-1", "call-1")
	check(t, w1, "sess-b", "corr-1", "call-3")
	check(t, w1, "sess-c", "corr-1", "")

	// The pre decision a claim recorded is what a post event finds, on
	// either worker, under its own call only.
	found := &enforce.LedgerOp{Kind: enforce.OpLookupCall, Call: enforce.CallKey{EPID: "gw", SessionID: "sess-a", CorrelationID: "corr-1", ToolCallID: "call-1"}}
	other := &enforce.LedgerOp{Kind: enforce.OpLookupCall, Call: enforce.CallKey{EPID: "gw", SessionID: "sess-a", CorrelationID: "corr-1", ToolCallID: "call-2"}}
	otherEP := &enforce.LedgerOp{Kind: enforce.OpLookupCall, Call: enforce.CallKey{EPID: "gw-2", SessionID: "sess-a", CorrelationID: "corr-1", ToolCallID: "call-1"}}
	w2.Do([]*enforce.LedgerOp{found, other, otherEP})
	if found.Err != nil || !found.Found || found.Held.ReceiptID != "r-call-1" || found.Held.ToolCallID != "call-1" || found.Held.EPID != "gw" {
		t.Fatalf("lookup of call-1: %+v", found)
	}
	if other.Err != nil || other.Found {
		t.Fatalf("lookup of call-2, which never held the pair: %+v", other)
	}
	if otherEP.Err != nil || otherEP.Found {
		t.Fatalf("lookup of another enforcement point's call-1: %+v", otherEP)
	}
	// Another enforcement point's call with the same tool_call_id is not
	// a redelivery: the pair stays gw's.
	spoof := claimOp("sess-a", "corr-1", "call-1")
	spoof.Call.EPID = "gw-2"
	if w2.Do([]*enforce.LedgerOp{spoof}); spoof.Err != nil || spoof.Won || spoof.Held.EPID != "gw" || spoof.Held.ToolCallID != "call-1" {
		t.Fatalf("gw-2's claim with gw's tool_call_id: %+v", spoof)
	}
	update := &enforce.LedgerOp{Kind: enforce.OpUpdateCall, Call: found.Call, Pre: enforce.PreRecord{Decision: "deny", ReceiptID: "r-call-1"}}
	if w1.Do([]*enforce.LedgerOp{update}); update.Err != nil {
		t.Fatal(update.Err)
	}
	w1.Do([]*enforce.LedgerOp{found})
	if found.Held.Decision != "deny" {
		t.Fatalf("after the update: %+v", found.Held)
	}

	// Many claimants at once, across both workers and in one batch:
	// exactly one wins and everyone agrees on it.
	var wg sync.WaitGroup
	ops := make([]*enforce.LedgerOp, 16)
	for i := range ops {
		ops[i] = claimOp("sess-race", "corr-race", fmt.Sprintf("call-r%d", i))
	}
	for half, l := range []*kv.Ledger{w1, w2} {
		wg.Add(1)
		go func() { defer wg.Done(); l.Do(ops[half*8 : half*8+8]) }()
	}
	wg.Wait()
	var winner string
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
		if op.Won {
			if winner != "" {
				t.Fatalf("%s and %s both won", winner, op.Call.ToolCallID)
			}
			winner = op.Call.ToolCallID
		}
	}
	for _, op := range ops {
		if !op.Won && op.Held.ToolCallID != winner {
			t.Fatalf("%s saw holder %q, the winner is %q", op.Call.ToolCallID, op.Held.ToolCallID, winner)
		}
	}

	st, err := w1.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Keys != 4 || st.Bytes == 0 || st.Window != "24h0m0s" {
		t.Fatalf("stats %+v, want 4 pairs in a 24 h window", st)
	}

	// Flush one session: only its pairs go.
	if err := w2.Flush(context.Background(), "sess-a"); err != nil {
		t.Fatal(err)
	}
	check(t, w1, "sess-a", "corr-1", "")
	check(t, w1, "sess-a", "corr-2", "")
	check(t, w1, "sess-b", "corr-1", "call-3")
	check(t, w1, "sess-race", "corr-race", winner)
	if n := pairKeys(t, w1); n != 2 {
		t.Fatalf("%d pairs after flushing a session, want 2", n)
	}
	claim(t, w1, "sess-a", "corr-1", "call-5", "call-5") // claimable again

	// Flush everything.
	if err := w1.Flush(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	if n := pairKeys(t, w2); n != 0 {
		t.Fatalf("%d pairs after flushing all", n)
	}
	check(t, w2, "sess-b", "corr-1", "")
	claim(t, w2, "sess-b", "corr-1", "call-6", "call-6")
}

// TestLedgerIdempotencyAndApprovals: racing claims of one idempotency key
// from two workers have one winner that every loser sees, and a call
// recorded for approval is found by its tool_call_id on the other worker.
func TestLedgerIdempotencyAndApprovals(t *testing.T) {
	url := testenv.NATSForTest(t).URL()
	var ledgers [2]*kv.Ledger
	for i := range ledgers {
		_, js := testenv.ConnectJS(t, url)
		ledgers[i] = newLedger(t, js, kv.LedgerOptions{})
	}
	key := enforce.IdempotencyKey("agent-a", "files", "write_file", "k1")
	ops := make([]*enforce.LedgerOp, 16)
	var wg sync.WaitGroup
	for i := range ops {
		ops[i] = &enforce.LedgerOp{Kind: enforce.OpClaimIdempotency, IdemKey: key,
			Idem: enforce.IdemRecord{RequestHash: "h", ToolCallID: fmt.Sprintf("call-%d", i), ReceiptID: fmt.Sprintf("r-%d", i)}}
		wg.Add(1)
		go func() { defer wg.Done(); ledgers[i%2].Do(ops[i : i+1]) }()
	}
	wg.Wait()
	var winner *enforce.LedgerOp
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
		if op.Won {
			if winner != nil {
				t.Fatal("two claims of one idempotency key won")
			}
			winner = op
		}
	}
	if winner == nil {
		t.Fatal("no claim won")
	}
	for _, op := range ops {
		if !op.Won && op.HeldIdem != winner.Idem {
			t.Fatalf("a loser saw %+v, the winner holds %+v", op.HeldIdem, winner.Idem)
		}
	}

	const parked = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e"
	rec := enforce.PreRecord{Decision: "require_approval", ReceiptID: "r1", DecidedAt: "2026-11-25T00:00:00.000Z"}
	put := &enforce.LedgerOp{Kind: enforce.OpRecordApproval, Call: enforce.CallKey{EPID: "gw", ToolCallID: parked}, Pre: rec}
	put2 := &enforce.LedgerOp{Kind: enforce.OpRecordApproval, Call: enforce.CallKey{EPID: "gw-2", ToolCallID: parked}, Pre: enforce.PreRecord{Decision: "require_approval", ReceiptID: "r2"}}
	if ledgers[0].Do([]*enforce.LedgerOp{put, put2}); put.Err != nil || put2.Err != nil {
		t.Fatal(put.Err, put2.Err)
	}
	got, err := ledgers[1].LookupApprovals(parked)
	if err != nil || len(got) != 2 || got["gw"].ReceiptID != "r1" || got["gw"].Decision != "require_approval" || got["gw-2"].ReceiptID != "r2" {
		t.Fatalf("approval lookup on the other worker: %+v %v", got, err)
	}
	if got, err := ledgers[1].LookupApprovals("0190f5b2-7c1e-7a3b-8d4e-000000000000"); len(got) != 0 || err != nil {
		t.Fatalf("found an approval that was never recorded: %+v %v", got, err)
	}
	if got, err := ledgers[1].LookupApprovals("a.b"); len(got) != 0 || err != nil {
		t.Fatalf("a tool_call_id that cannot be a key: %v %v", got, err)
	}
}

// TestLedgerDeletedKey: a pair whose last message is a delete or purge
// marker (an operator removed the key) is claimable again, still only once.
func TestLedgerDeletedKey(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	l := newLedger(t, js, kv.LedgerOptions{})
	ctx := context.Background()
	bucket, err := js.KeyValue(ctx, kv.LedgerBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := func(call string) string {
		return kv.CallRecordKey(enforce.CallKey{EPID: "gw", SessionID: "sess", CorrelationID: "corr", ToolCallID: call})
	}
	claim(t, l, "sess", "corr", "call-a", "call-a")
	if err := bucket.Delete(ctx, key("call-a")); err != nil {
		t.Fatal(err)
	}
	check(t, l, "sess", "corr", "")
	claim(t, l, "sess", "corr", "call-b", "call-b")
	claim(t, l, "sess", "corr", "call-c", "call-b")

	if err := bucket.Purge(ctx, key("call-b")); err != nil {
		t.Fatal(err)
	}
	check(t, l, "sess", "corr", "")
	// Claimants racing on the removed pair: one wins.
	ops := make([]*enforce.LedgerOp, 8)
	for i := range ops {
		ops[i] = claimOp("sess", "corr", fmt.Sprintf("call-r%d", i))
	}
	l.Do(ops)
	won := 0
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
		if op.Won {
			won++
		}
	}
	if won != 1 {
		t.Fatalf("%d claimants of a removed pair won, want 1", won)
	}
}

func TestLedgerWindowExpiry(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	l := newLedger(t, js, kv.LedgerOptions{Window: time.Second})
	claim(t, l, "sess", "corr", "call-a", "call-a")
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, seen, err := l.Check(context.Background(), "sess", "corr")
		if err != nil {
			t.Fatal(err)
		}
		if !seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("claim never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Older than the window: the correlation id may be used again.
	claim(t, l, "sess", "corr", "call-b", "call-b")
}

func TestLedgerSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown) // safe after the Shutdown below
	port := ns.NATS().Addr().(*net.TCPAddr).Port
	_, js := testenv.ConnectJS(t, ns.URL())
	l := newLedger(t, js, kv.LedgerOptions{})
	claim(t, l, "sess", "corr", "call-a", "call-a")
	ns.Shutdown()

	ns2, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns2.Shutdown)
	_, js2 := testenv.ConnectJS(t, ns2.URL())
	l2 := newLedger(t, js2, kv.LedgerOptions{}) // a restarted worker
	claim(t, l2, "sess", "corr", "call-b", "call-a")
	check(t, l2, "sess", "corr", "call-a")
	// The old ledger's connection reconnects and sees the same record.
	deadline := time.Now().Add(30 * time.Second)
	for {
		op := claimOp("sess", "corr", "call-c")
		l.Do([]*enforce.LedgerOp{op})
		if op.Err == nil {
			if op.Won || op.Held.ToolCallID != "call-a" {
				t.Fatalf("after restart: %+v", op)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("old ledger after restart: %v", op.Err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLedgerInputAndOptions(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	l := newLedger(t, js, kv.LedgerOptions{Memory: true, Window: time.Hour})
	for _, call := range []string{"", "a.b", "a*", "a>", string(make([]byte, 129))} {
		op := claimOp("s", "c", call)
		if l.Do([]*enforce.LedgerOp{op}); op.Err == nil || op.Won {
			t.Errorf("claim by tool_call_id %q: %+v", call, op)
		}
	}
	if _, _, err := l.Check(context.Background(), "s", ""); err == nil {
		t.Error("Check without a correlation id")
	}
	if st, err := l.Stats(context.Background()); err != nil || st.Window != "1h0m0s" || st.Keys != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	// A ledger re-opened with other options updates the bucket.
	l2 := newLedger(t, js, kv.LedgerOptions{Memory: true, Window: 2 * time.Hour})
	bucket, err := js.KeyValue(context.Background(), kv.LedgerBucket)
	if err != nil {
		t.Fatal(err)
	}
	status, err := bucket.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if status.TTL() != 2*time.Hour || status.History() != 1 || l2.Window() != 2*time.Hour {
		t.Fatalf("bucket TTL %v history %d", status.TTL(), status.History())
	}
	if _, err := kv.NewLedger(context.Background(), js, kv.LedgerOptions{}); err == nil {
		t.Fatal("a file ledger opened over a memory bucket")
	}
}

// BenchmarkLedgerClaims measures pair claims, one per Do (a round trip
// each) and a batch of 16 per Do (one round trip for the batch).
func BenchmarkLedgerClaims(b *testing.B) {
	for _, batch := range []int{1, 16} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ns := testenv.NATSForTest(b)
			_, js := testenv.ConnectJS(b, ns.URL())
			l := newLedger(b, js, kv.LedgerOptions{})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				ops := make([]*enforce.LedgerOp, batch)
				for k := range ops {
					ops[k] = claimOp("bench-session", fmt.Sprintf("corr-%d", i+k), fmt.Sprintf("call-%d", i+k))
				}
				l.Do(ops)
				for _, op := range ops {
					if op.Err != nil || !op.Won {
						b.Fatal(op.Err)
					}
				}
			}
		})
	}
}
