package query

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// exportLike is an export as talosctl export writes one (kind all), but
// with its three chains' receipts interleaved: the receipts of chains
// fa, fb and fc (25 each, a checkpoint every 10) taken in turn, then two
// ToolCallEvents (one with a bad signature), two rejected ToolCallEvents
// and a line that is not JSON, then the checkpoints (two a chain, in
// chain order).
func exportLike(t *testing.T) (keys verify.KeySet, receiptsByChain [][][]byte, tail, checkpoints [][]byte) {
	t.Helper()
	key := testKey(t)
	keys = verify.KeySet{key.KID: key.Public()}
	for c, name := range []string{"fa", "fb", "fc"} {
		ch := receipts.NewChain(name, key)
		var links [][]byte
		for i := 1; i <= 25; i++ {
			links = append(links, sealDecision(t, ch, tcAt.Add(time.Duration(i)*time.Second), fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%02d%010d", c, i), "agent-7"))
			if i%10 == 0 {
				cp, err := ch.Checkpoint(receipts.Meta{Source: "talos://enforce/" + name, Time: tcAt}, false)
				if err != nil {
					t.Fatal(err)
				}
				checkpoints = append(checkpoints, cp.JSON)
			}
		}
		receiptsByChain = append(receiptsByChain, links)
	}
	good := signed(t, key, "call-1", tcAt, toolCallEvent(t, "0190f5b2-7c1e-7a3b-8d4e-000000000901", tcAt))
	bad := bytes.Replace(signed(t, key, "call-2", tcAt, toolCallEvent(t, "0190f5b2-7c1e-7a3b-8d4e-000000000902", tcAt)),
		[]byte(`"tool_version":"1.2.3"`), []byte(`"tool_version":"1.2.4"`), 1)
	f := newRejectedFixture(t)
	tail = [][]byte{good, bad,
		rejectionLine(t, schemas.AuditRecord{Subject: schemas.ToolCallEventSubject("files"), Data: f.a, StreamSeq: 1}),
		rejectionLine(t, schemas.AuditRecord{Subject: schemas.ToolCallEventSubject("files"), Data: f.d, StreamSeq: 2}),
		[]byte(`not json`)}
	return keys, receiptsByChain, tail, checkpoints
}

// interleave takes each chain's next receipt in turn.
func interleave(chains [][][]byte) [][]byte {
	var out [][]byte
	for i := 0; ; i++ {
		n := len(out)
		for _, c := range chains {
			if i < len(c) {
				out = append(out, c[i])
			}
		}
		if len(out) == n {
			return out
		}
	}
}

// TestVerifyExportFileStreams: talosctl verify --file reads an export
// whose receipts are in chain order twice instead of into memory, and
// reports what verifying it in memory reports (VerifyExport, what it did
// before): clean, with a receipt tampered, one missing, one twice, a
// checkpoint altered, as a range (--partial), as a JSON array, with
// batch verification. A file out of chain order is sorted in memory,
// with the same report. The reports are compared as they are: their
// problems in the same order (SortProblems breaks ties by record id).
func TestVerifyExportFileStreams(t *testing.T) {
	keys, chains, tail, cps := exportLike(t)
	dir := t.TempDir()
	tampered := func() [][][]byte {
		c := [][][]byte{slices.Clone(chains[0]), slices.Clone(chains[1]), slices.Clone(chains[2])}
		c[0][6] = bytes.Replace(c[0][6], []byte(`"agent-7"`), []byte(`"agent-8"`), 1)
		c[1] = slices.Delete(c[1], 12, 13)
		c[2] = slices.Insert(c[2], 4, c[2][3])
		return c
	}()
	alteredCPs := slices.Clone(cps)
	alteredCPs[2] = bytes.Replace(alteredCPs[2], []byte(`"to_seq":10`), []byte(`"to_seq":11`), 1)
	if bytes.Equal(alteredCPs[2], cps[2]) {
		t.Fatal("the checkpoint was not altered")
	}
	shuffled := slices.Concat(interleave(chains), tail, cps)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	shuffledTampered := slices.Concat(interleave(tampered), tail[:1], alteredCPs)
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(shuffledTampered), func(i, j int) {
		shuffledTampered[i], shuffledTampered[j] = shuffledTampered[j], shuffledTampered[i]
	})
	for _, c := range []struct {
		name           string
		events         [][]byte
		array, partial bool
		batch          bool
		read           fileRead
		ok             bool
	}{
		{name: "clean", events: slices.Concat(interleave(chains), tail[:1], cps), ok: true},
		{name: "clean, batch", events: slices.Concat(interleave(chains), tail[:1], cps), batch: true, ok: true},
		{name: "with rejections and a bad line", events: slices.Concat(interleave(chains), tail, cps)},
		{name: "tampered", events: slices.Concat(interleave(tampered), tail[:1], alteredCPs)},
		{name: "tampered, batch", events: slices.Concat(interleave(tampered), tail[:1], alteredCPs), batch: true},
		{name: "tampered, array", events: slices.Concat(interleave(tampered), tail[:4], cps), array: true},
		{name: "checkpoints first", events: slices.Concat(cps, interleave(chains), tail[:1]), ok: true},
		{name: "a range", events: slices.Concat(interleave([][][]byte{chains[0][5:], chains[1]}), cps[2:4]), partial: true, ok: true},
		{name: "a range without --partial", events: interleave([][][]byte{chains[0][5:], chains[1]})},
		{name: "out of chain order", events: shuffled, read: readIndexed},
		{name: "out of chain order, array", events: slices.DeleteFunc(slices.Clone(shuffled), func(raw []byte) bool { return !json.Valid(raw) }), array: true, read: readIndexed},
		{name: "tampered, out of chain order", events: shuffledTampered, read: readIndexed},
		{name: "tampered, out of chain order, batch", events: shuffledTampered, batch: true, read: readIndexed},
		{name: "one link out of order", events: slices.Concat(interleave(chains)[:40], interleave(chains)[41:], interleave(chains)[40:41]), read: readIndexed, ok: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".jsonl")
			content := append(bytes.Join(c.events, []byte("\n")), '\n')
			if c.array {
				content = slices.Concat([]byte("[\n"), bytes.Join(c.events, []byte(",\n")), []byte("\n]\n"))
			}
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			got, read, err := verifyExportFile(path, keys, VerifyOptions{Partial: c.partial, BatchSignatures: c.batch})
			if err != nil {
				t.Fatal(err)
			}
			events, err := verify.ReadEventsFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want := VerifyExport(path, events, keys, c.partial, c.batch)
			if read != c.read {
				t.Errorf("read %v, want %v", read, c.read)
			}
			if (got.Err() == nil) != c.ok {
				t.Errorf("verdict %v, want OK %v", got.Err(), c.ok)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("read twice:\n%+v\nin memory:\n%+v", got, want)
			}
		})
	}
	// What each faulty file must show, so that agreeing is not agreeing on
	// nothing.
	out, _, err := verifyExportFile(filepath.Join(dir, "tampered.jsonl"), keys, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, p := range out.Report.Problems {
		kinds[p.Kind]++
	}
	for _, k := range []string{verify.ProblemBadSignature, verify.ProblemChainGap, verify.ProblemDuplicateSeq} {
		if kinds[k] == 0 {
			t.Errorf("the tampered file shows no %s: %v", k, kinds)
		}
	}
	if out.Report.CheckpointsSeen != len(cps) || out.Report.Checked != 75+1 {
		t.Errorf("the tampered file: %d checkpoints, %d events checked", out.Report.CheckpointsSeen, out.Report.Checked)
	}
}

// TestProveFromEventsFile: verify --receipt --file proves a receipt from
// an export it reads twice, the proof one built straight from the range
// would be: the first checkpoint of its chain that covers it, with its
// range's hashes; it
// names a receipt no checkpoint covers yet, a range with a receipt
// missing, and an id the file lacks.
func TestProveFromEventsFile(t *testing.T) {
	keys, chains, tail, cps := exportLike(t)
	dir := t.TempDir()
	write := func(name string, events [][]byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, append(bytes.Join(events, []byte("\n")), '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	whole := slices.Concat(interleave(chains), tail, cps)
	path := write("whole.jsonl", whole)
	id := eventID(t, chains[1][13]) // chain fb, seq 14
	proof, res, err := ProveFromEventsFile(path, id, keys)
	if err != nil {
		t.Fatal(err)
	}
	if res.ChainID != "fb" || res.Seq != 14 || res.FromSeq != 11 || res.ToSeq != 20 || proof.LeafIndex != 3 || proof.TreeSize != 10 {
		t.Fatalf("proof of fb seq 14: %+v, leaf %d of %d", res, proof.LeafIndex, proof.TreeSize)
	}
	if again, err := verify.VerifyProof(proof, keys); err != nil || *again != *res {
		t.Fatalf("the proof does not verify: %v", err)
	}
	// The same proof built straight from what the file holds: fb's second
	// checkpoint (seq 11 to 20) and the hashes of those ten receipts.
	var hashes []string
	for _, raw := range chains[1][10:20] {
		ev, err := verify.VerifyEvent(raw, keys)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, ev.Hash)
	}
	direct, resDirect, err := verify.BuildProof(chains[1][13], cps[3], hashes, keys)
	if err != nil || !reflect.DeepEqual(direct, proof) || *resDirect != *res {
		t.Fatalf("built from the range: %v\n%+v\n%+v", err, direct, proof)
	}

	if _, _, err := ProveFromEventsFile(path, eventID(t, chains[1][23]), keys); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("fb seq 24, past the last checkpoint: %v", err)
	}
	gap := write("gap.jsonl", slices.Concat(interleave([][][]byte{chains[0], slices.Delete(slices.Clone(chains[1]), 14, 15)}), cps))
	if _, _, err := ProveFromEventsFile(gap, id, keys); err == nil || !strings.Contains(err.Error(), "chain fb seq 15 is not in the file") {
		t.Errorf("fb seq 15 missing: %v", err)
	}
	if _, _, err := ProveFromEventsFile(path, "0190f5b2-7c1e-7a3b-8d4e-999999999999", keys); err == nil || !strings.Contains(err.Error(), "no receipt with id") {
		t.Errorf("an id the file lacks: %v", err)
	}
}

// TestFileEventsNoticesChange: a file read twice (verify --file, a proof
// from a file) must be the same file both times: one appended to, one
// rewritten with the same size, one replaced by another with the same
// bytes and time each fail the next read with errFileChanged.
func TestFileEventsNoticesChange(t *testing.T) {
	dir := t.TempDir()
	content := []byte("{\"id\":\"a\"}\n{\"id\":\"b\"}\n")
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	write := func(path string, b []byte) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	count := func(src eventSource) (int, error) {
		n := 0
		err := src(func([]byte) error { n++; return nil })
		return n, err
	}
	for name, change := range map[string]func(path string){
		"appended": func(path string) { write(path, append(slices.Clone(content), "{\"id\":\"c\"}\n"...)) },
		"rewritten, same size": func(path string) {
			write(path, bytes.Replace(content, []byte("b"), []byte("x"), 1))
			if err := os.Chtimes(path, at, at.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		},
		"replaced, same bytes and time": func(path string) {
			other := path + ".new"
			write(other, content)
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".jsonl")
			write(path, content)
			src := fileEvents(path)
			for range 2 {
				if n, err := count(src); n != 2 || err != nil {
					t.Fatalf("unchanged: %d events, %v", n, err)
				}
			}
			change(path)
			if _, err := count(src); !errors.Is(err, errFileChanged) {
				t.Fatalf("after the change: %v, want errFileChanged", err)
			}
		})
	}
}

// TestVerifyExportFileProgress: the second read of verify --file reports
// its progress every progressEvery records and at its end, against the
// number of records the first read found; a short file reports none.
func TestVerifyExportFileProgress(t *testing.T) {
	key := testKey(t)
	keys := verify.KeySet{key.KID: key.Public()}
	ch := receipts.NewChain("fp", key)
	const n = progressEvery + 2000
	lines := make([][]byte, n)
	for i := range lines {
		lines[i] = sealDecision(t, ch, tcAt.Add(time.Duration(i+1)*time.Millisecond), fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012d", i+1), "agent-7")
	}
	var calls [][2]int
	progress := func(done, total int) { calls = append(calls, [2]int{done, total}) }
	// The reads before the last report every readingEvery bytes, and at
	// their end.
	defer func(every int64) { readingEvery = every }(readingEvery)
	readingEvery = 1 << 20
	type readAt struct {
		index       bool
		done, total int64
	}
	var reads []readAt
	reading := func(index bool, done, total int64) { reads = append(reads, readAt{index, done, total}) }
	// In chain order it is read twice; backwards, through an index.
	for _, c := range []struct {
		name string
		read fileRead
	}{{"long.jsonl", readInOrder}, {"backwards.jsonl", readIndexed}} {
		path := filepath.Join(t.TempDir(), c.name)
		content := append(bytes.Join(lines, []byte("\n")), '\n')
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		calls, reads = nil, nil
		out, read, err := verifyExportFile(path, keys, VerifyOptions{Progress: progress, Reading: reading})
		if err != nil || read != c.read || out.Err() != nil || out.Report.Checked != n {
			t.Fatalf("%s: read %v (want %v), %v, %v, %d checked", c.name, read, c.read, err, out.Err(), out.Report.Checked)
		}
		if len(calls) != 2 || calls[0][0] < progressEvery || calls[0][0] >= progressEvery+verify.FileWindow() || calls[1] != [2]int{n, n} || calls[0][1] != n {
			t.Errorf("%s: progress %v; want one report at %d–%d of %d, then %d of %d", c.name, calls, progressEvery, progressEvery+verify.FileWindow(), n, n, n)
		}
		// Reports at the start, after each MiB read and at the end; the
		// backwards file's first read stops at its second line, then it is
		// indexed.
		size, index := int64(len(content)), c.read == readIndexed
		want := []readAt{{false, 0, size}}
		if index {
			want = append(want, readAt{true, 0, size})
		}
		steps := reads[len(want) : len(reads)-1]
		if len(reads) < len(want)+1 || !slices.Equal(reads[:len(want)], want) || reads[len(reads)-1] != (readAt{index, size, size}) || len(steps) != int(size>>20) {
			t.Fatalf("%s: reads reported %v; want %v, one per MiB, then %d of %d", c.name, reads, want, size, size)
		}
		for i, r := range steps {
			if r.index != index || r.total != size || r.done < int64(i+1)<<20 || r.done >= int64(i+1)<<20+int64(len(lines[0]))+1 {
				t.Errorf("%s: report %d is %+v; want the first line past %d MiB of %d", c.name, i, r, i+1, size)
			}
		}
		slices.Reverse(lines)
	}
	keys, chains, _, _ := exportLike(t)
	short := filepath.Join(t.TempDir(), "short.jsonl")
	if err := os.WriteFile(short, append(bytes.Join(interleave(chains), []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	calls = nil
	if _, _, err := verifyExportFile(short, keys, VerifyOptions{Progress: progress, Partial: true}); err != nil || len(calls) != 0 {
		t.Errorf("a short file: %v, progress %v; want none", err, calls)
	}
}

// TestReceiptIndexSorts: the index orders receipts as SortForVerify orders
// them (chain id, seq, then id as text, the file's order among equals),
// whether their ids are UUIDs it holds as bytes or any other text.
func TestReceiptIndexSorts(t *testing.T) {
	type receipt struct {
		chain string
		seq   uint64
		id    string
	}
	in := []receipt{
		{"chain-b", 2, "0190f5b2-7c1e-7a3b-8d4e-00000000000a"},
		{"chain-a", 7, "zz-not-a-uuid"},
		{"chain-b", 1, "0190f5b2-7c1e-7a3b-8d4e-000000000001"},
		{"chain-a", 7, "0190F5B2-7C1E-7A3B-8D4E-000000000002"}, // upper case: text
		{"chain-a", 7, "0190f5b2-7c1e-7a3b-8d4e-000000000003"},
		{"chain-a", 7, "0190f5b2-7c1e-7a3b-8d4e-00000000000f"},
		{"chain-a", 7, ""},
		{"chain-a", 3, "0190f5b2-7c1e-7a3b-8d4e-000000000009"},
		{"chain-b", 2, "0190f5b2-7c1e-7a3b-8d4e-00000000000a"}, // the same again: after the first
		{"Chain-c", 1, "a"},
	}
	x := newReceiptIndex()
	var entries []indexed
	for i, r := range in {
		entries = append(entries, x.entry(verify.Place{Read: true, ChainID: r.chain, Seq: r.seq, ID: r.id}, span{off: int64(i)}))
	}
	x.sort(entries)
	want := make([]int, len(in))
	for i := range want {
		want[i] = i
	}
	slices.SortStableFunc(want, func(a, b int) int {
		ra, rb := in[a], in[b]
		return cmp.Or(strings.Compare(ra.chain, rb.chain), cmp.Compare(ra.seq, rb.seq), strings.Compare(ra.id, rb.id))
	})
	for i, e := range entries {
		if int(e.at.off) != want[i] {
			t.Fatalf("position %d holds receipt %d %+v, want %d %+v", i, e.at.off, in[e.at.off], want[i], in[want[i]])
		}
		if got := x.idText(&e); got != in[e.at.off].id {
			t.Errorf("receipt %d: id %q, want %q", e.at.off, got, in[e.at.off].id)
		}
	}
	if uuids := len(in) - len(x.ids); uuids != 6 {
		t.Errorf("%d ids held as UUIDs, want 6", uuids)
	}
}

// A file with nothing to verify is refused, not passed as OK.
func TestVerifyExportFileRefusesEmpty(t *testing.T) {
	key := testKey(t)
	keys := verify.KeySet{key.KID: key.Public()}
	for _, c := range []struct{ name, content string }{
		{"empty", ""},
		{"white space", " \n\t\r\n\n"},
		{"empty array", "[ ]\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "export.jsonl")
			if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := VerifyExportFile(path, keys, VerifyOptions{})
			if !errors.Is(err, ErrEmptyExport) || out != nil || !strings.HasPrefix(err.Error(), path+": ") {
				t.Fatalf("VerifyExportFile: %v, %+v; want %v naming the file", err, out, ErrEmptyExport)
			}
		})
	}
}

// A file none of whose records reads as JSON (a CSV export, a text) is
// refused in one error, which says what verify reads; one record that
// reads is enough for the rest to be verified and named malformed.
func TestVerifyExportFileRefusesNonExports(t *testing.T) {
	key := testKey(t)
	keys := verify.KeySet{key.KID: key.Public()}
	rec := &ExportRecord{Record: "decision", ID: "r1", CloudEvent: `{"id":"r1"}`}
	var csvExport bytes.Buffer
	w, err := NewExportWriter(&csvExport, ExportCSV)
	if err != nil || w.Write(rec) != nil || w.Flush() != nil {
		t.Fatal("writing a CSV export", err)
	}
	for _, c := range []struct{ name, content, want string }{
		{"csv export", csvExport.String(), "it is a CSV export (talosctl export --format csv); verify reads the JSON lines of talosctl export --format jsonl"},
		{"text", "# Talos\n\nAn audit pipeline.\n- one\n- two\n", "none of its 4 lines is a JSON event"},
		{"array of numbers", "[1, 2]", "none of its 2 lines is a JSON event"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "export")
			if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := VerifyExportFile(path, keys, VerifyOptions{})
			if !errors.Is(err, ErrNotExport) || out != nil || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("VerifyExportFile: %v, %+v; want %v saying %q", err, out, ErrNotExport, c.want)
			}
		})
	}
	// A text line before a JSON event: a tampered export, verified.
	path := filepath.Join(t.TempDir(), "export.jsonl")
	if err := os.WriteFile(path, []byte("not json\n{\"id\":\"x\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := VerifyExportFile(path, keys, VerifyOptions{})
	if err != nil || out.Counts[verify.CategoryMalformed] != 2 {
		t.Fatalf("VerifyExportFile of a text line and an event: %v, %+v", err, out)
	}
}
