package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

func TestEncodeDecisionSplicesReceipt(t *testing.T) {
	d := &schemas.Decision{ToolCallID: "t", Phase: "pre", Decision: "deny", ReasonCodes: []string{"X"},
		ReceiptID: "r", Receipt: json.RawMessage(`{"id":"r","data":{"receipt":null}}`), Details: []string{`say "receipt":null`}}
	b := appendDecision(nil, d)
	var back schemas.Decision
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if string(back.Receipt) != string(d.Receipt) || back.Details[0] != d.Details[0] || back.Decision != "deny" {
		t.Fatalf("round trip: %s", b)
	}
}

// TestEncodeDecisionAsJSON: the hand-written encoding decodes to what
// json.Marshal's does, for odd strings, empty and nil lists, no receipt.
func TestEncodeDecisionAsJSON(t *testing.T) {
	for _, d := range []*schemas.Decision{
		{ToolCallID: "t\"1\\", Phase: "pre", Decision: "allow", ReasonCodes: []string{}, ReceiptID: "r<&>", RegistryDigest: "sha256:ab",
			Receipt: json.RawMessage(`{"id":"r"}`)},
		{ToolCallID: "t", Phase: "post", Decision: "deny", ReasonCodes: nil, Details: []string{"a\nb", "\u2028", "\x00", "é"}},
		{Decision: "require_approval", ReasonCodes: []string{"APPROVAL_REQUIRED", "\xff"}},
	} {
		got := appendDecision(nil, d)
		// Into a recycled buffer that held a longer reply: the same bytes.
		used := appendDecision(nil, &schemas.Decision{Receipt: json.RawMessage(`"` + strings.Repeat("x", 4000) + `"`)})
		if again := appendDecision(used[:0], d); string(again) != string(got) {
			t.Errorf("into a used buffer %s\nfresh %s", again, got)
		}
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%v: %s", err, got)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("appendDecision %s\njson.Marshal   %s", got, want)
		}
	}
}

// TestDrainContext: the drain context outlives its parent by the drain
// period, and stop ends it at once.
func TestDrainContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dctx, stop := drainContext(ctx, 200*time.Millisecond)
	defer stop()
	cancel()
	time.Sleep(50 * time.Millisecond)
	if dctx.Err() != nil {
		t.Fatal("the drain context ended with its parent")
	}
	select {
	case <-dctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the drain context did not end after the drain period")
	}

	dctx, stop = drainContext(context.Background(), time.Hour)
	stop()
	if dctx.Err() == nil {
		t.Fatal("stop did not end the drain context")
	}
}

// TestLanes: chains are dealt into lanes of size, in order, the last one
// short; each lane is its own slice (appending to one cannot write into
// the next).
func TestLanes(t *testing.T) {
	var chains []*receipts.Chain
	for i := range 35 {
		chains = append(chains, receipts.NewChain(fmt.Sprintf("c-%d", i), nil))
	}
	got := lanes(chains, 16)
	if len(got) != 3 || len(got[0]) != 16 || len(got[1]) != 16 || len(got[2]) != 3 {
		t.Fatalf("lanes of %d, %d, %d (%d lanes), want 16, 16, 3", len(got[0]), len(got[1]), len(got[len(got)-1]), len(got))
	}
	if got[1][0] != chains[16] || got[2][2] != chains[34] {
		t.Fatal("chains out of order")
	}
	if cap(got[0]) != 16 {
		t.Fatalf("a lane of 16 has capacity %d", cap(got[0]))
	}
	if one := lanes(chains[:1], 16); len(one) != 1 || len(one[0]) != 1 {
		t.Fatalf("one chain: %d lanes", len(one))
	}
	if none := lanes(nil, 16); len(none) != 0 {
		t.Fatalf("no chains: %d lanes", len(none))
	}
}
