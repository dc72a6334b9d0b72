package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// auditFixture is a checkpointed chain of 30 decision receipts (checkpoints
// over 1..10, 11..20, 21..30) and a ToolCallEvent naming receipt 15, all
// stored through the sink.
type auditFixture struct {
	ctx  context.Context
	conn driver.Conn
	db   string
	key  *receipts.PrivateKey
	keys verify.KeySet
	ids  []string // receipt ids by seq-1
	cps  []string // checkpoint ids
	head string   // receipt hash of seq 30
	tcEv string   // the ToolCallEvent's id
}

func newAuditFixture(t *testing.T) *auditFixture {
	t.Helper()
	ctx, conn, db := migrated(t)
	f := &auditFixture{ctx: ctx, conn: conn, db: db, key: testKey(t)}
	f.keys = verify.KeySet{f.key.KID: f.key.Public()}
	ch := receipts.NewChain("w1", f.key)
	var recs []schemas.AuditRecord
	seq := uint64(0)
	for i := 1; i <= 30; i++ {
		seq++
		rec := decisionReceipt(t, ch, "", fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012d", i), seq)
		recs = append(recs, rec)
		f.ids = append(f.ids, eventID(t, rec.Data))
		if i%10 == 0 {
			cp, err := ch.Checkpoint(receipts.Meta{Source: "talos://enforce/w1", Time: tcAt}, false)
			if err != nil {
				t.Fatal(err)
			}
			seq++
			recs = append(recs, schemas.AuditRecord{Subject: schemas.CheckpointSubject("w1"), Data: cp.JSON, StreamSeq: seq})
			f.cps = append(f.cps, cp.ID)
		}
	}
	_, f.head = ch.Head()
	ev := toolCallEvent(t, "0190f5b2-7c1e-7a3b-8d4e-000000000015", tcAt)
	ev.ReceiptID = f.ids[14]
	tc := signed(t, f.key, ev.ToolCallID, tcAt, &ev)
	f.tcEv = eventID(t, tc)
	recs = append(recs, schemas.AuditRecord{Subject: "talos.audit.toolcall.files", Data: tc, StreamSeq: seq + 1})
	if err := NewSinkWriter(conn, db).Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *auditFixture) mutate(t *testing.T, tbl, tail string) {
	t.Helper()
	if err := MutateAndWait(f.ctx, f.conn, f.db, tbl, tail); err != nil {
		t.Fatal(err)
	}
}

// verify is VerifyDatabase's report on the fixture's database, which must
// be the chain-order pass's: the stored-order pass stands only for a
// database it would find clean.
func (f *auditFixture) verify(t *testing.T) verify.Report {
	t.Helper()
	rep, err := VerifyDatabase(f.ctx, f.conn, f.db, f.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	chainOrder, err := VerifyDatabaseWith(f.ctx, f.conn, f.db, f.keys, VerifyOptions{ChainOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rep, chainOrder) {
		t.Fatalf("VerifyDatabase:\n%+v\nin chain order only:\n%+v", rep, chainOrder)
	}
	return rep
}

// problems renders a report's problems as "kind record-id" lines, sorted.
func problems(rep verify.Report) []string {
	var out []string
	for _, p := range rep.Problems {
		out = append(out, p.Kind+" "+p.ReceiptID)
	}
	sort.Strings(out)
	return out
}

func wantProblems(t *testing.T, rep verify.Report, want ...string) {
	t.Helper()
	sort.Strings(want)
	if got := problems(rep); strings.Join(got, "\n") != strings.Join(want, "\n") {
		var full []string
		for _, p := range rep.Problems {
			full = append(full, p.String())
		}
		t.Fatalf("problems:\n  %s\nwant:\n  %s", strings.Join(full, "\n  "), strings.Join(want, "\n  "))
	}
}

// T-VERIFY-1: each kind of tampering with a real
// ClickHouse is named precisely by id; the untouched database passes.
func TestVerifyDatabaseTamperCases(t *testing.T) {
	t.Run("untouched", func(t *testing.T) {
		f := newAuditFixture(t)
		rep := f.verify(t)
		if !rep.OK() || rep.Checked != 30 || rep.CheckpointsSeen != 3 || rep.Checkpoints != 3 || rep.Uncovered != 0 || rep.Chains["w1"].CheckpointedTo != 30 {
			t.Fatalf("untouched database: %+v", rep)
		}
	})
	t.Run("column edited", func(t *testing.T) {
		f := newAuditFixture(t)
		f.mutate(t, TableReceipts, "UPDATE decision = 'deny' WHERE receipt_id = '"+f.ids[6]+"'")
		rep := f.verify(t)
		wantProblems(t, rep, ProblemAlteredColumn+" "+f.ids[6])
		if p := rep.Problems[0]; p.Seq != 7 || !strings.HasSuffix(p.Detail, ": decision") || Category(p.Kind) != verify.CategoryAltered {
			t.Fatalf("%s", p)
		}
	})
	t.Run("signed JSON edited", func(t *testing.T) {
		f := newAuditFixture(t)
		f.mutate(t, TableReceipts, `UPDATE cloudevent = replaceOne(cloudevent, '"decision":"allow"', '"decision":"deny"') WHERE receipt_id = '`+f.ids[11]+"'")
		rep := f.verify(t)
		// One problem: the signature. Its checkpoint cannot be compared
		// (counted, not reported again).
		wantProblems(t, rep, verify.ProblemBadSignature+" "+f.ids[11])
		if rep.Checkpoints != 2 || rep.CheckpointsUnchecked != 1 {
			t.Fatalf("checkpoints verified %d, unchecked %d", rep.Checkpoints, rep.CheckpointsUnchecked)
		}
	})
	t.Run("row deleted", func(t *testing.T) {
		f := newAuditFixture(t)
		f.mutate(t, TableReceipts, "DELETE WHERE receipt_id = '"+f.ids[14]+"'")
		rep := f.verify(t)
		// The gap, at the receipt after it; and the deleted receipt by its
		// id, from the ToolCallEvent that names it.
		wantProblems(t, rep, verify.ProblemChainGap+" "+f.ids[15], ProblemMissingReceipt+" "+f.ids[14])
		for _, p := range rep.Problems {
			if Category(p.Kind) != verify.CategoryMissing {
				t.Fatalf("%s is not 'missing'", p)
			}
			if p.Kind == verify.ProblemChainGap && !strings.Contains(p.Detail, "seq 15 missing") {
				t.Fatalf("%s", p)
			}
			if p.Kind == ProblemMissingReceipt && !strings.Contains(p.Detail, f.tcEv) {
				t.Fatalf("%s", p)
			}
		}
	})
	t.Run("tail deleted", func(t *testing.T) {
		f := newAuditFixture(t)
		f.mutate(t, TableReceipts, "DELETE WHERE chain_seq >= 29")
		rep := f.verify(t)
		// Only the last checkpoint knows seq 29 and 30 existed.
		wantProblems(t, rep, verify.ProblemChainGap+" "+f.cps[2])
		if p := rep.Problems[0]; !strings.Contains(p.Detail, "seq 29..30 missing after receipt "+f.ids[27]) {
			t.Fatalf("%s", p)
		}
	})
	t.Run("forged row by an untrusted key", func(t *testing.T) {
		f := newAuditFixture(t)
		forger := testKey(t)
		ch, err := receipts.ResumeChain("w1", forger, 30, f.head)
		if err != nil {
			t.Fatal(err)
		}
		rec := decisionReceipt(t, ch, "", "0190f5b2-7c1e-7a3b-8d4e-999999999999", 99)
		if err := NewSinkWriter(f.conn, f.db).Write(f.ctx, []schemas.AuditRecord{rec}); err != nil {
			t.Fatal(err)
		}
		rep := f.verify(t)
		wantProblems(t, rep, verify.ProblemUnknownKey+" "+eventID(t, rec.Data))
		if p := rep.Problems[0]; p.Seq != 31 || Category(p.Kind) != verify.CategoryForeign || !strings.Contains(p.Detail, forger.KID) {
			t.Fatalf("%s", p)
		}
	})
	t.Run("two rows' seq swapped", func(t *testing.T) {
		f := newAuditFixture(t)
		f.mutate(t, TableReceipts, fmt.Sprintf("UPDATE chain_seq = if(chain_seq = 5, 6, 5) WHERE receipt_id IN ('%s', '%s')", f.ids[4], f.ids[5]))
		rep := f.verify(t)
		// Both named; verified at their signed places, so no gap, no
		// out-of-order link and every checkpoint still verifies.
		wantProblems(t, rep, ProblemReordered+" "+f.ids[4], ProblemReordered+" "+f.ids[5])
		if rep.Checkpoints != 3 || !strings.Contains(rep.Problems[0].Detail+rep.Problems[1].Detail, "stored at chain w1 seq 6, but signed as chain w1 seq 5") {
			t.Fatalf("%+v", rep)
		}
	})
	t.Run("duplicate with other content", func(t *testing.T) {
		f := newAuditFixture(t)
		// A second row for receipt 3 whose JSON was re-signed by the real
		// key with other content: two rows for one id.
		ch, err := receipts.ResumeChain("w1", f.key, 2, receiptHashAt(t, f, 2))
		if err != nil {
			t.Fatal(err)
		}
		rec := decisionReceipt(t, ch, f.ids[2], "0190f5b2-7c1e-7a3b-8d4e-000000000777", 98)
		if err := NewSinkWriter(f.conn, f.db).Write(f.ctx, []schemas.AuditRecord{rec}); err != nil {
			t.Fatal(err)
		}
		rep := f.verify(t)
		var cats []string
		for _, p := range rep.Problems {
			cats = append(cats, Category(p.Kind))
		}
		// The copy conflicts with the stored row (duplicated); as a second
		// link at seq 3 it is a fork, and the first checkpoint's root
		// cannot hold for both.
		if !strings.Contains(strings.Join(problems(rep), "\n"), ProblemConflictingCopies+" "+f.ids[2]) ||
			!strings.Contains(strings.Join(cats, " "), verify.CategoryDuplicated) {
			t.Fatalf("%v", rep.Problems)
		}
	})
	t.Run("checkpoint column and JSON edited", func(t *testing.T) {
		f := newAuditFixture(t)
		f.mutate(t, TableCheckpoints, "UPDATE root_hash = '"+strings.Repeat("0", 64)+"' WHERE checkpoint_id = '"+f.cps[0]+"'")
		f.mutate(t, TableCheckpoints, `UPDATE cloudevent = replaceOne(cloudevent, '"tree_size":10', '"tree_size":11') WHERE checkpoint_id = '`+f.cps[1]+"'")
		rep := f.verify(t)
		// The edited JSON no longer verifies, so checkpoint 3 follows a
		// missing checkpoint 2.
		wantProblems(t, rep, ProblemAlteredColumn+" "+f.cps[0], verify.ProblemBadSignature+" "+f.cps[1],
			verify.ProblemCheckpointGap+" "+f.cps[2])
	})
}

func receiptHashAt(t *testing.T, f *auditFixture, seq uint64) string {
	t.Helper()
	var h string
	if err := f.conn.QueryRow(f.ctx, "SELECT receipt_hash FROM `"+f.db+"`.receipts WHERE chain_seq = ?", seq).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

// T-PROOF: one receipt's inclusion proof, built from ClickHouse,
// verifies offline with only the checkpoint and the public key.
func TestProveReceipt(t *testing.T) {
	f := newAuditFixture(t)
	proof, res, err := ProveReceipt(f.ctx, f.conn, f.db, f.ids[16], f.keys)
	if err != nil {
		t.Fatal(err)
	}
	if res.Seq != 17 || res.CheckpointSeq != 2 || res.FromSeq != 11 || res.ToSeq != 20 || proof.LeafIndex != 6 || len(proof.AuditPath) != 4 {
		t.Fatalf("%+v %+v", res, proof)
	}
	// Offline: the serialized proof and the public key only.
	b, _ := json.Marshal(proof)
	var back verify.Proof
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if _, err := verify.VerifyProof(&back, verify.KeySet{f.key.KID: f.key.Public()}); err != nil {
		t.Fatal(err)
	}
	// A receipt after the last checkpoint has no proof yet.
	ch, _ := receipts.ResumeChain("w1", f.key, 30, f.head)
	rec := decisionReceipt(t, ch, "", "0190f5b2-7c1e-7a3b-8d4e-000000000031", 99)
	if err := NewSinkWriter(f.conn, f.db).Write(f.ctx, []schemas.AuditRecord{rec}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ProveReceipt(f.ctx, f.conn, f.db, eventID(t, rec.Data), f.keys); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("receipt after the last checkpoint: %v", err)
	}
	// A receipt of the range deleted: the proof cannot be built.
	f.mutate(t, TableReceipts, "DELETE WHERE receipt_id = '"+f.ids[12]+"'")
	if _, _, err := ProveReceipt(f.ctx, f.conn, f.db, f.ids[16], f.keys); err == nil || !strings.Contains(err.Error(), "seq 13 is not stored") {
		t.Fatalf("range with a deleted receipt: %v", err)
	}
}
