package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/query"
	receiptverify "github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/testenv"
)

// `talosctl export` writes the signed records as stored: the JSON lines
// verify offline with only the public key (talosctl verify --file), and
// one edited line makes verify fail naming that receipt. CSV carries the
// same signed JSON in its last column.
func TestExportVerifiesOffline(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	ctx, conn, addr, db := cliDB(t)
	dir := t.TempDir()
	at := time.Date(2026, 6, 1, 12, 0, 0, 250e6, time.UTC)
	fx := plantAudit(t, ctx, conn, db, dir, at)
	// One ToolCallEvent, signed by the same key, for --kind all.
	rkey, kid, err := redact.LoadOrCreateKey(filepath.Join(dir, "redaction.key"), true)
	if err != nil {
		t.Fatal(err)
	}
	r, err := redact.New(redact.Config{Key: rkey, KeyID: kid})
	if err != nil {
		t.Fatal(err)
	}
	plantToolCall(t, ctx, query.NewSinkWriter(conn, db), r, fx.key, "0190f5b2-7c1e-7a3b-8d4e-0000000000a1", "agent-a",
		at.Add(10*time.Second), map[string]any{"title": "bug"})

	g := []string{"--clickhouse-addr", addr, "--clickhouse-database", db}
	export := func(args ...string) (stdout, stderr string) {
		t.Helper()
		stdout, stderr, code := runSplit(t, talosctl, append(append(append([]string{}, g...), "export"), args...)...)
		if code != 0 {
			t.Fatalf("export %v: exit %d\n%s%s", args, code, stdout, stderr)
		}
		return stdout, stderr
	}
	verify := func(file string, extra ...string) (string, int) {
		t.Helper()
		return run(t, talosctl, append([]string{"verify", "--trusted-keys", fx.keyDir, "--file", file}, extra...)...)
	}

	// Receipts (the default kind) as JSON lines, to a file, and the
	// checkpoint over them.
	file := filepath.Join(dir, "export.jsonl")
	stdout, stderr := export("--out", file)
	if stdout != "" || stderr != "exported 8 records (receipts) to "+file+" (jsonl)\n" {
		t.Fatalf("export --out: stdout %q, stderr %q", stdout, stderr)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 8 || !strings.Contains(lines[7], `"id":"`+fx.checkpoint+`"`) {
		t.Fatalf("%d lines, want 8 (one per receipt, the redelivered copies once, then the checkpoint %s)", len(lines), fx.checkpoint)
	}
	for i, line := range lines[:7] {
		var ev struct{ ID string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.ID != fx.ids[i] {
			t.Fatalf("line %d is receipt %q (%v), want %s in chain order", i+1, ev.ID, err, fx.ids[i])
		}
	}
	if !strings.Contains(lines[6], `"agent_id":"agent \"quoted\" \\ path"`) {
		t.Fatalf("the escaped agent id did not survive the export:\n%s", lines[6])
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".export.jsonl.partial-*")); len(matches) != 0 {
		t.Fatalf("temporary files left behind: %v", matches)
	}
	out, code := verify(file)
	if code != 0 || !strings.HasPrefix(out, "OK: 7 receipts in 1 chains, 1 checkpoints verified") {
		t.Fatalf("verify --file of the export: exit %d\n%s", code, out)
	}
	// The checkpoint anchors the chain's end: the last receipt taken out
	// of the file is caught.
	cut := filepath.Join(dir, "cut.jsonl")
	os.WriteFile(cut, []byte(strings.Join(append(lines[:6:6], lines[7]), "\n")+"\n"), 0o644)
	if out, code := verify(cut); code != 1 || !strings.Contains(out, receiptverify.ProblemChainGap) || !strings.Contains(out, "seq 7 missing") {
		t.Fatalf("verify --file of the export without its last receipt: exit %d, want 1 naming seq 7\n%s", code, out)
	}
	// Without the checkpoint nothing anchors the chain's end: the file
	// does not verify, whether or not its last receipt is there, and
	// verify says why, in one line, rather than OK.
	for _, n := range []int{7, 6} {
		bare := filepath.Join(dir, fmt.Sprintf("bare-%d.jsonl", n))
		os.WriteFile(bare, []byte(strings.Join(lines[:n], "\n")+"\n"), 0o644)
		out, code := verify(bare)
		if code != 1 || strings.Contains(out, "OK") || strings.Count(out, "\n") != 1 ||
			!strings.Contains(out, "FAILED: "+fmt.Sprint(n)+" receipts in 1 chains, 0 checkpoints from "+bare+": the file holds no checkpoint") ||
			!strings.Contains(out, "whole chains, cannot be detected") || !strings.Contains(out, "talosctl export") {
			t.Fatalf("verify --file of %d receipts without their checkpoint: exit %d, want 1 and one line saying why\n%s", n, code, out)
		}
		stdout, code := runStdout(t, talosctl, "--json", "verify", "--trusted-keys", fx.keyDir, "--file", bare)
		var rep map[string]any
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != 1 || rep["ok"] != false || rep["no_checkpoints"] == nil {
			t.Fatalf("verify --json --file of receipts without their checkpoint: exit %d, %v\n%s", code, err, stdout)
		}
	}
	// To standard output: the same bytes, and no progress or summary.
	stdout, stderr = export("--out", "-")
	if stdout != string(data) || stderr != "" {
		t.Fatalf("export --out -: %d bytes (file has %d), stderr %q", len(stdout), len(data), stderr)
	}

	// Edit one line (allow → deny in the first receipt): verify fails and
	// names it.
	edited := strings.Replace(lines[0], `"decision":"allow"`, `"decision":"deny"`, 1)
	if edited == lines[0] {
		t.Fatal("fixture: the first receipt has no allow to edit")
	}
	tampered := filepath.Join(dir, "tampered.jsonl")
	os.WriteFile(tampered, []byte(strings.Join(append([]string{edited}, lines[1:]...), "\n")+"\n"), 0o644)
	out, code = verify(tampered)
	t.Logf("talosctl verify --file on an edited export:\n%s", out)
	if code != 1 || !strings.Contains(out, fx.allowed) || !strings.Contains(out, receiptverify.ProblemBadSignature) || !strings.Contains(out, "FAILED") {
		t.Fatalf("verify of the edited export: exit %d, want 1 naming %s\n%s", code, fx.allowed, out)
	}

	// A time range is a partial chain: verify --partial accepts it.
	part := filepath.Join(dir, "part.jsonl")
	export("--from", at.Add(2*time.Second).Format(time.RFC3339Nano), "--out", part)
	pdata, _ := os.ReadFile(part)
	if n := strings.Count(string(pdata), "\n"); n != 5 {
		t.Fatalf("export --from +2s: %d records, want 5 (seq 4..7 and the checkpoint)", n)
	}
	if out, code := verify(part); code != 1 || !strings.Contains(out, receiptverify.ProblemChainGap) {
		t.Fatalf("verify of a partial export without --partial: exit %d\n%s", code, out)
	}
	if out, code := verify(part, "--partial"); code != 0 {
		t.Fatalf("verify --partial of a partial export: exit %d\n%s", code, out)
	}

	// Everything (receipts, the tool call event and the checkpoint)
	// verifies too; --json prints a summary.
	all := filepath.Join(dir, "all.jsonl")
	cpFile := filepath.Join(dir, "checkpoints.jsonl")
	if _, stderr := export("--kind", "checkpoints", "--out", cpFile); stderr != "exported 1 record (checkpoints) to "+cpFile+" (jsonl)\n" {
		t.Fatalf("export --kind checkpoints --out: stderr %q", stderr)
	}
	stdout, _ = runStdout(t, talosctl, append(append([]string{}, g...), "--json", "export", "--kind", "all", "--out", all)...)
	var sum map[string]any
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil || sum["records"] != float64(9) || sum["kind"] != "all" {
		t.Fatalf("export --json summary: %v (%v)", stdout, err)
	}
	if out, code := verify(all); code != 0 {
		t.Fatalf("verify --file of export --kind all: exit %d\n%s", code, out)
	}
	cps, _ := export("--kind", "checkpoints")
	if n := strings.Count(cps, "\n"); n != 1 || !strings.Contains(cps, fx.checkpoint) {
		t.Fatalf("export --kind checkpoints: %d lines, want the checkpoint %s\n%s", n, fx.checkpoint, cps)
	}
	ctl, _ := export("--kind", "control")
	if n := strings.Count(ctl, "\n"); n != 2 || !strings.Contains(ctl, `"verb":"killswitch.set"`) {
		t.Fatalf("export --kind control: %d lines\n%s", n, ctl)
	}

	// CSV: the useful columns, and the signed JSON exactly in the last one.
	csvOut, _ := export("--format", "csv")
	table, err := csv.NewReader(strings.NewReader(csvOut)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(table) != 9 || !slices.Equal(table[0], query.ExportColumns) || table[8][0] != "checkpoint" {
		t.Fatalf("CSV: %d rows, header %v", len(table), table[0])
	}
	for i, row := range table[1:8] {
		if row[len(row)-1] != lines[i] || row[1] != fx.ids[i] {
			t.Fatalf("CSV row %d does not carry receipt %s's signed JSON", i+1, fx.ids[i])
		}
	}
	if row := table[7]; row[0] != "decision" || row[7] != quotedAgent || row[9] != "list_prs" || row[11] != "allow" {
		t.Fatalf("CSV row 7: %v", row[:12])
	}
	if row := table[4]; row[12] != "KILL_SWITCH" || row[4] != "4" || row[3] != "cli-w1" {
		t.Fatalf("CSV row 4: %v", row[:13])
	}

	// verify reads JSON lines: a CSV export, or any other text, is
	// refused in one line saying so, not a line per row.
	csvFile := filepath.Join(dir, "audit.csv")
	os.WriteFile(csvFile, []byte(csvOut), 0o644)
	text := filepath.Join(dir, "notes.md")
	os.WriteFile(text, []byte(strings.Repeat("# Notes\nsome text, not JSON\n", 50)), 0o644)
	for file, want := range map[string]string{
		csvFile: ": not a JSON-lines (or JSON array) export of signed records: it is a CSV export (talosctl export --format csv); " +
			"verify reads the JSON lines of talosctl export --format jsonl (the default)\n",
		text: ": not a JSON-lines (or JSON array) export of signed records: none of its 100 lines is a JSON event; " +
			"talosctl export writes one (--format jsonl, the default)\n",
	} {
		if out, code := verify(file); code != 1 || out != "talosctl: "+file+want {
			t.Errorf("verify --file %s: exit %d, want 1 and the one line %q\n%s", filepath.Base(file), code, want, out)
		}
	}

	// A file that holds nothing is not verified as OK.
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, nil, 0o644)
	if out, code := verify(empty); code != 1 || strings.Contains(out, "OK") ||
		out != "talosctl: "+empty+": nothing to verify: the file holds no record\n" {
		t.Fatalf("verify --file of an empty file: exit %d, want 1 and one line saying it holds nothing\n%s", code, out)
	}

	// Usage errors exit 2; a database that cannot be reached exits 1.
	for _, args := range [][]string{{"--format", "xml"}, {"--kind", "secrets"}, {"--from", "soon"}} {
		if out, code := run(t, talosctl, append([]string{"--clickhouse-addr", "127.0.0.1:1", "export"}, args...)...); code != 2 {
			t.Errorf("export %v: exit %d, want 2\n%s", args, code, out)
		}
	}
	if out, code := run(t, talosctl, "--clickhouse-addr", "127.0.0.1:1", "export", "--out", filepath.Join(dir, "never.jsonl")); code != 1 {
		t.Errorf("export without ClickHouse: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "never.jsonl")); !os.IsNotExist(err) {
		t.Errorf("a failed export left its file: %v", err)
	}
	// A directory that does not exist: the error names the path given.
	missing := filepath.Join(dir, "nonexistent", "x.jsonl")
	if out, code := run(t, talosctl, append(append([]string{}, g...), "export", "--out", missing)...); code != 1 ||
		out != "talosctl: export: open "+missing+": no such file or directory\n" {
		t.Errorf("export --out into a missing directory: exit %d, want 1 naming %s\n%s", code, missing, out)
	}
}
