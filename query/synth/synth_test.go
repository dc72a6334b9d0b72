package synth

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }

// What Write stores verifies: every receipt, chain and checkpoint, with
// progress reported for every row.
func TestWriteVerifies(t *testing.T) {
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := query.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	done := 0
	o := Options{Receipts: 251, Chains: 2, CheckpointEvery: 50, Batch: 60}
	if err := Write(ctx, conn, db, key, o, func(k int) { done += k }); err != nil {
		t.Fatal(err)
	}
	if done != o.Receipts {
		t.Fatalf("progress reported %d rows, want %d", done, o.Receipts)
	}
	rep, err := query.VerifyDatabase(ctx, conn, db, verify.KeySet{key.KID: key.Public()}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 126 and 125 receipts: checkpoints after 50 and 100, and one over the rest.
	if !rep.OK() || rep.Checked != o.Receipts || len(rep.Chains) != 2 || rep.Checkpoints != 6 || rep.Uncovered != 0 {
		t.Fatalf("report: ok %v, %d checked, %d chains, %d checkpoints, %d uncovered: %v",
			rep.OK(), rep.Checked, len(rep.Chains), rep.Checkpoints, rep.Uncovered, rep.Problems)
	}
	if err := Write(ctx, conn, db, key, Options{}, func(int) {}); err == nil {
		t.Fatal("zero options accepted")
	}
}
