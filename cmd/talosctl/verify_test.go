package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// plantChain stores n decision receipts of chain id signed by key through
// the sink, with a checkpoint after every `every` receipts; it returns the
// receipt ids by seq-1 and the chain (to continue it).
func plantChain(t *testing.T, ctx context.Context, w *query.SinkWriter, key *receipts.PrivateKey, id string, n, every int) ([]string, *receipts.Chain) {
	t.Helper()
	ch := receipts.NewChain(id, key)
	return continueChain(t, ctx, w, ch, n, every), ch
}

func continueChain(t *testing.T, ctx context.Context, w *query.SinkWriter, ch *receipts.Chain, n, every int) []string {
	t.Helper()
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	var ids []string
	var recs []schemas.AuditRecord
	for i := 1; i <= n; i++ {
		tcid := fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012d", i)
		data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", AgentID: "agent-7", ToolID: "files/read_file",
			Timestamp: at.Format(schemas.TimeFormat), ResultCode: "allow", ToolCallID: tcid, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
			SessionID: "sess-1", EPID: "gw-1", ServerID: "files", ToolName: "read_file", Phase: "pre", Mode: "prod", Decision: "allow",
			ReasonCodes: []string{}, ToolClass: "read", DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
		s, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: tcid, Time: at}, &data)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
		recs = append(recs, schemas.AuditRecord{Subject: "talos.audit.receipt.decision.files", Data: s.JSON})
		if every > 0 && int(s.Seq)%every == 0 {
			cp, err := ch.Checkpoint(receipts.Meta{Source: "talos://enforce/w1", Time: at}, false)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, schemas.AuditRecord{Subject: schemas.CheckpointSubject(ch.ID()), Data: cp.JSON})
		}
	}
	for i := range recs {
		recs[i].StreamSeq = uint64(time.Now().UnixNano()) + uint64(i)
	}
	if err := w.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	return ids
}

func writePub(t *testing.T, k *receipts.PrivateKey, dir, name string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := receipts.WriteKeyPair(k, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, name+".key")); err != nil {
		t.Fatal(err)
	}
}

// An auditor's session with talosctl: verify an untouched database
// (checkpoints included), across a key rotation; get one receipt's
// inclusion proof and check it offline with only the proof and the public
// key; then tamper in five ways and read verify's verdict, one line per
// problem and a one-line summary by category.
func TestVerifyCLI(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	ctx, conn, addr, db := cliDB(t)
	w := query.NewSinkWriter(conn, db)
	dir := t.TempDir()
	old, _ := receipts.GenerateKey()
	rotated, _ := receipts.GenerateKey()
	trusted := filepath.Join(dir, "trusted")
	writePub(t, old, trusted, "talosd-2026-10")
	writePub(t, rotated, trusted, "talosd-2026-11")
	onlyNew := filepath.Join(dir, "only-new")
	writePub(t, rotated, onlyNew, "talosd-2026-11")

	// The old key signed chain w1 (25 receipts, checkpoints at 10 and 20);
	// after rotation the new key signs a new chain, w2.
	ids, _ := plantChain(t, ctx, w, old, "w1", 25, 10)
	ids2, _ := plantChain(t, ctx, w, rotated, "w2", 4, 2)
	g := []string{"--clickhouse-addr", addr, "--clickhouse-database", db}

	out, code := run(t, talosctl, append(g, "verify", "--trusted-keys", trusted)...)
	if code != 0 || !strings.Contains(out, "OK: 29 receipts in 2 chains, 4 checkpoints verified (signatures, chain links, 4 Merkle roots, stored columns)") ||
		!strings.Contains(out, "5 receipts follow the last checkpoint") {
		t.Fatalf("untouched: exit %d\n%s", code, out)
	}
	// The rotated-out key is no longer trusted: its receipts and
	// checkpoints are reported as foreign, not accepted.
	out, code = run(t, talosctl, append(g, "verify", "--trusted-keys", onlyNew)...)
	if code != 1 || strings.Count(out, "FOREIGN    unknown_key: receipt ") != 25 || strings.Count(out, "FOREIGN    unknown_key: checkpoint ") != 2 ||
		!strings.Contains(out, "FAILED: 27 problems (27 foreign)") {
		t.Fatalf("old key untrusted: exit %d\n%s", code, out)
	}

	// Inclusion proof of w1 seq 7, checked offline from a directory that
	// holds only the proof and the public key.
	offline := filepath.Join(dir, "offline")
	if err := os.MkdirAll(offline, 0o755); err != nil {
		t.Fatal(err)
	}
	proofFile := filepath.Join(offline, "proof.json")
	if out, code := run(t, talosctl, append(g, "verify", "--trusted-keys", trusted, "--receipt", ids[6], "--out", proofFile)...); code != 0 ||
		!strings.Contains(out, "is leaf 6 of 10 under checkpoint") {
		t.Fatalf("verify --receipt: exit %d\n%s", code, out)
	}
	writePub(t, old, offline, "talosd")
	out, code = run(t, talosctl, "verify-proof", "--proof", proofFile, "--trusted-keys", filepath.Join(offline, "talosd.pub"))
	if code != 0 || !strings.Contains(out, "OK: receipt "+ids[6]+" (chain w1 seq 7") || !strings.Contains(out, "leaf 6 of 10") {
		t.Fatalf("verify-proof: exit %d\n%s", code, out)
	}
	b, _ := os.ReadFile(proofFile)
	var p verify.Proof
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	p.LeafIndex = 5
	b, _ = json.Marshal(p)
	bad := filepath.Join(offline, "bad.json")
	if err := os.WriteFile(bad, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, talosctl, "verify-proof", "--proof", bad, "--trusted-keys", filepath.Join(offline, "talosd.pub")); code != 1 || !strings.Contains(out, "FAILED") {
		t.Fatalf("altered proof: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, "verify-proof", "--proof", proofFile, "--trusted-keys", onlyNew); code != 1 || !strings.Contains(out, "not a trusted key") {
		t.Fatalf("proof with the wrong key: exit %d\n%s", code, out)
	}
	// The same proof from an export, without ClickHouse.
	export := filepath.Join(dir, "all.jsonl")
	if out, code := run(t, talosctl, append(g, "export", "--format", "jsonl", "--kind", "all", "--out", export)...); code != 0 {
		t.Fatalf("export: exit %d\n%s", code, out)
	}
	fileProof := filepath.Join(offline, "from-file.json")
	if out, code := run(t, talosctl, "verify", "--trusted-keys", trusted, "--file", export, "--receipt", ids[6], "--out", fileProof); code != 0 ||
		!strings.Contains(out, "is leaf 6 of 10 under checkpoint") {
		t.Fatalf("verify --file --receipt: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, "verify-proof", "--proof", fileProof, "--trusted-keys", filepath.Join(offline, "talosd.pub")); code != 0 {
		t.Fatalf("verify-proof of the proof from an export: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, "verify", "--trusted-keys", trusted, "--file", export, "--receipt", ids[22]); code != 1 || !strings.Contains(out, "no checkpoint covers this receipt yet") ||
		!strings.Contains(out, "export again once its chain's next checkpoint is stored") {
		t.Fatalf("verify --file --receipt after the last checkpoint: exit %d\n%s", code, out)
	}
	// The same export on standard input: spooled to a file, read as one,
	// and named as what it is; the temporary file is gone afterwards.
	exported, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	stdin := func(input string, args ...string) (string, int) {
		t.Helper()
		cmd := testenv.Command(talosctl, append([]string{"verify", "--trusted-keys", trusted, "--file", "-"}, args...)...)
		cmd.Stdin = strings.NewReader(input)
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		out, _ := cmd.CombinedOutput()
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("verify --file - %v left %d files in TMPDIR", args, len(left))
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	if out, code := stdin(string(exported)); code != 0 || !strings.Contains(out, "OK: 29 receipts in 2 chains, 4 checkpoints verified (signatures, chain links, 4 Merkle roots) from standard input") {
		t.Fatalf("verify --file -: exit %d\n%s", code, out)
	}
	stdinProof := filepath.Join(offline, "from-stdin.json")
	if out, code := stdin(string(exported), "--receipt", ids[6], "--out", stdinProof); code != 0 || !strings.Contains(out, "is leaf 6 of 10 under checkpoint") {
		t.Fatalf("verify --file - --receipt: exit %d\n%s", code, out)
	}
	if a, b := mustRead(t, fileProof), mustRead(t, stdinProof); a != b {
		t.Errorf("the proof from standard input differs from the file's:\n%s\n%s", b, a)
	}
	if out, code := stdin(`[{"id":"c"} x`); code != 2 || !strings.Contains(out, "talosctl: standard input: ") || strings.Contains(out, tmp) {
		t.Fatalf("verify --file - of a broken array: exit %d (want 2, naming standard input, not the spooled file)\n%s", code, out)
	}
	// Seq 23 follows the last checkpoint: no proof yet, said plainly.
	if out, code := run(t, talosctl, append(g, "verify", "--trusted-keys", trusted, "--receipt", ids[22])...); code != 1 || !strings.Contains(out, "no checkpoint covers this receipt yet") ||
		!strings.HasSuffix(out, "within its --checkpoint-interval (10 s by default): retry in a few seconds\n") {
		t.Fatalf("receipt after the last checkpoint: exit %d\n%s", code, out)
	}
	// An id no receipt has, said plainly.
	if out, code := run(t, talosctl, append(g, "verify", "--trusted-keys", trusted, "--receipt", "nonexistent-id")...); code != 1 ||
		out != "talosctl: no receipt has id nonexistent-id in ClickHouse "+addr+" database "+db+"\n" {
		t.Fatalf("verify --receipt of an unknown id: exit %d\n%s", code, out)
	}

	// Tamper: a column, a signed JSON, a deleted row, two rows' seq
	// swapped, a forged row signed by an untrusted key.
	mut := func(tail string) {
		t.Helper()
		if err := query.MutateAndWait(ctx, conn, db, query.TableReceipts, tail); err != nil {
			t.Fatal(err)
		}
	}
	mut("UPDATE agent_id = 'someone-else' WHERE receipt_id = '" + ids[2] + "'")
	mut(`UPDATE cloudevent = replaceOne(cloudevent, '"decision":"allow"', '"decision":"deny"') WHERE receipt_id = '` + ids[4] + "'")
	mut("DELETE WHERE receipt_id = '" + ids[11] + "'")
	mut(fmt.Sprintf("UPDATE chain_seq = if(chain_seq = 15, 16, 15) WHERE receipt_id IN ('%s', '%s')", ids[14], ids[15]))
	forger, _ := receipts.GenerateKey()
	var head string
	if err := conn.QueryRow(ctx, "SELECT receipt_hash FROM `"+db+"`.receipts WHERE receipt_id = ?", ids2[3]).Scan(&head); err != nil {
		t.Fatal(err)
	}
	fch, err := receipts.ResumeChain("w2", forger, 4, head)
	if err != nil {
		t.Fatal(err)
	}
	forged := continueChain(t, ctx, w, fch, 1, 0)

	out, code = run(t, talosctl, append(g, "verify", "--trusted-keys", trusted)...)
	t.Logf("talosctl verify on a tampered database:\n%s", out)
	for _, want := range []string{
		"ALTERED    altered_column: receipt " + ids[2] + " (chain w1 seq 3): stored columns differ from the signed cloudevent: agent_id",
		"ALTERED    bad_signature: receipt " + ids[4] + " (chain w1 seq 5)",
		"MISSING    chain_gap: receipt " + ids[12] + " (chain w1 seq 13): seq 12 missing",
		"REORDERED  reordered: receipt " + ids[14] + " (chain w1 seq 15): stored at chain w1 seq 16, but signed as chain w1 seq 15",
		"REORDERED  reordered: receipt " + ids[15] + " (chain w1 seq 16): stored at chain w1 seq 15, but signed as chain w1 seq 16",
		"FOREIGN    unknown_key: receipt " + forged[0] + " (chain w2 seq 5)",
		"FAILED: 6 problems (1 missing, 2 altered, 2 reordered, 1 foreign) in 29 receipts in 2 chains, 4 checkpoints from ClickHouse",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q", want)
		}
	}
	if code != 1 || strings.Count(out, "\n") != 7 {
		t.Fatalf("exit %d, %d lines; want exit 1 and one line per problem plus the summary", code, strings.Count(out, "\n"))
	}
	// The same, as JSON: categories counted, each problem with its own.
	out, code = runStdout(t, talosctl, append(g, "--json", "verify", "--trusted-keys", trusted)...)
	var rep struct {
		OK         bool           `json:"ok"`
		Categories map[string]int `json:"categories"`
		Problems   []struct {
			Kind, Category, ReceiptID string
		} `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 || rep.OK || rep.Categories["reordered"] != 2 || len(rep.Problems) != 6 {
		t.Fatalf("--json: exit %d %v\n%s", code, err, out)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// --batch-signatures gives the same verdicts, from ClickHouse and from an
// export: OK on an untouched database, and a receipt whose signed JSON was
// edited named as a bad signature among receipts that verify.
func TestVerifyCLIBatchSignatures(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	ctx, conn, addr, db := cliDB(t)
	dir := t.TempDir()
	key, _ := receipts.GenerateKey()
	writePub(t, key, dir, "talosd")
	pub := filepath.Join(dir, "talosd.pub")
	ids, _ := plantChain(t, ctx, query.NewSinkWriter(conn, db), key, "w1", 150, 100)
	g := []string{"--clickhouse-addr", addr, "--clickhouse-database", db}
	export := filepath.Join(dir, "all.jsonl")
	exportAll := func() {
		t.Helper()
		if out, code := run(t, talosctl, append(g, "export", "--format", "jsonl", "--kind", "all", "--out", export)...); code != 0 {
			t.Fatalf("export: exit %d\n%s", code, out)
		}
	}
	exportAll()
	for _, args := range [][]string{append(g, "verify", "--trusted-keys", pub), {"verify", "--trusted-keys", pub, "--file", export}} {
		for _, batch := range []bool{false, true} {
			a := args
			if batch {
				a = append(a, "--batch-signatures")
			}
			if out, code := run(t, talosctl, a...); code != 0 || !strings.Contains(out, "OK: 150 receipts in 1 chains, 1 checkpoints verified") {
				t.Fatalf("%v: exit %d\n%s", a, code, out)
			}
		}
	}
	if err := query.MutateAndWait(ctx, conn, db, query.TableReceipts,
		`UPDATE cloudevent = replaceOne(cloudevent, '"decision":"allow"', '"decision":"deny"') WHERE receipt_id = '`+ids[40]+"'"); err != nil {
		t.Fatal(err)
	}
	exportAll()
	for _, args := range [][]string{append(g, "verify", "--trusted-keys", pub), {"verify", "--trusted-keys", pub, "--file", export}} {
		a := append(args, "--batch-signatures")
		out, code := run(t, talosctl, a...)
		if code != 1 || !strings.Contains(out, "ALTERED    bad_signature: receipt "+ids[40]+" (chain w1 seq 41)") ||
			!strings.Contains(out, "FAILED: 1 problems (1 altered) in 150 receipts") {
			t.Fatalf("%v: exit %d\n%s", a, code, out)
		}
	}
}
