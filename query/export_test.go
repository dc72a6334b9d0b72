package query

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

var expAt = time.Date(2026, 7, 1, 9, 0, 0, 125e6, time.UTC)

// exportFixture stores, each twice (a sink redelivery): five decision
// receipts and one control receipt signed into one chain (one agent id
// carries JSON escapes), two pretty-printed (multi-line) receipts of
// another chain, one ToolCallEvent row and one checkpoint row. It returns
// the trusted keys and the signed receipts of the first chain in order.
func exportFixture(t *testing.T, ctx context.Context, conn driver.Conn, db string) (verify.KeySet, [][]byte) {
	t.Helper()
	key := testKey(t)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	ch := receipts.NewChain("exp-w1", key)
	var recs []schemas.AuditRecord
	var signed [][]byte
	for i := 1; i <= 5; i++ {
		agent := "agent-7"
		if i == 2 {
			agent = `agent "quoted" \ path`
		}
		sealed := sealDecision(t, ch, expAt.Add(time.Duration(i)*time.Second), fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-00000000010%d", i), agent)
		signed = append(signed, sealed)
		recs = append(recs, schemas.AuditRecord{Subject: "talos.audit.receipt.decision.files", Data: sealed, StreamSeq: uint64(i)})
	}
	ctl := controlReceipt(t, ch, schemas.ControlRecord{CommandID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d99", Verb: schemas.VerbKillSwitchSet,
		Actor: "alice", Reason: "drill", Target: "server:files", Accepted: true, Seq: 1, CommandHash: strings.Repeat("a", 64)},
		expAt.Add(6*time.Second))
	signed = append(signed, ctl)
	recs = append(recs, schemas.AuditRecord{Subject: "talos.audit.receipt.control.killswitch.set", Data: ctl, StreamSeq: 6})
	w := NewSinkWriter(conn, db)
	for i := 0; i < 2; i++ {
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}

	_, pretty := chainOf(t, "exp-pretty", 2, expAt.Add(10*time.Second))
	call := ToolCallRow{EventID: "0190f5b2-0000-7000-8000-0000000000e1", Time: expAt.Add(7 * time.Second).Truncate(time.Second),
		TimeMS: uint64(expAt.Add(7 * time.Second).UnixMilli()), ToolCallID: "tc-exp-1", ServerID: "files", ToolName: "read_file",
		Phase: "post", Decision: "allow", AgentID: "agent-7", SignerKID: key.KID,
		CloudEvent: `{"specversion":"1.0","id":"0190f5b2-0000-7000-8000-0000000000e1","type":"dev.talos.toolcall.v1"}`}
	for i := 0; i < 2; i++ {
		if err := InsertReceipts(ctx, conn, db, pretty); err != nil {
			t.Fatal(err)
		}
		if err := InsertToolCalls(ctx, conn, db, []ToolCallRow{call}); err != nil {
			t.Fatal(err)
		}
		b, err := conn.PrepareBatch(ctx, "INSERT INTO `"+db+"`.checkpoints (checkpoint_id, time, time_ms, chain_id, from_seq, to_seq, signer_kid, cloudevent, checkpoint_seq)")
		if err != nil {
			t.Fatal(err)
		}
		at := expAt.Add(8 * time.Second)
		if err := b.Append("cp-1", at.Truncate(time.Second), uint64(at.UnixMilli()), "exp-w1", uint64(1), uint64(6), key.KID,
			`{"id":"cp-1","type":"dev.talos.checkpoint.v1"}`, uint64(1)); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	return keys, signed
}

func exportAll(t *testing.T, ctx context.Context, conn driver.Conn, db string, opts ExportOptions) []ExportRecord {
	t.Helper()
	var out []ExportRecord
	if err := Export(ctx, conn, db, opts, func(r *ExportRecord) error { out = append(out, *r); return nil }); err != nil {
		t.Fatalf("Export(%+v): %v", opts, err)
	}
	return out
}

func recordIDs(recs []ExportRecord) []string {
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.Record+":"+r.ChainID+":"+fmt.Sprint(r.ChainSeq))
	}
	return ids
}

// An export holds every signed record once, in chain order, with the
// stored bytes: the JSON lines verify offline with only the public key.
func TestExportVerifiesOffline(t *testing.T) {
	ctx, conn, db := migrated(t)
	keys, signed := exportFixture(t, ctx, conn, db)

	got := exportAll(t, ctx, conn, db, ExportOptions{Kind: ExportReceipts})
	want := []string{"decision:exp-pretty:1", "decision:exp-pretty:2", "decision:exp-w1:1", "decision:exp-w1:2", "decision:exp-w1:3",
		"decision:exp-w1:4", "decision:exp-w1:5", "control:exp-w1:6"}
	// The receipts, then the checkpoints over them, which anchor the
	// chains' ends.
	if w := append(append([]string{}, want...), "checkpoint:exp-w1:6"); !slices.Equal(recordIDs(got), w) {
		t.Fatalf("receipts export: %v, want %v", recordIDs(got), w)
	}
	got = got[:len(want)]
	for i, raw := range signed {
		if got[2+i].CloudEvent != string(raw) {
			t.Fatalf("exported receipt %d is not the stored bytes", i+1)
		}
	}
	if r := got[3]; r.AgentID != `agent "quoted" \ path` || r.ServerID != "files" || r.Decision != "allow" || r.SignerKID == "" ||
		!r.Time.Equal(expAt.Add(2*time.Second)) {
		t.Fatalf("record columns: %+v", r)
	}

	jsonl := writeExport(t, ExportJSONL, got)
	lines := strings.Split(strings.TrimSuffix(jsonl.String(), "\n"), "\n")
	if len(lines) != len(got) {
		t.Fatalf("%d JSON lines for %d records", len(lines), len(got))
	}
	// The pretty-printed receipts became one line each with the same
	// receipt hash; the signed ones are byte for byte what was stored.
	for i, line := range lines {
		h, err := verify.ReceiptHash([]byte(line))
		if err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		stored, _ := ReceiptRowFromEvent([]byte(got[i].CloudEvent))
		if h != stored.ReceiptHash {
			t.Fatalf("line %d: receipt hash %s, stored %s", i+1, h, stored.ReceiptHash)
		}
		if i >= 2 && line != string(signed[i-2]) {
			t.Fatalf("line %d differs from the signed bytes", i+1)
		}
	}
	v := verify.NewVerifier(keys)
	for _, line := range lines[2:] {
		v.Add([]byte(line))
	}
	if rep := v.Finish(); !rep.OK() || rep.Checked != 6 {
		t.Fatalf("offline verification of the export: %+v", rep)
	}

	// CSV: the header, then one row per record with the signed JSON last,
	// exactly (line breaks and quotes included).
	table, err := csv.NewReader(writeExport(t, ExportCSV, got)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(table) != len(got)+1 || !slices.Equal(table[0], ExportColumns) {
		t.Fatalf("CSV: %d rows, header %v", len(table), table[0])
	}
	for i, row := range table[1:] {
		if row[len(row)-1] != got[i].CloudEvent || row[0] != got[i].Record || row[1] != got[i].ID {
			t.Fatalf("CSV row %d: %v", i+1, row[:3])
		}
	}
	if row := table[4]; row[7] != `agent "quoted" \ path` || row[2] != "2026-07-01T09:00:02.125Z" || row[4] != "2" {
		t.Fatalf("CSV row of receipt 2: %v", row[:8])
	}

	// The other kinds, and all of them.
	ctl := exportAll(t, ctx, conn, db, ExportOptions{Kind: ExportControl})
	if len(ctl) != 1 || ctl[0].Verb != "killswitch.set" || ctl[0].Target != "server:files" || ctl[0].Actor != "alice" ||
		ctl[0].CloudEvent != string(signed[5]) {
		t.Fatalf("control export: %+v", ctl)
	}
	cp := exportAll(t, ctx, conn, db, ExportOptions{Kind: ExportCheckpoints})
	if len(cp) != 1 || cp[0].Record != "checkpoint" || cp[0].Target != "1..6" || cp[0].ChainSeq != 6 {
		t.Fatalf("checkpoint export: %+v", cp)
	}
	all := exportAll(t, ctx, conn, db, ExportOptions{})
	wantAll := append(append([]string{}, want...), "toolcall::0", "checkpoint:exp-w1:6")
	if !slices.Equal(recordIDs(all), wantAll) {
		t.Fatalf("export all: %v, want %v", recordIDs(all), wantAll)
	}
	// A time range: [second 2, second 5) of the first chain.
	part := exportAll(t, ctx, conn, db, ExportOptions{Kind: ExportReceipts, From: expAt.Add(2 * time.Second), To: expAt.Add(5 * time.Second)})
	if want := []string{"decision:exp-w1:2", "decision:exp-w1:3", "decision:exp-w1:4"}; !slices.Equal(recordIDs(part), want) {
		t.Fatalf("export [2s, 5s): %v, want %v", recordIDs(part), want)
	}

	if err := Export(ctx, conn, db, ExportOptions{Kind: "secrets"}, func(*ExportRecord) error { return nil }); err == nil {
		t.Error("unknown kind accepted")
	}
	if _, err := NewExportWriter(new(bytes.Buffer), "xml"); err == nil {
		t.Error("unknown format accepted")
	}
	stop := errors.New("stop")
	n := 0
	if err := Export(ctx, conn, db, ExportOptions{}, func(*ExportRecord) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("fn error: %v after %d records", err, n)
	}
}

// A receipt stored twice with different signed JSON is exported in both
// versions (the verifier names the fork) and Export reports it.
func TestExportReportsConflictingCopies(t *testing.T) {
	ctx, conn, db := migrated(t)
	raws, rows := chainOf(t, "exp-fork", 3, expAt)
	forgedRaw := strings.Replace(string(raws[1]), `"decision": "allow"`, `"decision": "deny"`, 1)
	forged, err := ReceiptRowFromEvent([]byte(forgedRaw))
	if err != nil || forgedRaw == string(raws[1]) {
		t.Fatalf("fixture: %v", err)
	}
	if err := InsertReceipts(ctx, conn, db, append(rows, forged, rows[0])); err != nil {
		t.Fatal(err)
	}
	var got []string
	err = Export(ctx, conn, db, ExportOptions{Kind: ExportReceipts}, func(r *ExportRecord) error {
		var ev struct {
			Data struct{ Decision string } `json:"data"`
		}
		if err := json.Unmarshal([]byte(r.CloudEvent), &ev); err != nil {
			return err
		}
		got = append(got, fmt.Sprintf("%d:%s", r.ChainSeq, ev.Data.Decision))
		return nil
	})
	var ce *ConflictError
	if !errors.As(err, &ce) || !slices.Equal(ce.ReceiptIDs, []string{rows[1].ReceiptID}) {
		t.Fatalf("err = %v, want a ConflictError naming %s", err, rows[1].ReceiptID)
	}
	slices.Sort(got)
	if want := []string{"1:allow", "2:allow", "2:deny", "3:deny"}; !slices.Equal(got, want) {
		t.Fatalf("exported %v, want %v (both versions, seq 1 once)", got, want)
	}
	// ExportToPath keeps such an export (it is whole), and leaves the path
	// alone after any other error.
	path := filepath.Join(t.TempDir(), "out.jsonl")
	n, err := ExportToPath(ctx, conn, db, ExportOptions{Kind: ExportReceipts}, ExportJSONL, path, nil)
	if b, _ := os.ReadFile(path); !errors.As(err, &ce) || n != 4 || strings.Count(string(b), "\n") != 4 {
		t.Fatalf("ExportToPath: %d records, %v; file %q", n, err, b)
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if _, err := ExportToPath(ctx, conn, db, ExportOptions{Kind: "secrets"}, ExportJSONL, bad, nil); err == nil {
		t.Fatal("ExportToPath: unknown kind accepted")
	}
	if entries, _ := os.ReadDir(filepath.Dir(bad)); len(entries) != 0 {
		t.Fatalf("after a failed export: %v", entries)
	}
}

// sealDecision seals into ch, and commits, an allow decision receipt of
// files/read_file for call toolCallID by agent at at, and returns its
// signed JSON.
func sealDecision(t *testing.T, ch *receipts.Chain, at time.Time, toolCallID, agent string) []byte {
	t.Helper()
	data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", AgentID: agent, ToolID: "files/read_file",
		Timestamp: at.Format(schemas.TimeFormat), ResultCode: "allow", ToolCallID: toolCallID,
		TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", ServerID: "files", ToolName: "read_file", Phase: "pre", Mode: "prod",
		Decision: "allow", ReasonCodes: []string{}, ToolClass: "read", DocumentHashes: []schemas.DocumentHash{},
		ContentHashAlg: schemas.ContentHashAlg}
	s, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: toolCallID, Time: at}, &data)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Commit(s); err != nil {
		t.Fatal(err)
	}
	return s.JSON
}
