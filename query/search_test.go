package query

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// TestSearchReceipts: filters match exactly, listings are newest first and
// page without gaps or overlap, a redelivered batch does not double-count,
// filter values are bound (a quote in one is data, not SQL), and bad
// filters are refused.
func TestSearchReceipts(t *testing.T) {
	ctx, conn, db := migrated(t)
	_, rows := chainOf(t, "w1-0", 9, t0) // every third a deny, 1 ms apart
	// Two receipts with the same time_ms: the cursor must tell them apart.
	rows[1].TimeMS, rows[1].Time = rows[2].TimeMS, rows[2].Time
	odd := rows[4]
	odd.AgentID = `x' OR 1=1 --`
	rows[4] = odd
	for i := 0; i < 2; i++ { // a sink redelivery
		if err := InsertReceipts(ctx, conn, db, rows); err != nil {
			t.Fatal(err)
		}
	}
	search := func(q ReceiptQuery) []ReceiptSummary {
		t.Helper()
		got, err := SearchReceipts(ctx, conn, db, q)
		if err != nil {
			t.Fatalf("search %+v: %v", q, err)
		}
		n, err := CountReceipts(ctx, conn, db, q)
		if err != nil {
			t.Fatal(err)
		}
		if q.Before.IsZero() && (q.Limit == 0 || q.Limit >= len(rows)) && n != uint64(len(got)) {
			t.Fatalf("count %d, search returned %d for %+v", n, len(got), q)
		}
		return got
	}
	ids := func(s []ReceiptSummary) []string {
		var out []string
		for _, r := range s {
			out = append(out, r.ReceiptID)
		}
		return out
	}

	all := search(ReceiptQuery{})
	if len(all) != 9 {
		t.Fatalf("all: %d receipts, want 9 (duplicates collapsed)", len(all))
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.Time.Before(b.Time) || (a.Time.Equal(b.Time) && a.ReceiptID < b.ReceiptID) {
			t.Fatalf("not newest first at %d: %v then %v", i, a.Time, b.Time)
		}
	}
	if all[0].ReceiptID != rows[8].ReceiptID || !all[0].Time.Equal(time.UnixMilli(int64(rows[8].TimeMS)).UTC()) ||
		all[0].ChainSeq != 9 || all[0].Decision != "deny" || !slices.Equal(all[0].ReasonCodes, rows[8].ReasonCodes) {
		t.Fatalf("newest: %+v", all[0])
	}

	// Pages of 4: 4 + 4 + 1, together exactly the listing.
	var paged []ReceiptSummary
	q := ReceiptQuery{Limit: 4}
	for page := 0; ; page++ {
		got := search(q)
		paged = append(paged, got...)
		if len(got) < 4 {
			break
		}
		if page > 3 {
			t.Fatal("paging does not end")
		}
		q.Before = got[len(got)-1].Cursor()
	}
	if !slices.Equal(ids(paged), ids(all)) {
		t.Fatalf("pages %v, want %v", ids(paged), ids(all))
	}

	cases := []struct {
		name string
		q    ReceiptQuery
		want []int // indexes into rows
	}{
		{"deny", ReceiptQuery{Decision: "deny"}, []int{8, 5, 2}},
		{"allow", ReceiptQuery{Decision: "allow"}, []int{7, 6, 4, 3, 1, 0}},
		{"reason code", ReceiptQuery{ReasonCode: "UNKNOWN_TOOL"}, []int{8, 5, 2}},
		{"reason code prefix is no match", ReceiptQuery{ReasonCode: "UNKNOWN"}, nil},
		{"receipt id", ReceiptQuery{ReceiptID: rows[3].ReceiptID}, []int{3}},
		{"tool call id", ReceiptQuery{ToolCallID: rows[6].ToolCallID}, []int{6}},
		{"quote in a value is data", ReceiptQuery{Agent: `x' OR 1=1 --`}, []int{4}},
		{"agent", ReceiptQuery{Agent: "agent-7"}, []int{8, 7, 6, 5, 3, 2, 1, 0}},
		{"server, tool, session, kind", ReceiptQuery{Server: "files", Tool: "read_file", Session: "sess-1", Kind: "decision"}, []int{8, 7, 6, 5, 4, 3, 2, 1, 0}},
		{"other server", ReceiptQuery{Server: "github"}, nil},
		{"enforcement point", ReceiptQuery{EP: "gw-1"}, []int{8, 7, 6, 5, 4, 3, 2, 1, 0}},
		{"other enforcement point", ReceiptQuery{EP: "gw-2"}, nil},
		{"time range [from, to)", ReceiptQuery{From: time.UnixMilli(int64(rows[5].TimeMS)), To: time.UnixMilli(int64(rows[7].TimeMS))}, []int{6, 5}},
	}
	for _, c := range cases {
		var want []string
		for _, i := range c.want {
			want = append(want, rows[i].ReceiptID)
		}
		if got := ids(search(c.q)); !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", c.name, got, want)
		}
	}

	for _, bad := range []ReceiptQuery{{Kind: "checkpoint"}, {Decision: "maybe"}, {Agent: strings.Repeat("a", MaxFilterLen+1)}, {Limit: -1}} {
		if _, err := SearchReceipts(ctx, conn, db, bad); !errors.Is(err, ErrBadFilter) {
			t.Errorf("search %+v: %v, want ErrBadFilter", bad, err)
		}
	}
}

// TestReceiptCopiesAndChainPositions: a redelivered receipt is one copy, a
// second different row under the same id is a second copy, an absent id
// none; ReceiptsAt finds the link at a chain position.
func TestReceiptCopiesAndChainPositions(t *testing.T) {
	ctx, conn, db := migrated(t)
	_, rows := chainOf(t, "w1-0", 3, t0)
	for i := 0; i < 2; i++ {
		if err := InsertReceipts(ctx, conn, db, rows); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReceiptCopies(ctx, conn, db, rows[1].ReceiptID)
	if err != nil || len(got) != 1 || got[0].CloudEvent != rows[1].CloudEvent || len(CompareColumns(got[0], rows[1])) != 0 {
		t.Fatalf("copies of a redelivered receipt: %d %v", len(got), err)
	}
	if got, err := ReceiptCopies(ctx, conn, db, "0190a1b2-ffff-7000-8000-000000000000"); err != nil || len(got) != 0 {
		t.Fatalf("absent receipt: %d copies, %v", len(got), err)
	}
	forged := rows[1]
	forged.Decision = "allow-forged"
	if err := InsertReceipts(ctx, conn, db, []ReceiptRow{forged}); err != nil {
		t.Fatal(err)
	}
	got, err = ReceiptCopies(ctx, conn, db, rows[1].ReceiptID)
	if err != nil || len(got) != 2 {
		t.Fatalf("conflicting copies: %d, %v; want 2", len(got), err)
	}
	decisions := []string{got[0].Decision, got[1].Decision}
	slices.Sort(decisions)
	if !slices.Equal(decisions, []string{rows[1].Decision, "allow-forged"}) {
		t.Fatalf("copies: %v", decisions)
	}

	at, err := ReceiptsAt(ctx, conn, db, "w1-0", 3)
	if err != nil || len(at) != 1 || at[0].ReceiptID != rows[2].ReceiptID {
		t.Fatalf("ReceiptsAt(w1-0, 3): %v %v", at, err)
	}
	if at, err := ReceiptsAt(ctx, conn, db, "w1-0", 4); err != nil || len(at) != 0 {
		t.Fatalf("ReceiptsAt past the head: %v %v", at, err)
	}
}

// TestToolCallByID finds a call's ToolCallEvent in v_tool_calls.
func TestToolCallByID(t *testing.T) {
	ctx, conn, db := migrated(t)
	ev := toolCallEvent(t, callA, tcAt)
	raw := signed(t, testKey(t), callA, tcAt, &ev)
	if err := NewSinkWriter(conn, db).Write(ctx, []schemas.AuditRecord{{Subject: schemas.ToolCallEventSubject("files"), Data: raw, StreamSeq: 1}}); err != nil {
		t.Fatal(err)
	}
	got, err := ToolCallByID(ctx, conn, db, "gw-1", callA)
	if err != nil || got == nil {
		t.Fatalf("ToolCallByID: %v %v", got, err)
	}
	if got.ToolID != "files/read_file" || got.DurationMS != 77 || got.CloudEvent != string(raw) || got.AgentID != "agent-7" {
		t.Fatalf("row: %+v", got)
	}
	if got, err := ToolCallByID(ctx, conn, db, "gw-1", fmt.Sprint(callA[:len(callA)-1], "f")); err != nil || got != nil {
		t.Fatalf("absent call: %v %v", got, err)
	}
	if got, err := ToolCallByID(ctx, conn, db, "gw-2", callA); err != nil || got != nil {
		t.Fatalf("another enforcement point's call with the same id: %v %v", got, err)
	}
}

// TestTotals: the overview's headline figures, deduplicated, filtered like
// the canned queries.
func TestTotals(t *testing.T) {
	ctx, conn, db := migrated(t)
	_, rows := chainOf(t, "w1-0", 9, t0) // 3 denials (seq 3, 6, 9)
	rows[0].AgentID = "agent-8"
	rows[1].AgentID = ""      // a malformed envelope has no agent
	rows[3].Phase = "post"    // a result...
	rows[3].Decision = "deny" // ...denied after the tool ran
	rows[3].ToolCallID = rows[2].ToolCallID
	for i := 0; i < 2; i++ {
		if err := InsertReceipts(ctx, conn, db, rows); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		p    Params
		want CallTotals
	}{
		{"all", Params{}, CallTotals{Calls: 8, Denials: 3, PostDenials: 1, Agents: 2}},
		{"agent", Params{Agent: "agent-8"}, CallTotals{Calls: 1, Agents: 1}},
		{"server and tool", Params{Server: "files", Tool: "read_file"}, CallTotals{Calls: 8, Denials: 3, PostDenials: 1, Agents: 2}},
		{"other tool", Params{Tool: "write_file"}, CallTotals{}},
		{"[from, to)", Params{From: time.UnixMilli(int64(rows[2].TimeMS)), To: time.UnixMilli(int64(rows[6].TimeMS))},
			CallTotals{Calls: 3, Denials: 2, PostDenials: 1, Agents: 1}},
	}
	for _, c := range cases {
		got, err := Totals(ctx, conn, db, c.p)
		if err != nil || got != c.want {
			t.Errorf("%s: %+v %v, want %+v", c.name, got, err, c.want)
		}
	}
}
