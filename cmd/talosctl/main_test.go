package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }

// run runs the talosctl binary and returns its output and exit code.
func run(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	return runWithStdin(t, "", bin, args...)
}

// genKeys runs talosctl keys gen for each name: dir/NAME.key and
// dir/NAME.pub.
func genKeys(t *testing.T, talosctl, dir string, names ...string) {
	t.Helper()
	for _, k := range names {
		if out, code := run(t, talosctl, "keys", "gen", "--out", filepath.Join(dir, k)); code != 0 {
			t.Fatalf("keys gen %s: exit %d\n%s", k, code, out)
		}
	}
}

// startTalosd runs the talosd binary with args, its log in dir/talosd.log,
// until the test ends.
func startTalosd(t *testing.T, bin, dir string, args ...string) {
	t.Helper()
	// Keys talosd creates (the redaction key) go under the test's dir.
	d := testenv.Command(bin, append([]string{"--data-dir", filepath.Join(dir, "talos-data")}, args...)...)
	logf, err := os.Create(filepath.Join(dir, "talosd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait(); logf.Close() })
}

// TestCLIAgainstRunningStack uses the real binaries the way the README
// does: talosctl keys gen, talosd with that key, talosctl call (allow,
// deny, malformed), talosctl verify on ClickHouse and on a file, then a
// tampered row makes verify exit 1 naming it, and bench reports figures.
func TestCLIAgainstRunningStack(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	g := []string{"--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db}

	out, code := run(t, talosctl, "keys", "gen", "--out", filepath.Join(dir, "worker"))
	if code != 0 || !strings.Contains(out, "kid ") {
		t.Fatalf("keys gen: exit %d\n%s", code, out)
	}
	if st, err := os.Stat(filepath.Join(dir, "worker.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode: %v %v", st, err)
	}
	if _, code := run(t, talosctl, "keys", "gen", "--out", filepath.Join(dir, "worker")); code != 1 {
		t.Fatalf("keys gen over an existing key: exit %d, want 1", code)
	}
	// docker-compose's keygen job: idempotent, several keys at once.
	before, _ := os.ReadFile(filepath.Join(dir, "worker.key"))
	prov := []string{"keys", "gen", "--if-missing", "--out", filepath.Join(dir, "worker"), "--out", filepath.Join(dir, "second")}
	if out, code := run(t, talosctl, prov...); code != 0 {
		t.Fatalf("keys gen --if-missing: exit %d\n%s", code, out)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "worker.key"))
	if string(before) != string(after) {
		t.Fatal("--if-missing replaced an existing key")
	}
	if _, err := os.Stat(filepath.Join(dir, "second.pub")); err != nil {
		t.Fatalf("--if-missing did not create the missing key: %v", err)
	}

	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "../talosd/demo/registry", "--signing-key", filepath.Join(dir, "worker.key"), "--http-addr", "", "--chains", "1",
		"--capabilities", "optional", "--checkpoint-interval", "1s")

	// allow; an agent id with a quote and a backslash puts JSON escapes in
	// the signed receipt, which the export below must carry unaltered
	out, code = run(t, talosctl, append(g, "--json", "call", "--server", "files", "--tool", "list_directory", "--args", `{"path":"."}`,
		"--agent", `agent "quoted" \ path`)...)
	if code != 0 {
		lb, _ := os.ReadFile(filepath.Join(dir, "talosd.log"))
		t.Fatalf("call: exit %d\n%s\ntalosd log:\n%s", code, out, lb)
	}
	var dec schemas.Decision
	if err := json.Unmarshal([]byte(out), &dec); err != nil || dec.Decision != "allow" {
		t.Fatalf("call allow: %v\n%s", err, out)
	}
	// deny is not a failure
	out, code = run(t, talosctl, append(g, "call", "--server", "files", "--tool", "write_file", "--args", `{"path":"a","content":"b"}`)...)
	if code != 0 || !strings.Contains(out, "DENY") || !strings.Contains(out, "IDEMPOTENCY_KEY_REQUIRED") {
		t.Fatalf("call deny: exit %d\n%s", code, out)
	}
	// allow + post with a result
	out, code = run(t, talosctl, append(g, "call", "--server", "files", "--tool", "read_file", "--args", `{"path":"a"}`,
		"--result", `{"content":[{"type":"text","text":"hello"}]}`)...)
	if code != 0 || !strings.Contains(out, "phase post") {
		t.Fatalf("call with result: exit %d\n%s", code, out)
	}
	// a malformed envelope from a file
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"schema_version":"talos.tool_call.v1","phase":"pre","tool_call_id":"01900000-0000-7000-8000-000000000001","ep_id":"talosctl","server_id":"files","server_id":"github"}`), 0o644)
	out, code = run(t, talosctl, append(g, "call", "--file", bad)...)
	if code != 0 || !strings.Contains(out, "VAL-HTC-001") {
		t.Fatalf("call --file malformed: exit %d\n%s", code, out)
	}
	// bad arguments are usage errors
	if out, code := run(t, talosctl, append(g, "call", "--server", "files", "--tool", "x", "--args", "{nope")...); code != 2 {
		t.Fatalf("call with bad --args: exit %d, want 2\n%s", code, out)
	}
	// no decision in time: fail closed, exit 1
	if out, code := run(t, talosctl, "--nats-url", "nats://127.0.0.1:1", "call", "--server", "files", "--tool", "x", "--timeout", "1s"); code != 1 {
		t.Fatalf("call without NATS: exit %d, want 1\n%s", code, out)
	}

	ctx := context.Background()
	conn := openClickHouse(t, ctx, addr, db)
	waitCount(t, conn, db, 5)

	out, code = run(t, talosctl, append(g, "verify", "--trusted-keys", dir)...)
	if code != 0 || !strings.Contains(out, "OK: 5 receipts") {
		t.Fatalf("verify untouched: exit %d\n%s", code, out)
	}
	// The same receipts as a file verify offline, exported with the
	// README's clickhouse-client commands: the receipts, then the
	// checkpoints over them. Without the checkpoints nothing anchors the
	// chain's end, and verify says so instead of OK.
	host, port, _ := net.SplitHostPort(addr)
	clickhouseClient := func(query string) []byte {
		t.Helper()
		b, err := testenv.Command("clickhouse-client", "--host", host, "--port", port, "--query", query).Output()
		if err != nil {
			t.Fatalf("clickhouse-client %q: %v", query, err)
		}
		return b
	}
	exported := clickhouseClient(fmt.Sprintf("SELECT cloudevent FROM %s.v_receipts ORDER BY chain_id, chain_seq, receipt_id FORMAT TSVRaw", db))
	if !strings.Contains(string(exported), `"agent_id":"agent \"quoted\" \\ path"`) {
		t.Fatalf("export lacks the escaped agent id:\n%s", exported)
	}
	file := filepath.Join(dir, "receipts.jsonl")
	os.WriteFile(file, exported, 0o644)
	if out, code := run(t, talosctl, "verify", "--trusted-keys", dir, "--file", file); code != 1 || !strings.Contains(out, "holds no checkpoint") || strings.Contains(out, "OK") {
		t.Fatalf("verify --file of receipts without checkpoints: exit %d, want 1 saying it holds none\n%s", code, out)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM `"+db+"`.checkpoints").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("talosd cut no checkpoint in 30 s")
		}
	}
	exported = append(exported, clickhouseClient(fmt.Sprintf("SELECT cloudevent FROM %s.checkpoints ORDER BY chain_id, checkpoint_seq FORMAT TSVRaw", db))...)
	os.WriteFile(file, exported, 0o644)
	if out, code := run(t, talosctl, "verify", "--trusted-keys", dir, "--file", file); code != 0 {
		t.Fatalf("verify --file: exit %d\n%s", code, out)
	}
	// A key nobody trusts: every receipt is foreign.
	other := filepath.Join(dir, "other")
	os.Mkdir(other, 0o755)
	run(t, talosctl, "keys", "gen", "--out", filepath.Join(other, "stranger"))
	if out, code := run(t, talosctl, "verify", "--trusted-keys", other, "--file", file); code != 1 || !strings.Contains(out, "unknown_key") {
		t.Fatalf("verify with the wrong key: exit %d\n%s", code, out)
	}

	// Tamper with one stored column: verify exits 1 and names the receipt.
	if err := query.MutateAndWait(ctx, conn, db, query.TableReceipts,
		fmt.Sprintf("UPDATE decision = 'allow' WHERE receipt_id = '%s'", receiptOf(t, conn, db, "write_file"))); err != nil {
		t.Fatal(err)
	}
	victim := receiptOf(t, conn, db, "write_file")
	out, code = run(t, talosctl, append(g, "verify", "--trusted-keys", dir)...)
	if code != 1 || !strings.Contains(out, victim) || !strings.Contains(out, "altered_column") || !strings.Contains(out, "FAILED") {
		t.Fatalf("verify tampered: exit %d, want 1 naming %s\n%s", code, victim, out)
	}

	// Edit one signed JSON, and delete a row in the middle of its chain:
	// verify names both.
	edited := receiptOf(t, conn, db, "list_directory")
	if err := query.MutateAndWait(ctx, conn, db, query.TableReceipts,
		fmt.Sprintf(`UPDATE cloudevent = replaceOne(cloudevent, '"decision":"allow"', '"decision":"deny"') WHERE receipt_id = '%s'`, edited)); err != nil {
		t.Fatal(err)
	}
	var gone, chain string
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT receipt_id, chain_id FROM %s.receipts WHERE chain_seq BETWEEN 2 AND 4 AND receipt_id NOT IN ('%s', '%s') LIMIT 1", db, edited, victim)).Scan(&gone, &chain); err != nil {
		t.Fatalf("no second link to delete: %v", err)
	}
	if err := query.MutateAndWait(ctx, conn, db, query.TableReceipts, fmt.Sprintf("DELETE WHERE receipt_id = '%s'", gone)); err != nil {
		t.Fatal(err)
	}
	out, code = run(t, talosctl, append(g, "verify", "--trusted-keys", dir)...)
	t.Logf("talosctl verify on a tampered database:\n%s", out)
	if code != 1 || !strings.Contains(out, edited) || !strings.Contains(out, "bad_signature") || !strings.Contains(out, "chain_gap") || !strings.Contains(out, chain) {
		t.Fatalf("verify after edit (%s) and delete (%s in %s): exit %d\n%s", edited, gone, chain, code, out)
	}

	// bench: a short run reports latency percentiles and end-to-end rate.
	out, code = run(t, talosctl, append(g, "--json", "bench", "--calls", "300", "--concurrency", "10", "--rate", "0")...)
	if code != 0 {
		t.Fatalf("bench: exit %d\n%s", code, out)
	}
	var br loadgen.Result
	if err := json.Unmarshal([]byte(out), &br); err != nil {
		t.Fatalf("bench output: %v\n%s", err, out)
	}
	if br.Calls != 300 || br.Allowed != 300 || br.P99ms <= 0 || br.EventsPerSec <= 0 {
		t.Fatalf("bench result: %+v", br)
	}
}

// openClickHouse connects to db at addr until the test ends.
func openClickHouse(t *testing.T, ctx context.Context, addr, db string) driver.Conn {
	t.Helper()
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func waitCount(t *testing.T, conn driver.Conn, db string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got uint64
	for time.Now().Before(deadline) {
		if err := conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count() FROM %s.v_receipts", db)).Scan(&got); err == nil && got >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%d receipts in ClickHouse, want %d", got, n)
}

func receiptOf(t *testing.T, conn driver.Conn, db, tool string) string {
	t.Helper()
	var id string
	if err := conn.QueryRow(context.Background(), fmt.Sprintf("SELECT receipt_id FROM %s.v_receipts WHERE tool_name = ? LIMIT 1", db), tool).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
