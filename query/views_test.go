package query

import (
	"context"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The audit workload: a small, hand-made history whose every figure is
// known, stored with sink-redelivery duplicates. Times are offsets from
// wlH0 (10:00 UTC) and wlH1 (11:00 UTC) on 2026-03-02.
var (
	wlH0 = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	wlH1 = wlH0.Add(time.Hour)
)

const (
	wlDigestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	wlDigestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// wlCall is one decision (phase pre, kind decision; or phase post, kind
// effect) of the workload.
type wlCall struct {
	call, phase, agent, session, server, tool, class, decision string
	codes                                                      []string
	at                                                         time.Time
	digest                                                     string
}

// wlDecisions: c6 is allowed before the server:files kill switch, c7
// denied during it, c9 allowed after its clear; c13 is a malformed
// envelope (no call id); c8's result is denied after the tool ran; c11 is
// allowed while the global kill switch is set (it slipped through).
var wlDecisions = []wlCall{
	{"c1", "pre", "alice", "s1", "files", "read_file", "read", "allow", nil, wlH0.Add(1 * time.Minute), wlDigestA},
	{"c2", "pre", "alice", "s1", "files", "write_file", "write", "deny", []string{"IDEMPOTENCY_KEY_REQUIRED"}, wlH0.Add(2 * time.Minute), wlDigestA},
	{"c3", "pre", "bob", "s2", "files", "write_file", "write", "allow", nil, wlH0.Add(3 * time.Minute), wlDigestA},
	{"c4", "pre", "bob", "s2", "github", "create_issue", "write", "deny", []string{"NO_CAPABILITY", "SCOPE_MISMATCH"}, wlH0.Add(4 * time.Minute), wlDigestA},
	{"c14", "pre", "bob", "s2", "github", "create_issue", "write", "require_approval", nil, wlH0.Add(5 * time.Minute), wlDigestA},
	{"c6", "pre", "alice", "s1", "files", "read_file", "read", "allow", nil, wlH0.Add(9 * time.Minute), wlDigestA},
	{"c7", "pre", "alice", "s1", "files", "read_file", "read", "deny", []string{"KILL_SWITCH"}, wlH0.Add(15 * time.Minute), wlDigestA},
	{"c8", "pre", "bob", "s2", "github", "list_prs", "read", "allow", nil, wlH0.Add(15 * time.Minute), wlDigestA},
	{"c9", "pre", "alice", "s1", "files", "read_file", "read", "allow", nil, wlH0.Add(25 * time.Minute), wlDigestA},
	{"", "pre", "", "", "files", "", "", "deny", []string{"VAL-HTC-001"}, wlH0.Add(30 * time.Minute), wlDigestA},
	{"c12", "pre", "bob", "s2", "files", "read_file", "read", "deny", []string{"KILL_SWITCH"}, wlH1.Add(10 * time.Minute), wlDigestA},
	{"c10", "pre", "carol", "s3", "github", "list_prs", "read", "deny", []string{"KILL_SWITCH"}, wlH1.Add(40 * time.Minute), wlDigestB},
	{"c11", "pre", "carol", "s3", "files", "write_file", "write", "allow", nil, wlH1.Add(45 * time.Minute), wlDigestB},

	{"c1", "post", "alice", "s1", "files", "read_file", "read", "allow", nil, wlH0.Add(1*time.Minute + 300*time.Millisecond), wlDigestA},
	{"c3", "post", "bob", "s2", "files", "write_file", "write", "allow", nil, wlH0.Add(3*time.Minute + 300*time.Millisecond), wlDigestA},
	{"c6", "post", "alice", "s1", "files", "read_file", "read", "allow", nil, wlH0.Add(9*time.Minute + 300*time.Millisecond), wlDigestA},
	{"c8", "post", "bob", "s2", "github", "list_prs", "read", "deny", []string{"DOC_HASH_MISMATCH"}, wlH0.Add(15*time.Minute + 300*time.Millisecond), wlDigestA},
	{"c9", "post", "alice", "s1", "files", "read_file", "read", "allow", nil, wlH0.Add(25*time.Minute + 300*time.Millisecond), wlDigestA},
	{"c11", "post", "carol", "s3", "files", "write_file", "write", "allow", nil, wlH1.Add(45*time.Minute + 300*time.Millisecond), wlDigestB},
}

// wlControl is one control receipt of the workload.
type wlControl struct {
	id, verb, target string
	seq              uint64
	accepted         bool
	code             string
	at               time.Time
}

// The kill switches: server:files from 10:10 to 10:20; agent:bob set at
// 11:00, set again at 11:05 (still one period), cleared at 11:50; global
// from 11:30 on. k-refused is refused; k-list only reads.
var wlControls = []wlControl{
	{"k1", "killswitch.set", "server:files", 1, true, "", wlH0.Add(10 * time.Minute)},
	{"k2", "killswitch.clear", "server:files", 2, true, "", wlH0.Add(20 * time.Minute)},
	{"k3", "killswitch.set", "agent:bob", 3, true, "", wlH1},
	{"k-refused", "killswitch.set", "server:", 0, false, "CTL_INVALID", wlH1.Add(1 * time.Minute)},
	{"q1", "quarantine.set", "s-9", 4, true, "", wlH1.Add(2 * time.Minute)},
	{"rv", "revoke", "agent:mallory", 5, true, "", wlH1.Add(3 * time.Minute)},
	{"k-list", "killswitch.list", "", 0, true, "", wlH1.Add(4 * time.Minute)},
	{"k4", "killswitch.set", "agent:bob", 6, true, "", wlH1.Add(5 * time.Minute)},
	{"pin", "registry.pin", wlDigestB, 7, true, "", wlH1.Add(20 * time.Minute)},
	{"g1", "killswitch.set", "global", 8, true, "", wlH1.Add(30 * time.Minute)},
	{"k5", "killswitch.clear", "agent:bob", 9, true, "", wlH1.Add(50 * time.Minute)},
	{"fl", "replay.flush", "", 10, true, "", wlH1.Add(55 * time.Minute)},
}

// wlReceiptRows turns wlDecisions into receipts rows on one chain.
func wlReceiptRows() []ReceiptRow {
	var rows []ReceiptRow
	for i, d := range wlDecisions {
		kind := "decision"
		if d.phase == "post" {
			kind = "effect"
		}
		rows = append(rows, ReceiptRow{
			ReceiptID: fmt.Sprintf("r-%02d-%s-%s", i, d.call, d.phase), Kind: kind, Phase: d.phase,
			Time: d.at.Truncate(time.Second), TimeMS: uint64(d.at.UnixMilli()), ToolCallID: wlCallID(d.call),
			SessionID: d.session, EPID: "gw-1", ServerID: d.server, ToolName: d.tool, ToolClass: d.class,
			Decision: d.decision, ReasonCodes: nonNil(d.codes), AgentID: d.agent, RegistryDigest: d.digest,
			ChainID: "wl-0", ChainSeq: uint64(i + 1), CloudEvent: "{}",
		})
	}
	return rows
}

// wlCallID is the tool_call_id of a workload call ("" stays "": the
// malformed envelope has none).
func wlCallID(call string) string {
	if call == "" {
		return ""
	}
	return "tc-" + call
}

func wlControlRows() []ControlEventRow {
	var rows []ControlEventRow
	for i, c := range wlControls {
		rows = append(rows, ControlEventRow{
			EventID: "ctl-" + c.id, Type: "dev.talos.receipt.control.v1", Verb: c.verb, Time: c.at.Truncate(time.Second),
			TimeMS: uint64(c.at.UnixMilli()), StreamSeq: c.seq, Actor: "oncall", Target: c.target, Reason: "drill-" + c.id,
			CommandID: fmt.Sprintf("cmd-%d", i), Accepted: c.accepted, Code: c.code, ChainID: "ctl-0", ChainSeq: uint64(i + 1),
			CloudEvent: "{}",
		})
	}
	return rows
}

// wlToolCallRows: 100 executed files/read_file calls lasting 1..100 ms and
// one failed github/list_prs call of 7 ms (all at 10:40, phase post); and
// three calls with redactions (one denied before it ran, phase pre).
func wlToolCallRows() []ToolCallRow {
	var rows []ToolCallRow
	tc := func(id, phase, server, tool string, ok bool, ms uint64, at time.Time, rules ...string) ToolCallRow {
		r := ToolCallRow{
			EventID: "ev-" + id, Time: at.Truncate(time.Second), TimeMS: uint64(at.UnixMilli()), ToolCallID: "lat-" + id,
			TraceID: "trace", SessionID: "s1", EPID: "gw-1", ServerID: server, ToolName: tool, ToolID: server + "/" + tool,
			ToolVersion: "1.0.0", Transport: "mcp", SideEffect: "READ", OK: ok, StartedAt: at.Truncate(time.Second),
			StartedAtMS: uint64(at.UnixMilli()), EndedAt: at.Truncate(time.Second), EndedAtMS: uint64(at.UnixMilli()) + ms,
			DurationMS: ms, Phase: phase, Decision: "allow", AgentID: "alice", CloudEvent: "{}",
		}
		for i, rule := range rules {
			r.RedactionRules = append(r.RedactionRules, rule)
			r.RedactionPointers = append(r.RedactionPointers, fmt.Sprintf("/args/%d", i))
			r.RedactionPseudonyms = append(r.RedactionPseudonyms, fmt.Sprintf("hmac-sha256:k1:%s-%d", id, i))
		}
		return r
	}
	at := wlH0.Add(40 * time.Minute)
	for i := 1; i <= 100; i++ {
		rows = append(rows, tc(fmt.Sprintf("read-%03d", i), "post", "files", "read_file", true, uint64(i), at))
	}
	rows = append(rows, tc("prs-1", "post", "github", "list_prs", false, 7, at))
	day1 := wlH0.Add(24 * time.Hour)
	rows = append(rows,
		tc("red-1", "post", "files", "read_file", true, 0, wlH0.Add(41*time.Minute), "github-pat", "aws-key"),
		tc("red-2", "pre", "files", "write_file", false, 0, wlH0.Add(42*time.Minute), "github-pat"),
		tc("red-3", "post", "github", "list_prs", true, 0, day1, "slack-token"),
	)
	rows[len(rows)-2].Decision = "deny"
	return rows
}

// loadAuditWorkload stores the workload in db, every table twice over
// (the second time as a sink redelivery of part of it would: another
// INSERT of the same rows).
func loadAuditWorkload(t testing.TB, ctx context.Context, conn driver.Conn, db string) {
	t.Helper()
	recs, ctls, calls := wlReceiptRows(), wlControlRows(), wlToolCallRows()
	for _, part := range []struct{ r, c, tc int }{{len(recs), len(ctls), len(calls)}, {len(recs) - 3, len(ctls) - 2, 60}} {
		if err := InsertReceipts(ctx, conn, db, recs[:part.r]); err != nil {
			t.Fatal(err)
		}
		if err := InsertControlEvents(ctx, conn, db, ctls[:part.c]); err != nil {
			t.Fatal(err)
		}
		if err := InsertToolCalls(ctx, conn, db, calls[:part.tc]); err != nil {
			t.Fatal(err)
		}
	}
}

// cell renders one Result value for comparison: times as 15:04:05.000
// (dates as 2006-01-02), floats with two decimals, arrays joined by "+".
func cell(v any) string {
	switch x := v.(type) {
	case time.Time:
		if x.Hour() == 0 && x.Minute() == 0 && x.Second() == 0 && x.Nanosecond() == 0 {
			return x.Format(time.DateOnly)
		}
		return x.Format("15:04:05.000")
	case float64:
		return fmt.Sprintf("%.2f", x)
	case []string:
		return strings.Join(x, "+")
	case string:
		if x == "" {
			return "''"
		}
		return x
	}
	return fmt.Sprint(v)
}

// runCanned runs a canned query and renders each row as its cells joined
// by spaces, first n columns only (n = 0: all).
func runCanned(t *testing.T, ctx context.Context, conn driver.Conn, db, name string, p Params, n int) []string {
	t.Helper()
	res, err := RunCanned(ctx, conn, db, name, p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c, _ := LookupCanned(name)
	if !slices.Equal(res.Columns, c.Columns) || res.Name != name {
		t.Fatalf("%s: result columns %v, want %v", name, res.Columns, c.Columns)
	}
	out := []string{}
	for _, row := range res.Rows {
		if len(row) != len(res.Columns) {
			t.Fatalf("%s: row of %d values for %d columns", name, len(row), len(res.Columns))
		}
		if n > 0 {
			row = row[:n]
		}
		var cells []string
		for _, v := range row {
			cells = append(cells, cell(v))
		}
		out = append(out, strings.Join(cells, " "))
	}
	return out
}

// sqlRows runs sql (with {db} for the database) and renders its rows
// like runCanned.
func sqlRows(t *testing.T, ctx context.Context, conn driver.Conn, db, sql string) []string {
	t.Helper()
	rows, err := conn.Query(ctx, strings.ReplaceAll(sql, "{db}", "`"+db+"`"))
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	out := []string{}
	for rows.Next() {
		vals := make([]any, len(types))
		for i, ct := range types {
			vals[i] = cannedScanTarget(ct)
		}
		if err := rows.Scan(vals...); err != nil {
			t.Fatal(err)
		}
		var cells []string
		for _, v := range vals {
			cells = append(cells, cell(cannedValue(cannedDeref(v))))
		}
		out = append(out, strings.Join(cells, " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkRows(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// T-VIEWS: every view and canned query returns the known figures of
// the workload, whose every row was stored twice.
func TestAuditViewsKnownAnswers(t *testing.T) {
	ctx, conn, db := migrated(t)
	loadAuditWorkload(t, ctx, conn, db)
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.receipts"); n != uint64(2*len(wlDecisions)-3) {
		t.Fatalf("raw receipts: %d rows, want the duplicates too", n)
	}
	run := func(name string, p Params, n int) []string { return runCanned(t, ctx, conn, db, name, p, n) }
	rows := func(sql string) []string { return sqlRows(t, ctx, conn, db, sql) }

	// The views, each read directly.
	checkRows(t, "v_denials", rows(`SELECT tool_call_id, phase, agent_id, reason_codes FROM {db}.v_denials ORDER BY time_ms, phase`), []string{
		"tc-c2 pre alice IDEMPOTENCY_KEY_REQUIRED", "tc-c4 pre bob NO_CAPABILITY+SCOPE_MISMATCH", "tc-c7 pre alice KILL_SWITCH",
		"tc-c8 post bob DOC_HASH_MISMATCH", "'' pre '' VAL-HTC-001", "tc-c12 pre bob KILL_SWITCH", "tc-c10 pre carol KILL_SWITCH",
	})
	checkRows(t, "v_denials_by_reason", rows(`SELECT hour, server_id, tool_name, agent_id, reason_code, denials FROM {db}.v_denials_by_reason
		ORDER BY hour, server_id, tool_name, agent_id, reason_code`), []string{
		"10:00:00.000 files '' '' VAL-HTC-001 1",
		"10:00:00.000 files read_file alice KILL_SWITCH 1",
		"10:00:00.000 files write_file alice IDEMPOTENCY_KEY_REQUIRED 1",
		"10:00:00.000 github create_issue bob NO_CAPABILITY 1",
		"10:00:00.000 github create_issue bob SCOPE_MISMATCH 1",
		"10:00:00.000 github list_prs bob DOC_HASH_MISMATCH 1",
		"11:00:00.000 files read_file bob KILL_SWITCH 1",
		"11:00:00.000 github list_prs carol KILL_SWITCH 1",
	})
	checkRows(t, "v_write_calls", rows(`SELECT tool_call_id, agent_id, decision FROM {db}.v_write_calls ORDER BY time_ms`), []string{
		"tc-c2 alice deny", "tc-c3 bob allow", "tc-c4 bob deny", "tc-c14 bob require_approval", "tc-c11 carol allow",
	})
	checkRows(t, "v_incident_timeline", rows(`SELECT receipt_id, verb, scope, target, accepted, code, stream_seq FROM {db}.v_incident_timeline ORDER BY time_ms`), []string{
		"ctl-k1 killswitch.set server server:files 1 '' 1",
		"ctl-k2 killswitch.clear server server:files 1 '' 2",
		"ctl-k3 killswitch.set agent agent:bob 1 '' 3",
		"ctl-k-refused killswitch.set server server: 0 CTL_INVALID 0",
		"ctl-q1 quarantine.set session s-9 1 '' 4",
		"ctl-rv revoke agent agent:mallory 1 '' 5",
		"ctl-k4 killswitch.set agent agent:bob 1 '' 6",
		"ctl-pin registry.pin registry " + wlDigestB + " 1 '' 7",
		"ctl-g1 killswitch.set global global 1 '' 8",
		"ctl-k5 killswitch.clear agent agent:bob 1 '' 9",
		"ctl-fl replay.flush all '' 1 '' 10",
	})
	checkRows(t, "v_killswitch_intervals", rows(`SELECT target, scope_kind, scope_value, toDateTime(intDiv(set_ms, 1000), 'UTC'), clear_ms = 0,
		if(clear_ms = 0, '', toString(toDateTime(intDiv(clear_ms, 1000), 'UTC'))), active, set_receipt_id, clear_receipt_id, set_seq, clear_seq
		FROM {db}.v_killswitch_intervals ORDER BY set_ms`), []string{
		"server:files server files 10:10:00.000 0 2026-03-02 10:20:00 0 ctl-k1 ctl-k2 1 2",
		"agent:bob agent bob 11:00:00.000 0 2026-03-02 11:50:00 0 ctl-k3 ctl-k5 3 9",
		"global global '' 11:30:00.000 1 '' 1 ctl-g1 '' 8 0",
	})
	checkRows(t, "v_calls_during_killswitch", rows(`SELECT tool_call_id, phase, decision, killswitch_target, killswitch_receipt_id
		FROM {db}.v_calls_during_killswitch ORDER BY time_ms, phase`), []string{
		"tc-c7 pre deny server:files ctl-k1", "tc-c12 pre deny agent:bob ctl-k3", "tc-c10 pre deny global ctl-g1",
		"tc-c11 pre allow global ctl-g1", "tc-c11 post allow global ctl-g1",
	})
	checkRows(t, "v_registry_digests", rows(`SELECT hour, registry_digest, first_seen, last_seen, calls FROM {db}.v_registry_digests ORDER BY hour, first_seen_ms`), []string{
		"10:00:00.000 " + wlDigestA + " 10:01:00.000 10:30:00.000 10",
		"11:00:00.000 " + wlDigestA + " 11:10:00.000 11:10:00.000 1",
		"11:00:00.000 " + wlDigestB + " 11:40:00.000 11:45:00.000 2",
	})
	checkRows(t, "v_tool_latency", rows(`SELECT server_id, tool_name, count(), sum(duration_ms), countIf(ok = 0) FROM {db}.v_tool_latency
		GROUP BY server_id, tool_name ORDER BY server_id, tool_name`), []string{
		"files read_file 101 5050 0", "github list_prs 2 7 1",
	})
	checkRows(t, "v_redaction_counts", rows(`SELECT day, rule, redactions FROM {db}.v_redaction_counts ORDER BY day, rule`), []string{
		"2026-03-02 aws-key 1", "2026-03-02 github-pat 2", "2026-03-03 slack-token 1",
	})

	// The canned queries, without filters.
	all := Params{}
	checkRows(t, "calls-over-time", run("calls-over-time", all, 0), []string{"10:00:00.000 10 4 1", "11:00:00.000 3 2 0"})
	checkRows(t, "denial-reasons", run("denial-reasons", all, 0), []string{
		"KILL_SWITCH 3", "DOC_HASH_MISMATCH 1", "IDEMPOTENCY_KEY_REQUIRED 1", "NO_CAPABILITY 1", "SCOPE_MISMATCH 1", "VAL-HTC-001 1",
	})
	checkRows(t, "denials-by-reason", run("denials-by-reason", all, 0), []string{
		"10:00:00.000 files IDEMPOTENCY_KEY_REQUIRED 1", "10:00:00.000 files KILL_SWITCH 1", "10:00:00.000 files VAL-HTC-001 1",
		"10:00:00.000 github DOC_HASH_MISMATCH 1", "10:00:00.000 github NO_CAPABILITY 1", "10:00:00.000 github SCOPE_MISMATCH 1",
		"11:00:00.000 files KILL_SWITCH 1", "11:00:00.000 github KILL_SWITCH 1",
	})
	checkRows(t, "top-denied-agents", run("top-denied-agents", all, 0), []string{"bob 3", "alice 2", "'' 1", "carol 1"})
	checkRows(t, "top-denied-tools", run("top-denied-tools", all, 0), []string{
		"files read_file 2", "github list_prs 2", "files '' 1", "files write_file 1", "github create_issue 1",
	})
	checkRows(t, "write-calls-per-agent", run("write-calls-per-agent", all, 0), []string{"bob 1 1 1 3", "alice 0 1 0 1", "carol 1 0 0 1"})
	checkRows(t, "incident-timeline", run("incident-timeline", all, 9), []string{
		"11:55:00.000 replay.flush all '' oncall drill-fl 1 '' ctl-fl",
		"11:50:00.000 killswitch.clear agent agent:bob oncall drill-k5 1 '' ctl-k5",
		"11:30:00.000 killswitch.set global global oncall drill-g1 1 '' ctl-g1",
		"11:20:00.000 registry.pin registry " + wlDigestB + " oncall drill-pin 1 '' ctl-pin",
		"11:05:00.000 killswitch.set agent agent:bob oncall drill-k4 1 '' ctl-k4",
		"11:03:00.000 revoke agent agent:mallory oncall drill-rv 1 '' ctl-rv",
		"11:02:00.000 quarantine.set session s-9 oncall drill-q1 1 '' ctl-q1",
		"11:01:00.000 killswitch.set server server: oncall drill-k-refused 0 CTL_INVALID ctl-k-refused",
		"11:00:00.000 killswitch.set agent agent:bob oncall drill-k3 1 '' ctl-k3",
		"10:20:00.000 killswitch.clear server server:files oncall drill-k2 1 '' ctl-k2",
		"10:10:00.000 killswitch.set server server:files oncall drill-k1 1 '' ctl-k1",
	})
	checkRows(t, "calls-during-killswitch", run("calls-during-killswitch", all, 8), []string{
		"11:45:00.000 tc-c11 carol files write_file allow global post",
		"11:45:00.000 tc-c11 carol files write_file allow global pre",
		"11:40:00.000 tc-c10 carol github list_prs deny global pre",
		"11:10:00.000 tc-c12 bob files read_file deny agent:bob pre",
		"10:15:00.000 tc-c7 alice files read_file deny server:files pre",
	})
	checkRows(t, "registry-digests", run("registry-digests", all, 0), []string{
		wlDigestA + " 10:01:00.000 11:10:00.000 11 " + fmt.Sprint(wlH0.Add(time.Minute).UnixMilli()) + " " + fmt.Sprint(wlH1.Add(10*time.Minute).UnixMilli()),
		wlDigestB + " 11:40:00.000 11:45:00.000 2 " + fmt.Sprint(wlH1.Add(40*time.Minute).UnixMilli()) + " " + fmt.Sprint(wlH1.Add(45*time.Minute).UnixMilli()),
	})
	checkRows(t, "redaction-counts", run("redaction-counts", all, 0), []string{
		"2026-03-02 github-pat 2", "2026-03-02 aws-key 1", "2026-03-03 slack-token 1",
	})
	checkRows(t, "latency-percentiles", run("latency-percentiles", all, 0), []string{
		"files read_file 101 50.00 90.00 99.00 100 0", "github list_prs 2 3.50 6.30 6.93 7 1",
	})

	// The percentiles on the known distribution 1..100 ms alone (the
	// redacted call lasted 0 ms and is filtered out by time), exactly.
	res, err := RunCanned(ctx, conn, db, "latency-percentiles", Params{Server: "files", To: wlH0.Add(41 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 {
		t.Fatalf("latency-percentiles for files before 10:41: %v", res.Rows)
	}
	r := res.Rows[0]
	for i, want := range []float64{50.5, 90.1, 99.01} {
		if got := r[3+i].(float64); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v (interpolated quantile of 1..100)", res.Columns[3+i], got, want)
		}
	}
	if r[2] != uint64(100) || r[6] != uint64(100) || r[7] != uint64(0) {
		t.Errorf("files latency row %v: want 100 calls, max 100, 0 errors", r)
	}

	// Filters.
	checkRows(t, "denial-reasons from 11:00", run("denial-reasons", Params{From: wlH1}, 0), []string{"KILL_SWITCH 2"})
	checkRows(t, "denial-reasons [10:15, 10:30)", run("denial-reasons", Params{From: wlH0.Add(15 * time.Minute), To: wlH0.Add(30 * time.Minute)}, 0),
		[]string{"DOC_HASH_MISMATCH 1", "KILL_SWITCH 1"})
	checkRows(t, "calls-over-time server github", run("calls-over-time", Params{Server: "github"}, 0), []string{"10:00:00.000 3 1 1", "11:00:00.000 1 1 0"})
	checkRows(t, "top-denied-tools agent alice", run("top-denied-tools", Params{Agent: "alice"}, 0), []string{"files read_file 1", "files write_file 1"})
	checkRows(t, "write-calls-per-agent tool create_issue", run("write-calls-per-agent", Params{Tool: "create_issue"}, 0), []string{"bob 0 1 1 2"})
	checkRows(t, "top-denied-agents limit 2", run("top-denied-agents", Params{Limit: 2}, 0), []string{"bob 3", "alice 2"})
	checkRows(t, "calls-during-killswitch agent bob", run("calls-during-killswitch", Params{Agent: "bob"}, 2), []string{"11:10:00.000 tc-c12"})
	checkRows(t, "incident-timeline [11:00, 11:03)", run("incident-timeline", Params{From: wlH1, To: wlH1.Add(3 * time.Minute)}, 2),
		[]string{"11:02:00.000 quarantine.set", "11:01:00.000 killswitch.set", "11:00:00.000 killswitch.set"})
	// Hourly and daily aggregates take the whole periods that overlap.
	checkRows(t, "registry-digests from 11:00", run("registry-digests", Params{From: wlH1}, 4), []string{
		wlDigestA + " 11:10:00.000 11:10:00.000 1", wlDigestB + " 11:40:00.000 11:45:00.000 2",
	})
	checkRows(t, "registry-digests [10:30, 10:31)", run("registry-digests", Params{From: wlH0.Add(30 * time.Minute), To: wlH0.Add(31 * time.Minute)}, 4),
		[]string{wlDigestA + " 10:01:00.000 10:30:00.000 10"})
	checkRows(t, "registry-digests to 11:00", run("registry-digests", Params{To: wlH1}, 4), []string{wlDigestA + " 10:01:00.000 10:30:00.000 10"})
	checkRows(t, "redaction-counts from day 2", run("redaction-counts", Params{From: wlH0.Add(24 * time.Hour)}, 0), []string{"2026-03-03 slack-token 1"})
	checkRows(t, "redaction-counts to day 1 noon", run("redaction-counts", Params{To: wlH0.Add(2 * time.Hour)}, 0),
		[]string{"2026-03-02 github-pat 2", "2026-03-02 aws-key 1"})
	checkRows(t, "redaction-counts to day 2 midnight", run("redaction-counts", Params{To: wlH0.Add(14 * time.Hour)}, 0),
		[]string{"2026-03-02 github-pat 2", "2026-03-02 aws-key 1"})
	// A filter the query does not honour is ignored.
	checkRows(t, "redaction-counts agent nobody", run("redaction-counts", Params{Agent: "nobody"}, 0), []string{
		"2026-03-02 github-pat 2", "2026-03-02 aws-key 1", "2026-03-03 slack-token 1",
	})
	// A value that looks like SQL is only ever a bound value.
	checkRows(t, "top-denied-agents agent injection", run("top-denied-agents", Params{Agent: "x' OR 1=1 --"}, 0), []string{})
}

// The README's example for each view runs on ClickHouse (against the
// workload), and every view has one.
func TestREADMEViewExamples(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Auditor views and queries\n")
	if !ok {
		t.Fatal("README has no section \"Auditor views and queries\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "```sql\n")
	if !ok {
		t.Fatal("the section has no SQL examples")
	}
	block, _, _ = strings.Cut(block, "```")
	ctx, conn, db := migrated(t)
	loadAuditWorkload(t, ctx, conn, db)
	documented := map[string]bool{}
	for _, stmt := range strings.Split(block, ";") {
		stmt = strings.TrimSpace(stmt)
		if stmt == "" {
			continue
		}
		if m := regexp.MustCompile(`^-- (v_[a-z_]+):`).FindStringSubmatch(stmt); m != nil {
			documented[m[1]] = true
		}
		sql := strings.ReplaceAll(stmt, "talos.", "`"+db+"`.")
		rows, err := conn.Query(ctx, sql)
		if err != nil {
			t.Errorf("README example does not run: %v\n%s", err, stmt)
			continue
		}
		for rows.Next() {
		}
		if err := rows.Err(); err != nil {
			t.Errorf("README example: %v\n%s", err, stmt)
		}
		rows.Close()
	}
	var views []string
	if err := func() error {
		rows, err := conn.Query(ctx, "SELECT name FROM system.tables WHERE database = ? AND name LIKE 'v\\_%' ORDER BY name", db)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				return err
			}
			views = append(views, v)
		}
		return rows.Err()
	}(); err != nil {
		t.Fatal(err)
	}
	if len(views) < 14 {
		t.Fatalf("only %d views: %v", len(views), views)
	}
	for _, v := range views {
		if !documented[v] || !strings.Contains(section, "| `"+v+"` |") {
			t.Errorf("README documents no example or table row for %s", v)
		}
	}
}
