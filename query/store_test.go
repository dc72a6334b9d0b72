package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/testenv"
)

func TestMigrateTwice(t *testing.T) {
	addr, db := testenv.NewDatabase(t)
	ctx := context.Background()
	conn, err := Open(ctx, addr, "") // the database may not exist yet
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Migrate into a second, not yet existing database too.
	fresh := db + "_fresh"
	t.Cleanup(func() { conn.Exec(context.Background(), "DROP DATABASE IF EXISTS `"+fresh+"`") })
	for _, name := range []string{db, fresh} {
		for i := 0; i < 2; i++ {
			if err := Migrate(ctx, conn, name); err != nil {
				t.Fatalf("%s: Migrate #%d: %v", name, i+1, err)
			}
		}
		v, err := AppliedVersion(ctx, conn, name)
		if err != nil || v != SchemaVersion() {
			t.Fatalf("AppliedVersion = %d, %v; want %d", v, err, SchemaVersion())
		}
		if n := count(t, ctx, conn, "SELECT count() FROM `"+name+"`.schema_migrations"); n != uint64(len(migrations)) {
			t.Fatalf("schema_migrations has %d rows after two runs, want %d", n, len(migrations))
		}
		for _, tbl := range []string{TableReceipts, TableToolCalls, TableControlEvents, TableArtifacts,
			TableCheckpoints, TableSchemaMigrations, TableDeadLetters, ViewReceipts, ViewDecisions, ViewDenialsByReason, ViewControlEvents,
			TableLogEntries, ViewLogEntries} {
			q := fmt.Sprintf("SELECT count() FROM system.tables WHERE database = '%s' AND name = '%s'", name, tbl)
			if count(t, ctx, conn, q) != 1 {
				t.Errorf("%s.%s missing", name, tbl)
			}
			// Every table and view answers a query.
			count(t, ctx, conn, "SELECT count() FROM `"+name+"`.`"+tbl+"`")
		}
	}
	for _, bad := range []string{"", "Talos", "1db", "a-b", "a;DROP"} {
		if err := Migrate(ctx, conn, bad); err == nil {
			t.Errorf("Migrate(%q) accepted an invalid name", bad)
		}
	}
}

// TestViewsKeyCallsByEnforcementPoint: two enforcement points' calls with
// the same tool_call_id are two calls in v_decisions, v_tool_calls and
// v_secret_uses, each still deduplicated against its own redelivery. A
// database at migration 5, whose views keyed calls by tool_call_id alone
// (one of the two calls hidden), keeps its rows and shows both once
// migrated.
func TestViewsKeyCallsByEnforcementPoint(t *testing.T) {
	ctx, conn, db := migratedTo(t, 5)
	const pseudonym = "hmac-sha256:k1:shared"
	var recs []ReceiptRow
	var calls []ToolCallRow
	for i, ep := range []string{"gw-1", "gw-2"} {
		at := t0.Add(time.Duration(i) * time.Second)
		decision, codes := "allow", []string{}
		if ep == "gw-2" {
			decision, codes = "deny", []string{"KILL_SWITCH"}
		}
		recs = append(recs, ReceiptRow{ReceiptID: "r-" + ep, Kind: "decision", Phase: "pre", Time: at, TimeMS: uint64(at.UnixMilli()),
			ToolCallID: "tc-shared", SessionID: "s-" + ep, EPID: ep, ServerID: "files", ToolName: "read_file",
			Decision: decision, ReasonCodes: codes, ChainID: "c-" + ep, ChainSeq: 1, CloudEvent: "{}"})
		calls = append(calls, ToolCallRow{EventID: "ev-" + ep, Time: at, TimeMS: uint64(at.UnixMilli()), ToolCallID: "tc-shared",
			EPID: ep, ServerID: "files", ToolName: "read_file", ToolID: "files/read_file", Phase: "pre", Decision: decision,
			RedactionPointers: []string{"/args/token"}, RedactionRules: []string{"github-pat"}, RedactionPseudonyms: []string{pseudonym},
			CloudEvent: "{}"})
	}
	for range 2 { // the second time as a sink redelivery
		insertOld(t, ctx, conn, db, TableReceipts, receiptColumns, recs)
		insertOld(t, ctx, conn, db, TableToolCalls, toolCallColumns, calls)
	}
	rows := func(view string) uint64 {
		return count(t, ctx, conn, "SELECT count() FROM `"+db+"`."+view+" WHERE tool_call_id = 'tc-shared'")
	}
	if n := rows(ViewDecisions); n != 1 {
		t.Fatalf("at migration 5, v_decisions holds %d rows of the shared id, want the 1 it used to show", n)
	}
	if err := Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	for _, view := range []string{ViewDecisions, ViewToolCalls, ViewSecretUses} {
		if n := rows(view); n != 2 {
			t.Errorf("%s holds %d rows of the shared id, want one per enforcement point", view, n)
		}
	}
	q := "SELECT count() FROM `" + db + "`." + ViewDenials + " WHERE tool_call_id = 'tc-shared' AND ep_id = 'gw-2' AND has(reason_codes, 'KILL_SWITCH')"
	if n := count(t, ctx, conn, q); n != 1 {
		t.Errorf("gw-2's denial shows %d times in v_denials, want 1", n)
	}
	uses, err := SecretUses(ctx, conn, db, pseudonym, 0)
	if err != nil || len(uses) != 2 {
		t.Fatalf("secret uses: %+v %v, want both calls", uses, err)
	}
}

func TestInsertStreamAndViewsDedupe(t *testing.T) {
	ctx, conn, db := migrated(t)
	_, rows := chainOf(t, "w1-0", 9, t0)
	// A sink redelivery: the whole batch inserted twice (two parts, no merge yet).
	for i := 0; i < 2; i++ {
		if err := InsertReceipts(ctx, conn, db, rows); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.receipts"); n != 18 {
		t.Fatalf("raw table has %d rows, want 18 (the duplicates)", n)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.v_receipts"); n != 9 {
		t.Fatalf("v_receipts has %d rows, want 9", n)
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.v_decisions"); n != 9 {
		t.Fatalf("v_decisions has %d rows, want 9", n)
	}
	// 3 denies (seq 3, 6, 9), each with two codes, all in one hour.
	dr, err := conn.Query(ctx, "SELECT hour, server_id, reason_code, denials FROM `"+db+"`.v_denials_by_reason ORDER BY reason_code")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for dr.Next() {
		var hour time.Time
		var server, code string
		var n uint64
		if err := dr.Scan(&hour, &server, &code, &n); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %s %d", hour.UTC().Format("15:04"), server, code, n))
	}
	dr.Close()
	want := []string{"05:00 files TOOL_UNCLASSIFIED_DENIED 3", "05:00 files UNKNOWN_TOOL 3"}
	if !slices.Equal(got, want) {
		t.Fatalf("v_denials_by_reason = %q, want %q", got, want)
	}

	var streamed []ReceiptRow
	if err := StreamReceipts(ctx, conn, db, func(r ReceiptRow) error {
		streamed = append(streamed, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(streamed) != 9 {
		t.Fatalf("streamed %d rows, want 9 (duplicates collapsed)", len(streamed))
	}
	for i, r := range streamed {
		if r.ChainSeq != uint64(i+1) {
			t.Fatalf("row %d has seq %d: not in chain order", i, r.ChainSeq)
		}
		if d := CompareColumns(r, rows[i]); d != nil {
			t.Fatalf("seq %d: stored row differs from inserted row in %v", r.ChainSeq, d)
		}
		if r.InsertedAt.IsZero() {
			t.Fatalf("seq %d: inserted_at not read", r.ChainSeq)
		}
		fromEvent, err := ReceiptRowFromEvent([]byte(r.CloudEvent))
		if err != nil {
			t.Fatal(err)
		}
		if d := CompareColumns(r, fromEvent); d != nil {
			t.Fatalf("seq %d: untampered row disagrees with its cloudevent in %v", r.ChainSeq, d)
		}
	}
}

// tamperFindings streams db and returns, per receipt_id, the columns that
// disagree with the row's own cloudevent, plus the chain seqs seen.
func tamperFindings(t *testing.T, ctx context.Context, db string, stream func(func(ReceiptRow) error) error) (map[string][]string, []uint64, error) {
	t.Helper()
	findings := map[string][]string{}
	var seqs []uint64
	err := stream(func(r ReceiptRow) error {
		seqs = append(seqs, r.ChainSeq)
		fromEvent, err := ReceiptRowFromEvent([]byte(r.CloudEvent))
		if err != nil {
			return err
		}
		if d := CompareColumns(r, fromEvent); d != nil {
			findings[r.ReceiptID] = d
		}
		return nil
	})
	return findings, seqs, err
}

func TestTamperUpdateAndDelete(t *testing.T) {
	ctx, conn, db := migrated(t)
	_, rows := chainOf(t, "w1-0", 6, t0)
	if err := InsertReceipts(ctx, conn, db, rows); err != nil {
		t.Fatal(err)
	}
	// Redelivered copies too: the mutation must rewrite every copy.
	if err := InsertReceipts(ctx, conn, db, rows[:4]); err != nil {
		t.Fatal(err)
	}
	stream := func(fn func(ReceiptRow) error) error { return StreamReceipts(ctx, conn, db, fn) }

	denied := rows[2] // seq 3 is a deny
	if denied.Decision != "deny" {
		t.Fatalf("fixture: seq 3 is %s", denied.Decision)
	}
	start := time.Now()
	// 18.16 cannot type a bare [] in UPDATE; emptyArrayString() works on both.
	if err := MutateAndWait(ctx, conn, db, TableReceipts,
		"UPDATE decision = 'allow', reason_codes = emptyArrayString() WHERE receipt_id = '"+denied.ReceiptID+"'"); err != nil {
		t.Fatal(err)
	}
	t.Logf("UPDATE mutation done in %s", time.Since(start).Round(time.Millisecond))
	findings, seqs, err := tamperFindings(t, ctx, db, stream)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string][]string{denied.ReceiptID: {"decision", "reason_codes"}}; fmt.Sprint(findings) != fmt.Sprint(want) {
		t.Fatalf("after UPDATE: findings %v, want %v", findings, want)
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("after UPDATE: seqs %v", seqs)
	}
	// The views show the altered value: they are projections, not evidence.
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.v_decisions WHERE decision = 'deny'"); n != 1 {
		t.Fatalf("v_decisions denies after UPDATE = %d, want 1", n)
	}

	start = time.Now()
	if err := MutateAndWait(ctx, conn, db, TableReceipts, "DELETE WHERE receipt_id = '"+rows[3].ReceiptID+"'"); err != nil {
		t.Fatal(err)
	}
	t.Logf("DELETE mutation done in %s", time.Since(start).Round(time.Millisecond))
	_, seqs, err = tamperFindings(t, ctx, db, stream)
	if err != nil {
		t.Fatal(err)
	}
	// A deleted row leaves a gap in the chain, which is what a verifier reports.
	if !slices.Equal(seqs, []uint64{1, 2, 3, 5, 6}) {
		t.Fatalf("after DELETE: seqs %v, want a gap at 4", seqs)
	}

	if err := MutateAndWait(ctx, conn, db, "no_such_table", "DELETE WHERE 1"); err == nil {
		t.Fatal("mutating a missing table succeeded")
	}
	if err := MutateAndWait(ctx, conn, db, "receipts;", "DELETE WHERE 1"); err == nil || !strings.Contains(err.Error(), "invalid table") {
		t.Fatalf("invalid table name: %v", err)
	}
}

func TestStreamReportsConflictingDuplicate(t *testing.T) {
	ctx, conn, db := migrated(t)
	raws, rows := chainOf(t, "w1-0", 3, t0)
	// A second row for receipt 2 whose cloudevent says deny: same receipt_id and
	// chain position, different signed JSON.
	forgedRaw := strings.Replace(string(raws[1]), `"decision": "allow"`, `"decision": "deny"`, 1)
	if forgedRaw == string(raws[1]) {
		t.Fatal("fixture: replacement did not apply")
	}
	forged, err := ReceiptRowFromEvent([]byte(forgedRaw))
	if err != nil {
		t.Fatal(err)
	}
	if err := InsertReceipts(ctx, conn, db, rows); err != nil {
		t.Fatal(err)
	}
	if err := InsertReceipts(ctx, conn, db, []ReceiptRow{forged, rows[0]}); err != nil { // rows[0]: a harmless redelivery
		t.Fatal(err)
	}
	var ids []string
	err = StreamReceipts(ctx, conn, db, func(r ReceiptRow) error {
		ids = append(ids, fmt.Sprintf("%d:%s", r.ChainSeq, r.Decision))
		return nil
	})
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflictingReceipt) {
		t.Fatalf("err = %v, want a ConflictError", err)
	}
	if !slices.Equal(ce.ReceiptIDs, []string{rows[1].ReceiptID}) {
		t.Fatalf("conflicts = %v, want [%s]", ce.ReceiptIDs, rows[1].ReceiptID)
	}
	slices.Sort(ids)
	if want := []string{"1:allow", "2:allow", "2:deny", "3:deny"}; !slices.Equal(ids, want) {
		t.Fatalf("streamed %v, want %v (both variants, seq 1 once)", ids, want)
	}

	// An error from fn stops the stream and comes back unchanged.
	stop := errors.New("stop")
	calls := 0
	if err := StreamReceipts(ctx, conn, db, func(ReceiptRow) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("fn error: got %v after %d calls", err, calls)
	}
}

func BenchmarkInsertReceipts10k(b *testing.B) {
	ctx, conn, db := migrated(b)
	const n = 10_000
	rows := benchReceiptRows(b, n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := InsertReceipts(ctx, conn, db, rows); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n*b.N), "µs/row")
}
