package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/transparency-dev/tessera/client"
	modtlog "golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/ingest/tlog"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/logproof"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
	"github.com/talos-audit/talos/testenv"
)

const logOrigin = "audit.example.com/talos"

// TestVerifyHeldToWitnessedLog is issue 22's talosctl verify against the
// transparency log: the pipeline (talosd as a process, real NATS and
// ClickHouse) with the log role and two real litewitness processes whose
// quorum must cosign. verify passes holding ClickHouse to the log with 2
// of 2 witnesses, and with consistency from the checkpoint it kept, two
// ToolCallEvents the flight recorder refused among the records (one
// stored without its payloads); so does a full export of it; it
// fails naming the quorum with a policy of two witnesses that never
// cosigned (0 of 2). A receipt's proof bundle verifies offline with public
// keys only, and an altered one does not. Then the tampers: a receipt row
// deleted from ClickHouse, a receipt inserted that the log lacks, one
// inserted with a forged log index, and a log rewritten with another
// history of the same size under the same key — each named by verify.
func TestVerifyHeldToWitnessedLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts talosd, ClickHouse and four witnesses")
	}
	s := startLogStack(t)
	base := append(s.g, "verify", "--trusted-keys", s.pub, "--log-url", s.url, "--log-key", s.vkey)

	if err := loadgen.SendUnsigned(s.natsURL, "tlogv-1", 12); err != nil {
		t.Fatal(err)
	}
	size1 := s.settle(t)
	seen := filepath.Join(s.dir, "seen.checkpoint")
	out, code := run(t, s.talosctl, append(base, "--witness-policy", s.policy, "--save-checkpoint", seen)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("log %s at size %d cosigned by 2 of 2 witnesses (quorum both): %d entries match its root, %d stored records found in it", logOrigin, size1, size1, size1)) {
		t.Fatalf("verify against the log: exit %d\n%s", code, out)
	}
	// The log's checkpoints replace the chains' (--no-chain-checkpoints):
	// none was cut, though --checkpoint-interval would have cut several.
	var checkpoints uint64
	if err := s.conn.QueryRow(context.Background(), "SELECT count() FROM `"+s.db+"`.checkpoints").Scan(&checkpoints); err != nil || checkpoints != 0 {
		t.Fatalf("chain checkpoints stored with --no-chain-checkpoints: %d (%v)", checkpoints, err)
	}
	rejected := s.publishRejected(t)
	if err := loadgen.SendUnsigned(s.natsURL, "tlogv-2", 12); err != nil {
		t.Fatal(err)
	}
	size2 := s.settle(t)
	current := filepath.Join(s.dir, "current.checkpoint")
	out, code = run(t, s.talosctl, append(append([]string{"--json"}, base...), "--witness-policy", s.policy, "--since-checkpoint", seen, "--save-checkpoint", current)...)
	var rep struct {
		OK  bool            `json:"ok"`
		Log query.LogReport `json:"log"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.OK || rep.Log.SinceSize != size1 || rep.Log.Size != size2 ||
		rep.Log.Logged != size2 || rep.Log.Withheld != 1 || len(rep.Log.Cosigned) != 2 {
		t.Fatalf("verify --since-checkpoint: exit %d, %v\n%s", code, err, out)
	}
	s.checkConsistency(t, seen, current, size1, size2)
	s.checkExport(t, size2, rejected)
	out, code = run(t, s.talosctl, append(base, "--witness-policy", s.never)...)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("UNWITNESSED witness_quorum: log checkpoint %s at size %d: 0 of 2 witnesses of quorum both cosigned it (missing w3, w4)", logOrigin, size2)) ||
		!strings.Contains(out, "FAILED: 1 problems (1 unwitnessed)") {
		t.Fatalf("verify with witnesses that never cosigned: exit %d\n%s", code, out)
	}

	s.checkBundle(t)
	s.tamperRows(t, size2)
	s.rewrittenLog(t, size2, current)
}

// logStack is the pipeline of TestVerifyHeldToWitnessedLog.
type logStack struct {
	talosctl, dir, data, url, vkey, pub, signer string
	policy, never                               string // witness policies: w1 and w2, who cosign; w3 and w4, who never saw the log
	g                                           []string
	natsURL, db                                 string
	conn                                        driver.Conn
	js                                          jetstream.JetStream
}

func startLogStack(t *testing.T) *logStack {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	s := &logStack{talosctl: testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl"), dir: t.TempDir()}
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	s.natsURL, s.db, s.data = ns.URL(), db, filepath.Join(s.dir, "talos-data")
	s.g = []string{"--clickhouse-addr", addr, "--clickhouse-database", db}
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s.signer = filepath.Join(s.dir, "signer")
	if err := receipts.WriteKeyPair(key, s.signer); err != nil {
		t.Fatal(err)
	}
	s.pub = s.signer + ".pub"
	out, err := testenv.Command(talosd, "log-key", "--data-dir", s.data, "--log-origin", logOrigin).Output()
	if err != nil {
		t.Fatalf("talosd log-key: %v", err)
	}
	s.vkey = strings.TrimSpace(string(out))
	w := []*testenv.Witness{testenv.StartWitness(t, "witness.test/w1"), testenv.StartWitness(t, "witness.test/w2"),
		testenv.StartWitness(t, "witness.test/w3"), testenv.StartWitness(t, "witness.test/w4")}
	w[0].AddLog(t, logOrigin, s.vkey)
	w[1].AddLog(t, logOrigin, s.vkey)
	s.policy = writePolicy(t, s.dir, "witnesses.policy", "w1", w[0], "w2", w[1])
	s.never = writePolicy(t, s.dir, "never.policy", "w3", w[2], "w4", w[3])
	httpAddr := testenv.FreeAddr(t)
	s.url = "http://" + httpAddr
	startTalosd(t, talosd, s.dir, "--capabilities", "optional", "--nats-url", s.natsURL, "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "../talosd/demo/registry", "--signing-key", s.signer+".key", "--roles", "enforce,sink,control,log",
		"--http-addr", httpAddr, "--instance", "tlogv", "--batch-age", "200ms", "--log-origin", logOrigin,
		"--log-witness-policy", s.policy, "--log-checkpoint-interval", "200ms", "--log-heartbeat", "2s",
		"--no-chain-checkpoints", "--checkpoint-interval", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	s.conn = openClickHouse(t, ctx, addr, db)
	_, s.js = testenv.ConnectJS(t, s.natsURL)
	return s
}

func writePolicy(t *testing.T, dir, name, n1 string, w1 *testenv.Witness, n2 string, w2 *testenv.Witness) string {
	t.Helper()
	p := filepath.Join(dir, name)
	body := fmt.Sprintf("witness %s %s %s\nwitness %s %s %s\ngroup both all %s %s\nquorum both\n", n1, w1.VKey, w1.URL, n2, w2.VKey, w2.URL, n1, n2)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// settle waits until ClickHouse holds every receipt and ToolCallEvent of
// TALOS_AUDIT, each with its log index, and the served checkpoint covers
// them all; it returns that size.
func (s *logStack) settle(t *testing.T) int64 {
	t.Helper()
	var n uint64
	testenv.WaitFor(t, 2*time.Minute, func() bool {
		inStream := uint64(0)
		for _, m := range testenv.StreamMsgs(t, s.js, schemas.StreamAudit) {
			if strings.HasPrefix(m.Subject, schemas.SubjectReceipt) || strings.HasPrefix(m.Subject, schemas.SubjectToolCall) {
				inStream++
			}
		}
		var rows, indexed uint64
		q := "SELECT (SELECT uniqExact(receipt_id) FROM `" + s.db + "`.receipts) + (SELECT uniqExact(event_id) FROM `" + s.db + "`.tool_calls) + " +
			"(SELECT uniqExact(event_id) FROM `" + s.db + "`.tool_call_rejections), " +
			"(SELECT uniqExact(event_id) FROM `" + s.db + "`.v_log_entries)"
		if err := s.conn.QueryRow(context.Background(), q).Scan(&rows, &indexed); err != nil {
			return false
		}
		n = inStream
		return inStream > 0 && rows == inStream && indexed == inStream
	})
	key, err := logproof.LogKey(s.vkey)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() bool {
		cp, err := logproof.OpenCheckpoint(s.get(t, "/checkpoint"), key)
		return err == nil && cp.Size == int64(n)
	})
	return int64(n)
}

func (s *logStack) get(t *testing.T, path string) []byte {
	t.Helper()
	resp, err := http.Get(s.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// someRecord is a decision receipt as ClickHouse stores it, with its log
// index.
func (s *logStack) someRecord(t *testing.T, offset int) (id string, index uint64) {
	t.Helper()
	err := s.conn.QueryRow(context.Background(), "SELECT r.receipt_id, e.log_index FROM `"+s.db+"`.v_receipts AS r "+
		"ALL INNER JOIN `"+s.db+"`.v_log_entries AS e ON r.receipt_id = e.event_id WHERE r.kind = 'decision' ORDER BY e.log_index LIMIT 1 OFFSET "+
		fmt.Sprint(offset)).Scan(&id, &index)
	if err != nil {
		t.Fatal(err)
	}
	return id, index
}

// checkBundle writes one receipt's proof bundle from the live stack and
// checks it offline, from a directory holding only the bundle and the
// public keys: it verifies with the witnesses that cosigned, not with a
// policy whose witnesses never did, and not once altered.
func (s *logStack) checkBundle(t *testing.T) {
	t.Helper()
	id, index := s.someRecord(t, 3)
	offline := filepath.Join(s.dir, "offline")
	if err := os.MkdirAll(offline, 0o755); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(offline, "bundle.json")
	out, code := run(t, s.talosctl, append(s.g, "log-proof", "--receipt", id, "--log-url", s.url, "--log-key", s.vkey,
		"--witness-policy", s.policy, "--trusted-keys", s.pub, "--out", bundle)...)
	if code != 0 || !strings.Contains(out, "proof verified") {
		t.Fatalf("log-proof: exit %d\n%s", code, out)
	}
	keys := map[string]string{"talosd.pub": s.pub, "witnesses.policy": s.policy, "never.policy": s.never}
	for name, from := range keys {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(offline, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(offline, "log.vkey"), []byte(s.vkey+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(bundle, policy string) (string, int) {
		return run(t, s.talosctl, "verify-log-proof", "--bundle", bundle, "--log-key", filepath.Join(offline, "log.vkey"),
			"--witness-policy", filepath.Join(offline, policy), "--trusted-keys", filepath.Join(offline, "talosd.pub"))
	}
	out, code = check(bundle, "witnesses.policy")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("OK: %s %s (signed by ", schemas.TypeReceiptDecision, id)) ||
		!strings.Contains(out, fmt.Sprintf(") is entry %d of log %s at size ", index, logOrigin)) || !strings.Contains(out, "cosigned by w1, w2 (quorum both)") {
		t.Fatalf("verify-log-proof: exit %d\n%s", code, out)
	}
	if out, code = check(bundle, "never.policy"); code != 1 || !strings.Contains(out, "0 of 2 witnesses of quorum both cosigned it (missing w3, w4)") {
		t.Fatalf("verify-log-proof with witnesses that never cosigned: exit %d\n%s", code, out)
	}
	var b logproof.Bundle
	raw, _ := os.ReadFile(bundle)
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	other, otherIndex := s.someRecord(t, 4)
	var otherRecord string
	if err := s.conn.QueryRow(context.Background(), "SELECT cloudevent FROM `"+s.db+"`.v_receipts WHERE receipt_id = ?", other).Scan(&otherRecord); err != nil {
		t.Fatal(err)
	}
	for name, alter := range map[string]func(*logproof.Bundle){
		"another entry's index": func(b *logproof.Bundle) { b.LogIndex = int64(otherIndex) },
		"another record":        func(b *logproof.Bundle) { b.Record = otherRecord },
		"an altered record":     func(b *logproof.Bundle) { b.Record = strings.Replace(b.Record, `"decision":"`, `"decision":"x`, 1) },
	} {
		c := b
		alter(&c)
		p := filepath.Join(offline, "altered.json")
		enc, _ := json.Marshal(c)
		if err := os.WriteFile(p, enc, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := check(p, "witnesses.policy"); code != 1 || !strings.Contains(out, "FAILED: proof bundle does not verify") {
			t.Errorf("a bundle with %s: exit %d\n%s", name, code, out)
		}
	}
}

// forge signs n decision receipts of a new chain with the deployment's
// own key, as an insider could, dated at, and stores them straight into
// ClickHouse: the log never sees them.
func (s *logStack) forge(t *testing.T, chain string, at time.Time, n int) (ids []string, records [][]byte) {
	t.Helper()
	ids, records, recs := s.seal(t, chain, at, n)
	if err := query.NewSinkWriter(s.conn, s.db).Write(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	return ids, records
}

// seal signs n decision receipts with the pipeline's key on a chain of
// their own, as forge does, storing them nowhere.
func (s *logStack) seal(t *testing.T, chain string, at time.Time, n int) (ids []string, records [][]byte, recs []schemas.AuditRecord) {
	t.Helper()
	key, err := receipts.LoadPrivateKey(s.signer + ".key")
	if err != nil {
		t.Fatal(err)
	}
	ch := receipts.NewChain(chain, key)
	for i := range n {
		tcid := fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012d", i+1)
		data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "list_directory", AgentID: "agent-7", ToolID: "files/list_directory",
			Timestamp: at.Format(schemas.TimeFormat), ResultCode: "allow", ToolCallID: tcid, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
			SessionID: "forged", EPID: "gw-1", ServerID: "files", ToolName: "list_directory", Phase: "pre", Mode: "prod", Decision: "allow",
			ReasonCodes: []string{}, ToolClass: "read", DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
		sealed, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/tlogv", Subject: tcid, Time: at}, &data)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(sealed); err != nil {
			t.Fatal(err)
		}
		ids, records = append(ids, sealed.ID), append(records, sealed.JSON)
		recs = append(recs, schemas.AuditRecord{Subject: "talos.audit.receipt.decision.files", Data: sealed.JSON, StreamSeq: uint64(900000 + i)})
	}
	return ids, records, recs
}

// tamperRows deletes a logged receipt's row, stores a receipt the log
// lacks, and one claiming a log index another record holds; verify names
// each.
func (s *logStack) tamperRows(t *testing.T, size int64) {
	t.Helper()
	ctx := context.Background()
	victim, victimIndex := s.someRecord(t, 5)
	if err := query.MutateAndWait(ctx, s.conn, s.db, query.TableReceipts, "DELETE WHERE receipt_id = '"+victim+"'"); err != nil {
		t.Fatal(err)
	}
	// A chain's last receipt: no chain checkpoint signs it, so only the
	// log tells that it was there.
	var tail string
	var tailIndex uint64
	err := s.conn.QueryRow(ctx, "SELECT r.receipt_id, e.log_index FROM `"+s.db+"`.v_receipts AS r "+
		"ALL INNER JOIN `"+s.db+"`.v_log_entries AS e ON r.receipt_id = e.event_id WHERE r.kind = 'decision' AND r.receipt_id != '"+victim+"' "+
		"ORDER BY r.chain_seq DESC, e.log_index DESC LIMIT 1").Scan(&tail, &tailIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := query.MutateAndWait(ctx, s.conn, s.db, query.TableReceipts, "DELETE WHERE receipt_id = '"+tail+"'"); err != nil {
		t.Fatal(err)
	}
	unlogged, _ := s.forge(t, "forged-a", time.Now().Add(-time.Hour), 1)
	claimant, _ := s.forge(t, "forged-b", time.Now().Add(-time.Hour), 1)
	holder, held := s.someRecord(t, 6)
	err = query.InsertLogEntries(ctx, s.conn, s.db, []query.LogEntryRow{{EventID: claimant[0], LogIndex: held, LeafHash: strings.Repeat("0", 64),
		Origin: logOrigin, Subject: "talos.audit.receipt.decision.files", StreamSeq: 1, Time: time.Now().UTC().Truncate(time.Second), TimeMS: uint64(time.Now().UnixMilli())}})
	if err != nil {
		t.Fatal(err)
	}
	out, code := run(t, s.talosctl, append(s.g, "verify", "--trusted-keys", s.pub, "--log-url", s.url, "--log-key", s.vkey,
		"--witness-policy", s.policy, "--log-grace", "0s")...)
	for _, want := range []string{
		fmt.Sprintf("MISSING    missing_row: receipt %s: log entry %d has no stored row with its bytes (deleted, or altered)", victim, victimIndex),
		fmt.Sprintf("MISSING    missing_row: receipt %s: log entry %d has no stored row with its bytes (deleted, or altered)", tail, tailIndex),
		fmt.Sprintf("UNLOGGED   not_in_log: receipt %s: not in the log up to size %d, and no log index", unlogged[0], size),
		fmt.Sprintf("UNLOGGED   not_in_log: receipt %s: its log index %d holds another record (receipt %s)", claimant[0], held, holder),
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("tampered rows: exit %d, want %q in\n%s", code, want, out)
		}
	}
	if !strings.Contains(out, "2 unlogged") {
		t.Errorf("tampered rows: the summary does not count 2 unlogged records:\n%s", out)
	}
}

// rewrittenLog serves, in place of the log, a copy rebuilt under the
// same key with another history of the same size (its first entry
// replaced): its checkpoint lacks the witnesses' cosignatures, and it
// does not extend the checkpoint the auditor kept.
func (s *logStack) rewrittenLog(t *testing.T, size int64, kept string) {
	t.Helper()
	ctx := context.Background()
	key, err := tlog.LoadOrCreateKey(filepath.Join(s.data, "keys", "log.key"), logOrigin, false)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(s.url)
	f, err := client.NewHTTPFetcher(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	var entries [][]byte
	for b := uint64(0); int64(b)*256 < size; b++ {
		bundle, err := client.GetEntryBundle(ctx, f.ReadEntryBundle, b, uint64(size))
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, bundle.Entries...)
	}
	_, forged := s.forge(t, "forged-c", time.Now().Add(-time.Hour), 1)
	entries[0] = forged[0]
	dir := filepath.Join(t.TempDir(), "rewritten")
	l, err := tlog.Open(tlog.Options{Dir: dir, Key: key, CheckpointInterval: 100 * time.Millisecond, BatchAge: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries[:size] {
		if _, err := l.Add(ctx, e)(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 30*time.Second, func() bool { n, err := l.Published(); return err == nil && n == uint64(size) })
	if err := l.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tlog.Handler(dir))
	defer srv.Close()
	verify := append(s.g, "verify", "--trusted-keys", s.pub, "--log-url", srv.URL, "--log-key", s.vkey)
	out, code := run(t, s.talosctl, append(verify, "--witness-policy", s.policy)...)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("UNWITNESSED witness_quorum: log checkpoint %s at size %d: 0 of 2 witnesses of quorum both cosigned it (missing w1, w2)", logOrigin, size)) {
		t.Errorf("rewritten log, witness policy: exit %d\n%s", code, out)
	}
	out, code = run(t, s.talosctl, append(verify, "--since-checkpoint", kept)...)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("ALTERED    log_rewritten: log checkpoint %s at size %d: does not extend the checkpoint kept at size %d", logOrigin, size, size)) {
		t.Errorf("rewritten log, since the checkpoint kept: exit %d\n%s", code, out)
	}
	out, code = run(t, s.talosctl, "log-consistency", "--log-url", srv.URL, "--log-key", s.vkey, "--since-checkpoint", kept)
	if code == 0 || !strings.Contains(out, fmt.Sprintf("the log's tree at size %d has root", size)) || !strings.Contains(out, "its history was rewritten") {
		t.Errorf("log-consistency from the kept checkpoint to the rewritten log: exit %d\n%s", code, out)
	}
}

// checkExport holds an export of the database (talosctl export --kind
// all) to the log with verify --file: whole, it passes, the rejected
// ToolCallEvents included (offline, the one stored without its payloads
// is said to be uncheckable, not failed); a record taken out, a receipt
// or the rejection stored without its payloads, is named as a log entry
// without its record, except with --partial; a record the log lacks is
// named either way.
func (s *logStack) checkExport(t *testing.T, size int64, rejected [2]string) {
	t.Helper()
	export := filepath.Join(s.dir, "export.jsonl")
	if out, code := run(t, s.talosctl, append(s.g, "export", "--kind", "all", "--out", export)...); code != 0 {
		t.Fatalf("export: exit %d\n%s", code, out)
	}
	verify := []string{"verify", "--trusted-keys", s.pub, "--log-url", s.url, "--log-key", s.vkey, "--witness-policy", s.policy, "--log-grace", "0s"}
	out, code := run(t, s.talosctl, append(verify, "--file", export)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("log %s at size %d cosigned by 2 of 2 witnesses (quorum both): %d entries match its root, %d stored records found in it "+
		"(1 of them rejected ToolCallEvents, stored without the payloads the sink withheld)", logOrigin, size, size, size)) ||
		!strings.Contains(out, "; 2 rejected ToolCallEvents (refused by the flight recorder, in no chain): 1 signed by a trusted key, 1 stored without the payloads their signature covers") {
		t.Fatalf("verify --file of a whole export against the log: exit %d\n%s", code, out)
	}
	b, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), rawSecret) {
		t.Fatal("the export carries the payload the sink withheld")
	}
	only := filepath.Join(s.dir, "rejected.jsonl")
	if out, code := run(t, s.talosctl, append(s.g, "export", "--kind", "rejected", "--out", only)...); code != 0 || !strings.Contains(out, "exported 2 records (rejected)") {
		t.Fatalf("export --kind rejected: exit %d\n%s", code, out)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	var taken, takenID string
	for i, l := range lines {
		if e := logproof.ReadEntry([]byte(strings.TrimSpace(l))); e.Type == schemas.TypeReceiptDecision {
			taken, takenID = l, e.EventID
			lines = append(lines[:i:i], lines[i+1:]...)
			break
		}
	}
	for i, l := range lines {
		if x, ok := query.ReadExportedRejection([]byte(strings.TrimSpace(l))); ok && x.ID == rejected[0] {
			lines = append(lines[:i:i], lines[i+1:]...)
			break
		}
	}
	_, forged, _ := s.seal(t, "forged-f", time.Now().Add(-time.Hour), 1)
	lines = append(lines, "\n"+string(forged[0])+"\n")
	cut := filepath.Join(s.dir, "cut.jsonl")
	if err := os.WriteFile(cut, []byte(strings.Join(lines, "")), 0o644); err != nil || taken == "" {
		t.Fatalf("no decision receipt in the export, or %v", err)
	}
	out, code = run(t, s.talosctl, append(verify, "--file", cut)...)
	missing := fmt.Sprintf("MISSING    missing_row: receipt %s: log entry", takenID)
	missingRejected := fmt.Sprintf("MISSING    missing_row: tool call event %s: log entry", rejected[0])
	if code != 1 || !strings.Contains(out, missing) || !strings.Contains(out, missingRejected) || !strings.Contains(out, "UNLOGGED   not_in_log: receipt ") {
		t.Errorf("verify --file without a record and with a forged one: exit %d\n%s", code, out)
	}
	out, code = run(t, s.talosctl, append(verify, "--file", cut, "--partial")...)
	if code != 1 || strings.Contains(out, missing) || strings.Contains(out, missingRejected) || !strings.Contains(out, "UNLOGGED   not_in_log: receipt ") {
		t.Errorf("verify --file --partial: the missing record is not a problem, the forged one is: exit %d\n%s", code, out)
	}
}

// rawSecret is the payload of the refused ToolCallEvent that does not
// match its hash: the sink withholds it.
const rawSecret = "ghp_R4wS3cr3tT0k3nV4lu3BBBBBBBBBBBBBBBB"

// publishRejected publishes on TALOS_AUDIT, signed with the pipeline's
// key as a worker would, two ToolCallEvents the flight recorder refuses:
// one whose args payload does not match its hash (stored without its
// payloads), one without a trace_id and without payloads (stored as
// received). It returns their ids, in that order.
func (s *logStack) publishRejected(t *testing.T) (ids [2]string) {
	t.Helper()
	key, err := receipts.LoadPrivateKey(s.signer + ".key")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	for i, trace := range []string{"4bf92f35-77b3-4da6-a3ce-929d0e0e4736", ""} {
		callID := fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012d", 500+i)
		ev := schemas.ToolCallEvent{Type: schemas.ToolCallEventKind, TraceID: trace, ToolCallID: callID, ToolID: "files/read_file",
			ToolVersion: "1.0.0", Transport: "mcp", SideEffect: schemas.SideEffectRead, Idempotency: schemas.IdempotencyIdempotent,
			Actor: schemas.Actor{Kind: "agent", AgentID: "agent-7"}, OK: true,
			Timing:    schemas.EventTiming{StartedAt: at.Format(schemas.TimeFormat), EndedAt: at.Format(schemas.TimeFormat)},
			SessionID: "tlogv-rejected", EPID: "gw-1", ServerID: "files", ToolName: "read_file", Phase: schemas.PhasePre,
			Decision: schemas.DecisionAllow, ReasonCodes: []string{}, ReceiptID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d70", Redactions: []schemas.Redaction{}}
		if trace != "" {
			ev.ArgsRef, ev.ArgsHash = "sha256:"+strings.Repeat("ab", 32), strings.Repeat("ab", 32)
			ev.Payloads = &schemas.Payloads{Args: jsonkit.Canonical(`{"token":"` + rawSecret + `"}`)}
		}
		sealed, err := receipts.SignEvent(key, receipts.Meta{Type: schemas.TypeToolCall, Source: "talos://enforce/tlogv", Subject: callID, Time: at}, &ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := query.ToolCallRowFromEvent(sealed.JSON); err == nil {
			t.Fatalf("event %d is not refused by the recorder", i)
		}
		if _, err := s.js.Publish(context.Background(), schemas.ToolCallEventSubject("files"), sealed.JSON); err != nil {
			t.Fatal(err)
		}
		ids[i] = sealed.ID
	}
	return ids
}

// checkConsistency has talosctl print the consistency proof from the
// checkpoint kept at size1 to the one at size2, and checks it with
// golang.org/x/mod's tlog against the roots the two signed checkpoints
// carry (read here from their notes' text); it fails for sizes the log
// does not have.
func (s *logStack) checkConsistency(t *testing.T, seen, current string, size1, size2 int64) {
	t.Helper()
	out, code := run(t, s.talosctl, "log-consistency", "--log-url", s.url, "--log-key", s.vkey, "--witness-policy", s.policy,
		"--since-checkpoint", seen, "--to", fmt.Sprint(size2))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) < 4 || !strings.HasPrefix(lines[0], fmt.Sprintf("log %s: size %d (root ", logOrigin, size1)) ||
		!strings.Contains(lines[len(lines)-1], "OK: checked with golang.org/x/mod/sumdb/tlog.CheckTree") {
		t.Fatalf("log-consistency: exit %d\n%s", code, out)
	}
	var proof modtlog.TreeProof
	for _, l := range lines[3 : len(lines)-1] {
		h, err := modtlog.ParseHash(l)
		if err != nil {
			t.Fatalf("log-consistency: proof line %q: %v\n%s", l, err, out)
		}
		proof = append(proof, h)
	}
	root := func(file string) modtlog.Hash {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		h, err := modtlog.ParseHash(strings.Split(string(b), "\n")[2])
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if err := modtlog.CheckTree(proof, size2, root(current), size1, root(seen)); err != nil {
		t.Fatalf("x/mod tlog refuses the printed proof from %d to %d: %v\n%s", size1, size2, err, out)
	}
	if len(proof) == 0 && size1 != size2 {
		t.Fatalf("an empty proof from %d to %d", size1, size2)
	}
	out, code = run(t, s.talosctl, "log-consistency", "--log-url", s.url, "--log-key", s.vkey, "--from", "1", "--to", fmt.Sprint(size2+1000000))
	if code == 0 || !strings.Contains(out, fmt.Sprintf("the newer size %d is beyond the log's checkpoint at size", size2+1000000)) {
		t.Fatalf("log-consistency beyond the log: exit %d\n%s", code, out)
	}
}
