package query

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// The pass in stored order (verifyStoredOrder) stands for a clean
// database whatever order its chains' rows are stored in, as long as it
// can hold back the rows that come before their turn; with fewer, or with
// a receipt stored twice (a redelivery before a merge), it gives way, and
// VerifyDatabase returns the chain-order pass's report.
func TestVerifyStoredOrder(t *testing.T) {
	ctx, conn, db := migrated(t)
	key := testKey(t)
	keys := verify.KeySet{key.KID: key.Public()}
	// Two chains of 30 whose receipt ids fall as their seq rises: ClickHouse
	// stores each chain last link first, chain w1 before w2.
	var recs []schemas.AuditRecord
	for c, chain := range []string{"w1", "w2"} {
		ch := receipts.NewChain(chain, key)
		for i := 1; i <= 30; i++ {
			id := fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%d%011d", c+1, 100-i)
			tcid := fmt.Sprintf("0190f5b2-7c1e-7a3b-9d4e-%d%011d", c+1, i)
			recs = append(recs, decisionReceipt(t, ch, id, tcid, uint64(len(recs)+1)))
		}
	}
	if err := NewSinkWriter(conn, db).Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	chainOrder, err := VerifyDatabaseWith(ctx, conn, db, keys, VerifyOptions{ChainOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	if !chainOrder.OK() || chainOrder.Checked != 60 || len(chainOrder.Chains) != 2 {
		t.Fatalf("chain order: %+v", chainOrder)
	}

	// A chain's 29 rows after seq 1 wait for it.
	rep, ok, err := verifyStoredOrder(ctx, conn, db, keys, VerifyOptions{}, 29)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("the stored-order pass gave way on a clean database it could hold back enough of")
	}
	if !reflect.DeepEqual(rep, chainOrder) {
		t.Fatalf("stored order:\n%+v\nchain order:\n%+v", rep, chainOrder)
	}
	if _, ok, err := verifyStoredOrder(ctx, conn, db, keys, VerifyOptions{}, 28); err != nil || ok {
		t.Fatalf("holding back at most 28 rows of a chain stored last link first: ok %v, err %v", ok, err)
	}

	// A second, identical copy of one receipt (merges stopped, so it stays
	// a second row): one receipt to the chain-order pass, a repeated seq to
	// the stored-order one.
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES `"+db+"`.receipts"); err != nil {
		t.Fatal(err)
	}
	if err := NewSinkWriter(conn, db).Write(ctx, recs[4:5]); err != nil {
		t.Fatal(err)
	}
	var rows uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM `"+db+"`.receipts").Scan(&rows); err != nil || rows != 61 {
		t.Fatalf("rows stored: %d, %v; want 61", rows, err)
	}
	if _, ok, err := verifyStoredOrder(ctx, conn, db, keys, VerifyOptions{}, storedOrderHold); err != nil || ok {
		t.Fatalf("a receipt stored twice: ok %v, err %v", ok, err)
	}
	got, err := VerifyDatabase(ctx, conn, db, keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, chainOrder) {
		t.Fatalf("with a copy stored twice:\n%+v\nwant the chain-order report:\n%+v", got, chainOrder)
	}
}
