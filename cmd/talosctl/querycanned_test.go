package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// auditFixture is what plantAudit stored.
type auditFixture struct {
	at      time.Time // the first receipt's time; every record is within 6 s of it
	keyDir  string    // holds worker.pub (and worker.key)
	key     *receipts.PrivateKey
	ids     []string // receipt ids in chain order
	quoted  string   // the receipt whose agent id carries JSON escapes
	allowed string   // a receipt of an allowed call (d1)
	// checkpoint is the id of the chain's signed checkpoint over seq 1..7.
	checkpoint string
}

// quotedAgent is an agent id whose JSON form has escapes an export must
// carry unaltered.
const quotedAgent = `agent "quoted" \ path`

// plantAudit signs, into one chain and with a key written to dir, five
// decision receipts and a kill switch set and cleared around one of them
// (d3, denied KILL_SWITCH), and stores them through the sink twice (a
// redelivery):
//
//	seq 1 d1 alice files/read_file      allow
//	seq 2 d2 alice files/write_file     deny IDEMPOTENCY_KEY_REQUIRED
//	seq 3    killswitch.set server:files
//	seq 4 d3 bob   files/read_file      deny KILL_SWITCH
//	seq 5    killswitch.clear server:files
//	seq 6 d4 bob   github/create_issue  deny NO_CAPABILITY, SCOPE_MISMATCH
//	seq 7 d5 <quotedAgent> github/list_prs allow
//
// and the chain's final checkpoint over them.
func plantAudit(t *testing.T, ctx context.Context, conn driver.Conn, db, dir string, at time.Time) auditFixture {
	t.Helper()
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := receipts.WriteKeyPair(key, filepath.Join(dir, "worker")); err != nil {
		t.Fatal(err)
	}
	fx := auditFixture{at: at, keyDir: dir, key: key}
	ch := receipts.NewChain("cli-w1", key)
	var recs []schemas.AuditRecord
	seal := func(meta receipts.Meta, data *schemas.Receipt, subject string) {
		s, err := ch.Seal(meta, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		fx.ids = append(fx.ids, s.ID)
		recs = append(recs, schemas.AuditRecord{Subject: subject, Data: s.JSON, StreamSeq: uint64(len(recs) + 1)})
	}
	decide := func(n int, agent, server, tool, class, decision string, codes ...string) {
		when := at.Add(time.Duration(n-1) * time.Second)
		data := schemas.Receipt{EventType: schemas.KindDecision, Tool: tool, AgentID: agent, ToolID: server + "/" + tool,
			Timestamp: when.Format(schemas.TimeFormat), ResultCode: decision, ToolCallID: fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012d", n),
			TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", SessionID: "sess-1", ServerID: server, ToolName: tool, Phase: "pre",
			Mode: "prod", Decision: decision, ReasonCodes: append([]string{}, codes...), ToolClass: class,
			RegistryDigest: "sha256:" + strings.Repeat("d", 64), DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
		seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: data.ToolCallID, Time: when},
			&data, "talos.audit.receipt.decision."+server)
	}
	control := func(verb string, seq uint64, when time.Time) {
		rec := schemas.ControlRecord{CommandID: fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d7%d", seq), Verb: verb, Actor: "oncall",
			Reason: "drill", Target: "server:files", Accepted: true, Seq: seq, CommandHash: strings.Repeat("a", 64), ResponderKID: "r1"}
		data := schemas.Receipt{EventType: schemas.KindControl, Tool: verb, ToolID: "control/" + verb, AgentID: rec.Actor,
			Timestamp: when.Format(schemas.TimeFormat), ResultCode: "accepted", Decision: schemas.DecisionAllow, ReasonCodes: []string{},
			DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg, Control: &rec}
		seal(receipts.Meta{Type: schemas.ReceiptType(schemas.KindControl), Source: "talos://control/w1", Subject: verb, Time: when},
			&data, schemas.ReceiptSubject(schemas.KindControl, verb))
	}
	decide(1, "alice", "files", "read_file", "read", "allow")
	decide(2, "alice", "files", "write_file", "write", "deny", "IDEMPOTENCY_KEY_REQUIRED")
	control(schemas.VerbKillSwitchSet, 1, at.Add(1500*time.Millisecond))
	decide(3, "bob", "files", "read_file", "read", "deny", "KILL_SWITCH")
	control(schemas.VerbKillSwitchClear, 2, at.Add(2500*time.Millisecond))
	decide(4, "bob", "github", "create_issue", "write", "deny", "NO_CAPABILITY", "SCOPE_MISMATCH")
	decide(5, quotedAgent, "github", "list_prs", "read", "allow")
	fx.allowed, fx.quoted = fx.ids[0], fx.ids[6]
	// The chain's final checkpoint over seq 1..7.
	cp, err := ch.Checkpoint(receipts.Meta{Source: "talos://enforce/w1", Time: at.Add(6 * time.Second)}, true)
	if err != nil || cp == nil {
		t.Fatalf("checkpoint: %v", err)
	}
	fx.checkpoint = cp.ID
	recs = append(recs, schemas.AuditRecord{Subject: schemas.CheckpointSubject(ch.ID()), Data: cp.JSON, StreamSeq: uint64(len(recs) + 1)})

	w := query.NewSinkWriter(conn, db)
	for i := 0; i < 2; i++ {
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM `"+db+"`.v_receipts").Scan(&n); err != nil || n != 7 {
		t.Fatalf("v_receipts holds %d receipts (%v), want 7", n, err)
	}
	return fx
}

// cliDB is a migrated database and a connection to it.
func cliDB(t *testing.T) (context.Context, driver.Conn, string, string) {
	t.Helper()
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn := openClickHouse(t, ctx, addr, db)
	if err := query.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	return ctx, conn, addr, db
}

// `talosctl query <name>` prints a canned query as a table, CSV or JSON,
// with the time range, agent, server and tool filters; usage errors exit 2.
func TestQueryCanned(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	ctx, conn, addr, db := cliDB(t)
	// Two hours ago, ten minutes into that hour: the whole fixture is in
	// one hour, within --since 3h and outside --since 1h.
	at := time.Now().UTC().Truncate(time.Hour).Add(-2*time.Hour + 10*time.Minute)
	plantAudit(t, ctx, conn, db, t.TempDir(), at)
	g := []string{"--clickhouse-addr", addr, "--clickhouse-database", db}
	q := func(args ...string) (string, int) {
		return runStdout(t, talosctl, append(append(append([]string{}, g...), "query"), args...)...)
	}

	// Table (the default).
	out, code := q("denial-reasons")
	if code != 0 {
		t.Fatalf("denial-reasons: exit %d\n%s", code, out)
	}
	t.Logf("talosctl query denial-reasons:\n%s", out)
	checkLines(t, "denial-reasons table", out, []string{
		"REASON_CODE               DENIALS",
		"IDEMPOTENCY_KEY_REQUIRED  1",
		"KILL_SWITCH               1",
		"NO_CAPABILITY             1",
		"SCOPE_MISMATCH            1",
		"4 row(s)",
	})
	out, code = q("top-denied-agents", "--limit", "1")
	checkLines(t, "top-denied-agents --limit 1", out, []string{"AGENT_ID  DENIALS", "bob       2", "1 row(s) (the --limit of 1: there may be more)"})
	if code != 0 {
		t.Fatalf("exit %d", code)
	}

	// CSV: a header, then exact values.
	out, code = q("write-calls-per-agent", "--format", "csv")
	if code != 0 {
		t.Fatalf("write-calls-per-agent csv: exit %d\n%s", code, out)
	}
	table, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(table); got != "[[agent_id allowed denied approvals calls] [alice 0 1 0 1] [bob 0 1 0 1]]" {
		t.Fatalf("write-calls-per-agent csv = %s", got)
	}

	// JSON (--format json or --json): an array of objects, keys in column
	// order, times in RFC 3339.
	for _, args := range [][]string{
		append(append([]string{}, g...), "query", "calls-over-time", "--format", "json"),
		append(append([]string{}, g...), "--json", "query", "run", "calls-over-time", "--since", "3h"),
	} {
		out, code := runStdout(t, talosctl, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, out)
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		hour := at.Truncate(time.Hour).Format(schemas.TimeFormat)
		if len(rows) != 1 || rows[0]["hour"] != hour || rows[0]["calls"] != float64(5) || rows[0]["denials"] != float64(3) {
			t.Fatalf("%v = %v, want one hour %s with 5 calls, 3 denials", args, rows, hour)
		}
		if strings.Index(out, `"hour"`) > strings.Index(out, `"calls"`) || strings.Index(out, `"calls"`) > strings.Index(out, `"denials"`) {
			t.Errorf("JSON keys are not in column order: %s", out)
		}
	}
	out, _ = q("calls-during-killswitch", "--format", "json")
	var during []map[string]any
	if err := json.Unmarshal([]byte(out), &during); err != nil || len(during) != 1 || during[0]["agent_id"] != "bob" ||
		during[0]["decision"] != "deny" || during[0]["killswitch_target"] != "server:files" ||
		fmt.Sprint(during[0]["reason_codes"]) != "[KILL_SWITCH]" {
		t.Fatalf("calls-during-killswitch = %v (%v)\n%s", during, err, out)
	}
	out, _ = q("incident-timeline", "--format", "csv")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[1], at.Add(2*time.Second).Format("2006-01-02T15:04:05")+".000Z,killswitch.clear,server,server:files,oncall,drill,1,,") {
		t.Fatalf("incident-timeline csv:\n%s", out)
	}

	// Filters: agent, server, tool, and the time range.
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"top-denied-tools", "--agent", "bob"}, []string{"SERVER_ID  TOOL_NAME     DENIALS", "files      read_file     1", "github     create_issue  1", "2 row(s)"}},
		{[]string{"top-denied-tools", "--server", "github", "--tool", "create_issue"}, []string{"SERVER_ID  TOOL_NAME     DENIALS", "github     create_issue  1", "1 row(s)"}},
		{[]string{"top-denied-agents", "--since", "1h"}, []string{"AGENT_ID  DENIALS", "0 row(s)"}},
		{[]string{"top-denied-agents", "--since", "3h", "--to", at.Add(2 * time.Second).Format(time.RFC3339)}, []string{"AGENT_ID  DENIALS", "alice     1", "1 row(s)"}},
		{[]string{"top-denied-agents", "--from", at.Format(time.DateOnly)}, []string{"AGENT_ID  DENIALS", "bob       2", "alice     1", "2 row(s)"}},
		{[]string{"top-denied-agents", "--to", at.Format(time.DateOnly)}, []string{"AGENT_ID  DENIALS", "0 row(s)"}},
	} {
		out, code := q(c.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", c.args, code, out)
		}
		checkLines(t, fmt.Sprint(c.args), out, c.want)
	}

	// query list names every canned query.
	out, code = runStdout(t, talosctl, "--json", "query", "list")
	var list []query.Canned
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 {
		t.Fatalf("query list --json: exit %d, %v\n%s", code, err, out)
	}
	var names, want []string
	for _, c := range list {
		names = append(names, c.Name)
	}
	for _, c := range query.CannedQueries() {
		want = append(want, c.Name)
	}
	if !slices.Equal(names, want) {
		t.Errorf("query list = %v, want %v", names, want)
	}
	out, _ = runStdout(t, talosctl, "query", "list")
	help, _ := runStdout(t, talosctl, "query", "--help")
	for _, name := range want {
		if !strings.Contains(out, name) || !strings.Contains(help, name) {
			t.Errorf("query list or query --help lacks %s", name)
		}
	}
	if !strings.Contains(help, "secret-uses") {
		t.Errorf("query --help lacks secret-uses:\n%s", help)
	}

	// Usage errors exit 2 (before any connection).
	for _, args := range [][]string{
		{"no-such-query"},
		{},
		{"incident-timeline", "--agent", "bob"},
		{"denial-reasons", "--limit", "0"},
		{"denial-reasons", "--limit", "10001"},
		{"denial-reasons", "--from", "yesterday"},
		{"denial-reasons", "--from", "2026-01-02", "--since", "1h"},
		{"denial-reasons", "--from", "2026-01-02", "--to", "2026-01-01"},
		{"denial-reasons", "--format", "xml"},
	} {
		out, code := runWithStdin(t, "", talosctl, append(append([]string{"--clickhouse-addr", "127.0.0.1:1"}, "query"), args...)...)
		if code != 2 {
			t.Errorf("query %v: exit %d, want 2\n%s", args, code, out)
		}
		if len(args) <= 1 && !strings.Contains(out, "talosctl query list") {
			t.Errorf("query %v: the error does not point to 'talosctl query list':\n%s", args, out)
		}
	}
	if out, code := runWithStdin(t, "", talosctl, append(append([]string{}, g...), "--json", "query", "denial-reasons", "--format", "csv")...); code != 2 {
		t.Errorf("--json with --format csv: exit %d\n%s", code, out)
	}
	// ClickHouse unreachable: the command failed, exit 1.
	if out, code := runWithStdin(t, "", talosctl, "--clickhouse-addr", "127.0.0.1:1", "query", "denial-reasons"); code != 1 {
		t.Errorf("unreachable ClickHouse: exit %d\n%s", code, out)
	}
}

// runStdout runs bin and returns its standard output (standard error is
// logged) and exit code.
func runStdout(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	stdout, stderr, code := runSplit(t, bin, args...)
	if stderr != "" {
		t.Logf("talosctl %s: stderr: %s", strings.Join(args, " "), stderr)
	}
	return stdout, code
}

// runSplit runs bin and returns its standard output, standard error and
// exit code.
func runSplit(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := testenv.Command(bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return o.String(), e.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("talosctl %v: %v", args, err)
	}
	return o.String(), e.String(), 0
}

// checkLines compares out, line by line with trailing spaces trimmed.
func checkLines(t *testing.T, what, out string, want []string) {
	t.Helper()
	var got []string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		got = append(got, strings.TrimRight(l, " "))
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
