package query

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Calls of the MCP fixtures: a prompts/get, the tools/call during which a
// server asked for sampling, the sampling request, and a tools/call whose
// redacted arguments have members named like the new columns.
const (
	mcpPromptCall   = "0190f5b2-7c1e-7a3b-8d4e-00000000a001"
	mcpParentCall   = "0190f5b2-7c1e-7a3b-8d4e-00000000a002"
	mcpSamplingCall = "0190f5b2-7c1e-7a3b-8d4e-00000000a003"
	mcpLookalike    = "0190f5b2-7c1e-7a3b-8d4e-00000000a004"
)

// insertOld inserts rows into database.table as a database migrated to
// before migration 8 takes them: every column of cols but mcp_method and
// parent_tool_call_id.
func insertOld[R any](t *testing.T, ctx context.Context, conn driver.Conn, db, table string, cols []insertColumn[R], rows []R) {
	t.Helper()
	var names []string
	keep := func(name string) bool { return name != "mcp_method" && name != "parent_tool_call_id" }
	for _, c := range cols {
		if keep(c.name) {
			names = append(names, c.name)
		}
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO `"+db+"`."+table+" ("+strings.Join(names, ", ")+")")
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		var vals []any
		for j, v := range rowValues(cols, &rows[i]) {
			if keep(cols[j].name) {
				vals = append(vals, v)
			}
		}
		if err := b.Append(vals...); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

// mcpFixtures are signed records of MCP requests as the sink derives
// their rows: a prompts/get decision receipt, the sampling request's
// ToolCallEvent (linked to its call) and a tools/call event whose
// redacted arguments hold members named mcp_method and
// parent_tool_call_id.
func mcpFixtures(t *testing.T) ([]ReceiptRow, []ToolCallRow) {
	t.Helper()
	key := testKey(t)
	ch := receipts.NewChain("mcp-0", key)
	s, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: mcpPromptCall, Time: tcAt},
		&schemas.Receipt{EventType: schemas.KindDecision, Decision: schemas.DecisionAllow, ReasonCodes: []string{},
			ToolCallID: mcpPromptCall, EPID: "gw-1", ServerID: "everything", ToolName: "greeting", Phase: schemas.PhasePre,
			MCPMethod: schemas.MethodPromptsGet, ContentHashAlg: schemas.ContentHashAlg})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ReceiptRowFromEvent(s.JSON)
	if err != nil {
		t.Fatal(err)
	}
	if rec.MCPMethod != schemas.MethodPromptsGet {
		t.Fatalf("receipt row mcp_method %q", rec.MCPMethod)
	}
	sampling := toolCallEvent(t, mcpSamplingCall, tcAt)
	sampling.ToolName, sampling.ToolID = schemas.MethodSamplingCreateMessage, "everything/"+schemas.MethodSamplingCreateMessage
	sampling.MCPMethod, sampling.ParentToolCallID = schemas.MethodSamplingCreateMessage, mcpParentCall
	lookalike := toolCallEvent(t, mcpLookalike, tcAt)
	args := canonical(t, `{"mcp_method":"prompts/get","parent_tool_call_id":"`+mcpParentCall+`"}`)
	lookalike.ArgsHash, lookalike.ArgsRef, lookalike.Payloads.Args = sha256Hex(args), "sha256:"+sha256Hex(args), jsonkit.Canonical(args)
	lookalike.Redactions = []schemas.Redaction{}
	var calls []ToolCallRow
	for _, ev := range []*schemas.ToolCallEvent{&sampling, &lookalike} {
		row, _, err := ToolCallRowFromEvent(signed(t, key, ev.ToolCallID, tcAt, ev))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, row)
	}
	if calls[0].MCPMethod != schemas.MethodSamplingCreateMessage || calls[0].ParentToolCallID != mcpParentCall ||
		calls[1].MCPMethod != "" || calls[1].ParentToolCallID != "" {
		t.Fatalf("rows derived: %q %q, %q %q", calls[0].MCPMethod, calls[0].ParentToolCallID, calls[1].MCPMethod, calls[1].ParentToolCallID)
	}
	return []ReceiptRow{rec}, calls
}

// Migration 8 applies to a database at version 7 holding rows of MCP
// requests, twice; those rows read back with mcp_method and
// parent_tool_call_id as their signed JSON has them (so verification
// still finds them equal to it), a look-alike member of a call's
// arguments is not taken for them, and a fresh database gets the same
// schema.
func TestMigration8FromVersion7(t *testing.T) {
	ctx, conn, db := migratedTo(t, 7)
	recs, calls := mcpFixtures(t)
	insertOld(t, ctx, conn, db, TableReceipts, receiptColumns, recs)
	insertOld(t, ctx, conn, db, TableToolCalls, toolCallColumns, calls)
	for i := 0; i < 2; i++ {
		if err := Migrate(ctx, conn, db); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	fresh := db + "_fresh"
	t.Cleanup(func() { conn.Exec(context.Background(), "DROP DATABASE IF EXISTS `"+fresh+"`") })
	if err := Migrate(ctx, conn, fresh); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{db, fresh} {
		if v, err := AppliedVersion(ctx, conn, name); err != nil || v != SchemaVersion() {
			t.Fatalf("%s: AppliedVersion = %d, %v; want %d", name, v, err, SchemaVersion())
		}
		for _, obj := range []string{ViewReceipts, ViewDecisions, ViewToolCalls, ViewMCPRequests, ViewServerRequests,
			ViewDenials, ViewWriteCalls, ViewCallsDuringKillSwitch, ViewSecretUses, ViewToolLatency} {
			count(t, ctx, conn, "SELECT count() FROM `"+name+"`.`"+obj+"`")
		}
	}
	var stored []ReceiptRow
	if err := StreamReceipts(ctx, conn, db, func(r ReceiptRow) error { stored = append(stored, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0].MCPMethod != schemas.MethodPromptsGet || stored[0].ParentToolCallID != "" {
		t.Fatalf("version-7 receipt after migration: %+v", stored)
	}
	if d := CompareColumns(stored[0], recs[0]); d != nil {
		t.Fatalf("version-7 receipt differs from its signed JSON in %v", d)
	}
	var events []ToolCallRow
	if _, err := streamToolCalls(ctx, conn, db, func(r ToolCallRow) error { events = append(events, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 {
		t.Fatalf("%d tool_calls rows, want 2", len(events))
	}
	for _, want := range calls {
		i := slices.IndexFunc(events, func(r ToolCallRow) bool { return r.EventID == want.EventID })
		if i < 0 {
			t.Fatalf("event %s lost", want.EventID)
		}
		if d := CompareToolCallColumns(events[i], want); d != nil {
			t.Errorf("version-7 event of %s differs from its signed JSON in %v (mcp_method %q, parent %q)",
				want.ToolCallID, d, events[i].MCPMethod, events[i].ParentToolCallID)
		}
	}
	checkRows(t, "v_server_requests after migration", sqlRows(t, ctx, conn, db,
		`SELECT tool_call_id, method, parent_tool_call_id FROM {db}.v_server_requests`),
		[]string{mcpSamplingCall + " sampling/createMessage " + mcpParentCall})
}

// mcpWorkload: a tools/call (fetch) during which its server asked for
// sampling (allowed), elicitation (denied by a kill switch) and roots; a
// prompts/get denied and a resources/read allowed; a roots/list asked
// outside any call, and one during a call whose decision is not stored.
// The sampling request's receipt and event are stored twice.
func mcpWorkload(t *testing.T, ctx context.Context, conn driver.Conn, db string) {
	t.Helper()
	at := func(ms int) time.Time { return wlH0.Add(time.Duration(ms) * time.Millisecond) }
	var recs []ReceiptRow
	rec := func(call, method, tool, parent, decision string, ms int, codes ...string) {
		recs = append(recs, ReceiptRow{
			ReceiptID: fmt.Sprintf("mr-%02d", len(recs)), Kind: "decision", Phase: "pre", Time: at(ms).Truncate(time.Second),
			TimeMS: uint64(at(ms).UnixMilli()), ToolCallID: call, SessionID: "s1", EPID: "gw-1", ServerID: "everything",
			ToolName: tool, MCPMethod: method, ParentToolCallID: parent, ToolClass: "read", Decision: decision,
			ReasonCodes: nonNil(codes), AgentID: "alice", ChainID: "mcp-0", ChainSeq: uint64(len(recs) + 1), CloudEvent: "{}",
		})
	}
	rec("tc-p", "", "fetch", "", "allow", 1000)
	rec("tc-s", schemas.MethodSamplingCreateMessage, schemas.MethodSamplingCreateMessage, "tc-p", "allow", 1100)
	rec("tc-e", schemas.MethodElicitationCreate, schemas.MethodElicitationCreate, "tc-p", "deny", 1200, "KILL_SWITCH")
	rec("tc-g", schemas.MethodPromptsGet, "greeting", "", "deny", 2000, "TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL")
	rec("tc-r", schemas.MethodResourcesRead, "readme", "", "allow", 3000)
	var calls []ToolCallRow
	call := func(id, method, parent, decision string, ok bool, ms int) {
		calls = append(calls, ToolCallRow{
			EventID: "mev-" + id, Time: at(ms).Truncate(time.Second), TimeMS: uint64(at(ms).UnixMilli()), ToolCallID: id,
			SessionID: "s1", EPID: "gw-1", ServerID: "everything", ToolName: method, MCPMethod: method, ParentToolCallID: parent,
			Phase: "post", Decision: decision, OK: ok, AgentID: "alice", ArgsHash: "args-" + id, ResultHash: "result-" + id,
			ReceiptID: "receipt-" + id, CloudEvent: "{}",
		})
	}
	call("tc-s", schemas.MethodSamplingCreateMessage, "tc-p", "allow", true, 1150)
	call("tc-e", schemas.MethodElicitationCreate, "tc-p", "deny", false, 1200)
	call("tc-o", schemas.MethodRootsList, "", "allow", true, 4000)
	call("tc-q", schemas.MethodRootsList, "tc-gone", "allow", true, 5000)
	calls[1].Phase, calls[1].ResultHash = "pre", ""
	for _, part := range [][2]int{{len(recs), len(calls)}, {2, 1}} {
		if err := InsertReceipts(ctx, conn, db, recs[:part[0]]); err != nil {
			t.Fatal(err)
		}
		if err := InsertToolCalls(ctx, conn, db, calls[:part[1]]); err != nil {
			t.Fatal(err)
		}
	}
}

// The MCP views and canned queries answer the known figures of
// mcpWorkload: every decided request once with its method, and each
// server request beside the call it was made during.
func TestMCPViewsKnownAnswers(t *testing.T) {
	ctx, conn, db := migrated(t)
	mcpWorkload(t, ctx, conn, db)
	rows := func(sql string) []string { return sqlRows(t, ctx, conn, db, sql) }
	checkRows(t, "v_decisions", rows(`SELECT tool_call_id, mcp_method, parent_tool_call_id FROM {db}.v_decisions ORDER BY time_ms`), []string{
		"tc-p '' ''", "tc-s sampling/createMessage tc-p", "tc-e elicitation/create tc-p", "tc-g prompts/get ''", "tc-r resources/read ''",
	})
	checkRows(t, "v_mcp_requests", rows(`SELECT tool_call_id, method, tool_name, parent_tool_call_id, decision, reason_codes
		FROM {db}.v_mcp_requests ORDER BY time_ms`), []string{
		"tc-p tools/call fetch '' allow ",
		"tc-s sampling/createMessage sampling/createMessage tc-p allow ",
		"tc-e elicitation/create elicitation/create tc-p deny KILL_SWITCH",
		"tc-g prompts/get greeting '' deny TOOL_UNCLASSIFIED_DENIED+UNKNOWN_TOOL",
		"tc-r resources/read readme '' allow ",
	})
	checkRows(t, "v_tool_calls", rows(`SELECT tool_call_id, mcp_method, parent_tool_call_id FROM {db}.v_tool_calls ORDER BY time_ms`), []string{
		"tc-s sampling/createMessage tc-p", "tc-e elicitation/create tc-p", "tc-o roots/list ''", "tc-q roots/list tc-gone",
	})
	checkRows(t, "v_server_requests", rows(`SELECT parent_tool_call_id, parent_method, parent_tool_name, tool_call_id, method, decision, ok, result_hash
		FROM {db}.v_server_requests ORDER BY time_ms`), []string{
		"tc-p tools/call fetch tc-s sampling/createMessage allow 1 result-tc-s",
		"tc-p tools/call fetch tc-e elicitation/create deny 0 ''",
		"'' '' '' tc-o roots/list allow 1 result-tc-o",
		"tc-gone '' '' tc-q roots/list allow 1 result-tc-q",
	})
	run := func(name string, p Params) []string { return runCanned(t, ctx, conn, db, name, p, 0) }
	checkRows(t, "mcp-requests", run("mcp-requests", Params{}), []string{
		"elicitation/create everything elicitation/create 1 1",
		"prompts/get everything greeting 1 1",
		"resources/read everything readme 1 0",
		"sampling/createMessage everything sampling/createMessage 1 0",
		"tools/call everything fetch 1 0",
	})
	checkRows(t, "mcp-requests tool greeting", run("mcp-requests", Params{Tool: "greeting"}), []string{"prompts/get everything greeting 1 1"})
	checkRows(t, "server-requests", runCanned(t, ctx, conn, db, "server-requests", Params{}, 8), []string{
		"10:00:05.000 tc-gone '' '' tc-q roots/list allow 1",
		"10:00:04.000 '' '' '' tc-o roots/list allow 1",
		"10:00:01.000 tc-p tools/call fetch tc-e elicitation/create deny 0",
		"10:00:01.000 tc-p tools/call fetch tc-s sampling/createMessage allow 1",
	})
	checkRows(t, "server-requests during fetch", runCanned(t, ctx, conn, db, "server-requests", Params{Tool: "fetch"}, 5),
		[]string{"10:00:01.000 tc-p tools/call fetch tc-e", "10:00:01.000 tc-p tools/call fetch tc-s"})
}
