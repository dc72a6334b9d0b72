package query

import (
	"testing"

	"github.com/talos-audit/talos/schemas"
)

// TestSinkStoresLogIndex: the log role's index records land in
// log_entries, one row per (event, index) in v_log_entries however often
// they are written (a redelivery, an announcement repeated after a
// restart), two for an event the log holds twice; a record that is not an
// index record is a dead letter, never dropped.
func TestSinkStoresLogIndex(t *testing.T) {
	ctx, conn, db := migrated(t)
	rec := func(data string) schemas.AuditRecord {
		return schemas.AuditRecord{Subject: schemas.SubjectLogIndex, Data: []byte(data), StreamSeq: 9}
	}
	batch := `{"origin":"audit.example.com/talos","time":"2026-11-26T08:00:00.123Z","entries":[` +
		`{"event_id":"e1","log_index":0,"leaf_hash":"aa","subject":"talos.audit.receipt.decision.files","stream_seq":1},` +
		`{"event_id":"e2","log_index":1,"leaf_hash":"bb","subject":"talos.audit.toolcall.files","stream_seq":2,"oversize":true}]}`
	again := `{"origin":"audit.example.com/talos","time":"2026-11-26T08:00:05.000Z","entries":[` +
		`{"event_id":"e1","log_index":0,"leaf_hash":"aa","subject":"talos.audit.receipt.decision.files","stream_seq":1},` +
		`{"event_id":"e1","log_index":7,"leaf_hash":"cc","subject":"talos.audit.receipt.decision.files","stream_seq":30}]}`
	w := NewSinkWriter(conn, db)
	for _, recs := range [][]schemas.AuditRecord{{rec(batch)}, {rec(batch), rec(again)}, {rec(`{"origin":"x"}`)}} {
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	e1, err := LogEntriesOf(ctx, conn, db, "e1")
	if err != nil {
		t.Fatal(err)
	}
	if len(e1) != 2 || e1[0].LogIndex != 0 || e1[1].LogIndex != 7 || e1[0].LeafHash != "aa" || e1[0].Origin != "audit.example.com/talos" || e1[0].TimeMS != 1795680000123 {
		t.Errorf("e1: %+v", e1)
	}
	e2, err := LogEntriesOf(ctx, conn, db, "e2")
	if err != nil || len(e2) != 1 || e2[0].Oversize != 1 || e2[0].StreamSeq != 2 || e2[0].Subject != "talos.audit.toolcall.files" {
		t.Errorf("e2: %+v %v", e2, err)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.dead_letters WHERE subject = '"+schemas.SubjectLogIndex+"'"); n != 1 {
		t.Errorf("%d dead letters for the bad index record, want 1", n)
	}
}
