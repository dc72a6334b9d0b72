package query

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/logproof"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// rejectedFixture is a stream as published: two receipts of one chain, a
// ToolCallEvent the recorder takes, and four it refuses — A lacks its
// trace_id and carries payloads, B lacks its trace_id and carries none,
// C carries a raw payload that does not match its hash, D lacks its
// trace_id and its signature.
type rejectedFixture struct {
	keys       verify.KeySet
	published  []schemas.AuditRecord
	good       []byte
	a, b, c, d []byte
}

func newRejectedFixture(t *testing.T) *rejectedFixture {
	t.Helper()
	key := testKey(t)
	f := &rejectedFixture{keys: verify.KeySet{}}
	f.keys.Add(key.Public())
	ch := receipts.NewChain("rej-w1", key)
	for i := 1; i <= 2; i++ {
		sealed := sealDecision(t, ch, tcAt.Add(time.Duration(i)*time.Second), fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-00000000020%d", i), "agent-7")
		f.published = append(f.published, schemas.AuditRecord{Subject: "talos.audit.receipt.decision.files", Data: sealed})
	}
	event := func(n int, change func(map[string]any)) []byte {
		m := asMap(t, toolCallEvent(t, fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-0000000003%02d", n), tcAt))
		change(m)
		return signed(t, key, "call", tcAt.Add(time.Duration(n)*time.Millisecond), m)
	}
	f.good = event(0, func(map[string]any) {})
	f.a = event(1, func(m map[string]any) { delete(m, "trace_id") })
	f.b = event(2, func(m map[string]any) {
		delete(m, "trace_id")
		for _, k := range []string{"payloads", "args_ref", "args_hash", "result_ref", "result_hash"} {
			delete(m, k)
		}
	})
	f.c = event(3, func(m map[string]any) { m["payloads"].(map[string]any)["args"] = map[string]any{"token": plantedToken} })
	var ce map[string]any
	if err := json.Unmarshal(event(4, func(m map[string]any) { delete(m, "trace_id"); delete(m, "payloads") }), &ce); err != nil {
		t.Fatal(err)
	}
	delete(ce["data"].(map[string]any), "signature")
	var err error
	if f.d, err = json.Marshal(ce); err != nil {
		t.Fatal(err)
	}
	for _, raw := range [][]byte{f.good, f.a, f.b, f.c, f.d} {
		f.published = append(f.published, schemas.AuditRecord{Subject: schemas.ToolCallEventSubject("files"), Data: raw})
	}
	for i := range f.published {
		f.published[i].StreamSeq = uint64(i + 1)
	}
	return f
}

// writeExport writes recs as an export in format.
func writeExport(t *testing.T, format string, recs []ExportRecord) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewExportWriter(&buf, format)
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if err := w.Write(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// jsonl writes recs as a JSON-lines export.
func jsonl(t *testing.T, recs []ExportRecord) [][]byte {
	t.Helper()
	buf := writeExport(t, ExportJSONL, recs)
	return bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n"))
}

// The rejected ToolCallEvents are exported as stored (kind rejected, and
// in kind all), each as an ExportedRejection line that gives back the
// stored bytes exactly and never the payloads the sink withheld; verify
// --file passes the whole export, counting the rejections by what their
// signatures can show, and names a rejection whose signed bytes were
// altered or whose line names another event.
func TestExportRejectedToolCalls(t *testing.T) {
	ctx, conn, db := migrated(t)
	f := newRejectedFixture(t)
	if err := NewSinkWriter(conn, db).Write(ctx, f.published); err != nil {
		t.Fatal(err)
	}
	stored, err := ToolCallRejections(ctx, conn, db, 0)
	if err != nil || len(stored) != 4 {
		t.Fatalf("%d rejections stored (%v), want 4", len(stored), err)
	}
	rejected := exportAll(t, ctx, conn, db, ExportOptions{Kind: ExportRejected})
	if len(rejected) != 4 {
		t.Fatalf("rejected export: %d records, want 4", len(rejected))
	}
	withheld := map[string]bool{eventID(t, f.a): true, eventID(t, f.c): true}
	lines := jsonl(t, rejected)
	for i, line := range lines {
		x, ok := ReadExportedRejection(line)
		s := stored[i]
		if !ok || x.Record != RecordToolCallRejected || x.ID != s.EventID || x.CloudEvent != s.CloudEvent || x.Reason != s.Reason ||
			x.Subject != s.Subject || x.StreamSeq != s.StreamSeq || !slices.Equal(x.Missing, s.Missing) || x.PayloadsWithheld != withheld[s.EventID] {
			t.Errorf("line %d: %+v (%v), stored %+v", i+1, x, ok, s)
		}
		if bytes.Contains(line, []byte(plantedToken)) {
			t.Errorf("line %d carries the payload the sink withheld", i+1)
		}
	}
	if _, ok := ReadExportedRejection(f.good); ok {
		t.Error("a ToolCallEvent read as a rejection")
	}
	table, err := csv.NewReader(writeExport(t, ExportCSV, rejected)).ReadAll()
	n := len(ExportColumns)
	if err != nil || len(table) != 5 || table[1][0] != RecordToolCallRejected || table[1][n-3] != strings.Join(stored[0].Missing, ";") ||
		table[1][n-2] != stored[0].Reason || table[1][n-1] != stored[0].CloudEvent {
		t.Fatalf("CSV of the rejections (%v): %q", err, table)
	}

	all := exportAll(t, ctx, conn, db, ExportOptions{Kind: ExportAll})
	if got := recordIDs(all); len(got) != 7 || got[2] != "toolcall::0" || got[3] != RecordToolCallRejected+"::0" {
		t.Fatalf("export all: %v", got)
	}
	events := jsonl(t, all)
	out := VerifyExport("export", events, f.keys, false, false)
	var text bytes.Buffer
	if err := out.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if out.Err() != nil || out.Report.Checked != 3 || *out.Rejected != (RejectedSummary{Total: 4, Signed: 1, Withheld: 2, Unsigned: 1}) ||
		!strings.Contains(text.String(), "; 4 rejected ToolCallEvents (refused by the flight recorder, in no chain): 1 signed by a trusted key, "+
			"2 stored without the payloads their signature covers") {
		t.Fatalf("verify the export: %v, %+v\n%s", out.Err(), out.Rejected, text.String())
	}

	// B's signature holds on its stored bytes: altered, it does not.
	b := eventID(t, f.b)
	for name, c := range map[string]struct {
		alter func(*ExportedRejection)
		kind  string
	}{
		"altered event": {func(x *ExportedRejection) { x.CloudEvent = strings.Replace(x.CloudEvent, `"1.2.3"`, `"1.2.4"`, 1) }, verify.ProblemBadSignature},
		"another id":    {func(x *ExportedRejection) { x.ID = eventID(t, f.a) }, ProblemAlteredColumn},
	} {
		tampered := slices.Clone(events)
		for i, line := range tampered {
			if x, ok := ReadExportedRejection(line); ok && x.ID == b {
				c.alter(&x)
				tampered[i], _ = json.Marshal(x)
			}
		}
		out := VerifyExport("export", tampered, f.keys, false, false)
		if p := out.Report.Problems; len(p) != 1 || p[0].Kind != c.kind || p[0].Record != RecordRejectedToolCall {
			t.Errorf("%s: %+v", name, p)
		}
	}
}

// rejectionLine is the export line of a record the sink refuses, built
// as the sink and export build it.
func rejectionLine(t *testing.T, rec schemas.AuditRecord) []byte {
	t.Helper()
	_, _, err := ToolCallRowFromEvent(rec.Data)
	rej, ok := err.(*RejectedToolCall)
	if !ok {
		t.Fatalf("not refused: %v", err)
	}
	r := RejectionOf(rec, rej)
	return jsonl(t, []ExportRecord{{Record: RecordToolCallRejected, ID: r.EventID, Time: time.UnixMilli(int64(r.TimeMS)), Subject: r.Subject,
		StreamSeq: r.StreamSeq, Missing: r.Missing, Rejection: r.Reason, CloudEvent: r.CloudEvent}})[0]
}

// The log check finds a rejected ToolCallEvent stored without its
// payloads at the entry it was stored from, as the database mode does:
// a whole export has every entry's record; a rejection taken out is a
// log entry without its row; a rejection whose stored event was altered,
// and an accepted ToolCallEvent passed off as a rejection without its
// payloads, are not the log's.
func TestLogFindsRejectionsAsStored(t *testing.T) {
	f := newRejectedFixture(t)
	l := &logEntries{standIn: map[int64]logproof.Entry{}}
	var entries [][]byte
	for i, rec := range f.published {
		entries = append(entries, rec.Data)
		l.add(int64(i), tlog.RecordHash(rec.Data), logproof.ReadEntry(rec.Data))
	}
	l.entry = func(i int64) ([]byte, error) { return entries[i], nil }
	var lines [][]byte
	for _, rec := range f.published {
		if _, _, err := ToolCallRowFromEvent(rec.Data); err != nil && strings.HasPrefix(rec.Subject, schemas.SubjectToolCall) {
			lines = append(lines, rejectionLine(t, rec))
		} else {
			lines = append(lines, rec.Data)
		}
	}
	check := func(lines [][]byte) *LogReport {
		rep := &LogReport{}
		err := matchRows(l, rep, LogOptions{Now: time.Now}, func(fn func(*storedRecord)) error {
			for _, raw := range lines {
				if r, ok := eventRecord(raw); ok {
					fn(r)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := check(lines); len(rep.Problems) != 0 || rep.Logged != 7 || rep.Withheld != 2 {
		t.Fatalf("whole export: logged %d, withheld %d, problems %+v", rep.Logged, rep.Withheld, rep.Problems)
	}
	kinds := func(rep *LogReport) []string {
		var out []string
		for _, p := range rep.Problems {
			out = append(out, p.Kind+" "+p.ReceiptID)
		}
		slices.Sort(out)
		return out
	}
	a, c, good := eventID(t, f.a), eventID(t, f.c), eventID(t, f.good)
	if got := kinds(check(slices.Delete(slices.Clone(lines), 3, 4))); !slices.Equal(got, []string{ProblemMissingRow + " " + a}) {
		t.Errorf("rejection A taken out: %v", got)
	}
	altered := slices.Clone(lines)
	x, _ := ReadExportedRejection(altered[5])
	x.CloudEvent = strings.Replace(x.CloudEvent, `"files/read_file"`, `"files/write_file"`, 1)
	altered[5], _ = json.Marshal(x)
	if got := kinds(check(altered)); !slices.Equal(got, []string{ProblemMissingRow + " " + c, ProblemNotInLog + " " + c}) {
		t.Errorf("rejection C altered: %v", got)
	}
	passedOff := slices.Clone(lines)
	stripped, _ := withoutPayloads(f.good)
	passedOff[2] = jsonl(t, []ExportRecord{{Record: RecordToolCallRejected, ID: good, Rejection: "x" + payloadsWithheld, CloudEvent: string(stripped)}})[0]
	if got := kinds(check(passedOff)); !slices.Equal(got, []string{ProblemMissingRow + " " + good, ProblemNotInLog + " " + good}) {
		t.Errorf("an accepted event passed off as a rejection: %v", got)
	}
}
