package ingest_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// A refusal receipt that counts the receipts the rate limit suppressed
// before it goes through the sink into ClickHouse like any control
// receipt: control_events and receipts have it, its stored bytes verify,
// and the whole database verifies.
func TestControlRefusalReceiptCountInClickHouse(t *testing.T) {
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := query.Open(ctx, addr, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := query.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	nc, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	key, keys := newSigner(t)
	responder, responders := newSigner(t)
	var offset atomic.Int64 // added to the control service's clock
	svc, err := control.NewControlService(nc, js, control.ControlOptions{
		Chain: receipts.NewChain("refusals-control", key), Source: "talos://control/refusals", ResponderKeys: responders,
		RefusalLimits: control.RefusalLimits{Rate: rate.Every(time.Minute), Burst: 2},
		Now:           func() time.Time { return time.Now().Add(time.Duration(offset.Load())) },
	})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := ingest.NewSink(js, query.NewSinkWriter(conn, db), ingest.SinkOptions{BatchAge: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Registered last, so the service and the sink stop before their
	// connections close.
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, run := range []func(context.Context) error{svc.Run, sink.Run} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = run(ctx) }()
	}

	alice := control.NewControlClient(nc, responder, "alice")
	invalid := func() *schemas.ControlCommand { return alice.NewCommand(schemas.VerbKillSwitchSet) } // no scope, no reason
	for i := range 4 {
		r := do(t, alice, invalid())
		if r.OK || r.Code != schemas.CtlInvalid || (r.ReceiptID != "") != (i < 2) || r.ReceiptSuppressed != (i >= 2) {
			t.Fatalf("refusal %d: %+v", i, r)
		}
	}
	offset.Add(int64(time.Minute))
	r := do(t, alice, invalid())
	if r.ReceiptID == "" || r.ReceiptSuppressed {
		t.Fatalf("refusal a minute later: %+v", r)
	}

	// control_events has the three receipted refusals; the last one's
	// stored event is the receipt that counts the two suppressed.
	var stored []string
	testenv.WaitFor(t, 60*time.Second, func() bool {
		rows, err := query.ControlEvents(ctx, conn, db, 0)
		stored = stored[:0]
		for _, row := range rows {
			if !row.Accepted && row.ResponderKID == responder.KID && row.Code == schemas.CtlInvalid {
				stored = append(stored, row.EventID)
			}
		}
		return err == nil && len(stored) >= 3
	})
	if len(stored) != 3 || !slices.Contains(stored, r.ReceiptID) {
		t.Fatalf("control_events has alice's refusals %v; want 3, %s among them", stored, r.ReceiptID)
	}
	var raw string
	testenv.WaitFor(t, 60*time.Second, func() bool {
		return conn.QueryRow(ctx, "SELECT cloudevent FROM "+db+".v_receipts WHERE receipt_id = ?", r.ReceiptID).Scan(&raw) == nil
	})
	ev, err := verify.VerifyEvent([]byte(raw), keys)
	if err != nil {
		t.Fatalf("the receipt stored in ClickHouse: %v", err)
	}
	if c := ev.Data.Control; c == nil || c.SuppressedBefore != 2 || c.Code != schemas.CtlInvalid || c.ResponderKID != responder.KID {
		t.Fatalf("stored receipt %s", raw)
	}
	rep, err := query.VerifyDatabase(ctx, conn, db, keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("database does not verify: %v", rep.Problems)
	}
}
