package ingest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/testenv"
)

// TestLedgerHoldsAcrossWorkers: two workers (two connections, two
// ledgers on one bucket) race to claim one idempotency key; exactly one
// wins, the other sees the winner, and a pre decision recorded by one is
// found by the other.
func TestLedgerHoldsAcrossWorkers(t *testing.T) {
	url := testenv.NATSForTest(t).URL()
	ctx := context.Background()
	var ledgers [2]*ingest.Ledger
	for i := range ledgers {
		_, js := connectJS(t, url)
		l, err := ingest.NewLedger(ctx, js, ingest.LedgerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ledgers[i] = l
	}
	key := enforce.IdempotencyKey("agent-a", "files", "write_file", "k1")
	const racers = 16
	var wg sync.WaitGroup
	wins := make(chan enforce.IdemRecord, racers)
	held := make(chan enforce.IdemRecord, racers)
	for i := 0; i < racers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rec := enforce.IdemRecord{RequestHash: "h", ToolCallID: "call-" + string(rune('a'+i))}
			h, claimed, err := ledgers[i%2].ClaimIdempotency(key, rec)
			if err != nil {
				t.Error(err)
				return
			}
			if claimed {
				wins <- rec
			} else {
				held <- h
			}
		}(i)
	}
	wg.Wait()
	close(wins)
	close(held)
	if len(wins) != 1 {
		t.Fatalf("%d claims won, want exactly 1", len(wins))
	}
	winner := <-wins
	for h := range held {
		if h.ToolCallID != winner.ToolCallID {
			t.Fatalf("a loser saw holder %s, the winner was %s", h.ToolCallID, winner.ToolCallID)
		}
	}
	if err := ledgers[0].RecordPre("0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", enforce.PreRecord{Decision: "allow", ReceiptID: "r1"}); err != nil {
		t.Fatal(err)
	}
	rec, found, err := ledgers[1].LookupPre("0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e")
	if err != nil || !found || rec.ReceiptID != "r1" {
		t.Fatalf("lookup on the other worker: %+v %v %v", rec, found, err)
	}
	if _, found, _ := ledgers[1].LookupPre("0190f5b2-7c1e-7a3b-8d4e-000000000000"); found {
		t.Fatal("found a pre decision that was never recorded")
	}
}
