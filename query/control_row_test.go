package query

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// controlReceipt signs one control receipt into ch.
func controlReceipt(t *testing.T, ch *receipts.Chain, rec schemas.ControlRecord, at time.Time) []byte {
	t.Helper()
	code := "accepted"
	decision := schemas.DecisionAllow
	codes := []string{}
	if !rec.Accepted {
		code, decision, codes = rec.Code, schemas.DecisionDeny, []string{rec.Code}
	}
	data := schemas.Receipt{
		EventType: schemas.KindControl, Tool: rec.Verb, ToolID: "control/" + rec.Verb, AgentID: rec.Actor,
		Timestamp: at.UTC().Format(schemas.TimeFormat), ResultCode: code, Decision: decision, ReasonCodes: codes,
		DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg, Control: &rec,
	}
	s, err := ch.Seal(receipts.Meta{Type: schemas.ReceiptType(schemas.KindControl), Source: "talos://control/test", Subject: rec.Verb, Time: at}, &data)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Commit(s); err != nil {
		t.Fatal(err)
	}
	if err := schemas.ValidateReceiptEvent(s.JSON); err != nil {
		t.Fatalf("control receipt does not validate: %v", err)
	}
	return s.JSON
}

// A control receipt lands in receipts (where the verifier covers it) and in
// control_events with who, what, why and the outcome; a refusal too; a
// redelivered batch does not double-count in v_control_events.
func TestSinkProjectsControlReceipts(t *testing.T) {
	ctx, conn, db := migrated(t)
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ch := receipts.NewChain("ctl-test-control", key)
	at := time.Date(2026, 11, 21, 10, 0, 0, 123e6, time.UTC)
	accepted := controlReceipt(t, ch, schemas.ControlRecord{
		CommandID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d71", Verb: schemas.VerbKillSwitchSet, Actor: "alice",
		Reason: "incident 42", Target: "tool:files/write_file", Accepted: true, Seq: 7,
		CommandHash: strings.Repeat("a", 64), ResponderKID: "r1",
	}, at)
	refused := controlReceipt(t, ch, schemas.ControlRecord{
		Verb: schemas.VerbKillSwitchSet, Actor: "mallory", Target: "global", Code: schemas.CtlSignatureInvalid,
		CommandHash: strings.Repeat("b", 64), ResponderKID: "r9",
	}, at.Add(time.Second))
	w := NewSinkWriter(conn, db)
	recs := []schemas.AuditRecord{
		{Subject: schemas.ReceiptSubject(schemas.KindControl, schemas.VerbKillSwitchSet), Data: accepted, StreamSeq: 1},
		{Subject: schemas.ReceiptSubject(schemas.KindControl, schemas.VerbKillSwitchSet), Data: refused, StreamSeq: 2},
	}
	for i := 0; i < 2; i++ { // the second write is a redelivery
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ControlEvents(ctx, conn, db, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("v_control_events has %d rows, want 2: %+v", len(got), got)
	}
	a, r := got[0], got[1]
	if !a.Accepted || a.Actor != "alice" || a.Reason != "incident 42" || a.Target != "tool:files/write_file" ||
		a.StreamSeq != 7 || a.Verb != schemas.VerbKillSwitchSet || a.ChainSeq != 1 || a.CloudEvent != string(accepted) || a.ResponderKID != "r1" {
		t.Errorf("accepted row = %+v", a)
	}
	if r.Accepted || r.Code != schemas.CtlSignatureInvalid || r.Actor != "mallory" || r.StreamSeq != 0 || r.ChainSeq != 2 {
		t.Errorf("refused row = %+v", r)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.v_receipts WHERE kind = 'control'"); n != 2 {
		t.Errorf("v_receipts has %d control receipts, want 2", n)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.dead_letters"); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
	rep, err := VerifyDatabase(ctx, conn, db, verify.KeySet{key.KID: key.Public()}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("control receipts do not verify: %v", rep.Problems)
	}
}

// A control receipt without data.control cannot be projected into
// control_events: it goes to dead_letters rather than half into receipts.
func TestSinkDeadLettersControlWithoutRecord(t *testing.T) {
	ctx, conn, db := migrated(t)
	key, _ := receipts.GenerateKey()
	ch := receipts.NewChain("ctl-bad", key)
	data := schemas.Receipt{EventType: schemas.KindControl, Tool: "x", Timestamp: "2026-11-21T10:00:00.000Z",
		ReasonCodes: []string{}, DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
	s, err := ch.Seal(receipts.Meta{Type: schemas.ReceiptType(schemas.KindControl), Source: "talos://control/test", Subject: "x"}, &data)
	if err != nil {
		t.Fatal(err)
	}
	if err := NewSinkWriter(conn, db).Write(context.Background(), []schemas.AuditRecord{{Subject: "talos.audit.receipt.control.x", Data: s.JSON, StreamSeq: 1}}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.dead_letters"); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.receipts"); n != 0 {
		t.Errorf("%d receipts rows, want 0", n)
	}
}
