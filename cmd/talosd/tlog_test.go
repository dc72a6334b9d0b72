package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestTransparencyLogChecksIndependently is issue 22's first must-show: the
// pipeline runs with the log role (real NATS, real ClickHouse, talosd as
// a process), and an auditor checks what talosd serves on --http-addr with
// golang.org/x/mod's note and tlog packages alone: the checkpoint is a
// C2SP tlog-checkpoint whose signed note verifies with the log's verifier
// key; a receipt, found through its log index in ClickHouse, is included
// at that index, and its entry is the receipt's stored bytes; and the
// checkpoint after more calls is consistent with the one before.
func TestTransparencyLogChecksIndependently(t *testing.T) {
	if testing.Short() {
		t.Skip("starts talosd and ClickHouse")
	}
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	writeKeyPair(t, dir, "signer")
	httpAddr := testenv.FreeAddr(t)
	data := filepath.Join(dir, "data")
	_, stop := startTalosdLog(t, bin, filepath.Join(dir, "talosd.log"), "--data-dir", data, "--nats-url", ns.URL(),
		"--clickhouse-addr", addr, "--clickhouse-database", db, "--registry", "demo/registry", "--signing-key", filepath.Join(dir, "signer.key"),
		"--roles", "enforce,sink,control,log", "--http-addr", httpAddr, "--instance", "tlog-e2e", "--batch-age", "200ms",
		"--log-origin", "audit.example.com/talos", "--checkpoint-interval", "500ms") // chain checkpoints, which the log must not take
	t.Cleanup(stop)
	waitFor(t, time.Minute, func() string {
		if b, _ := os.ReadFile(filepath.Join(dir, "talosd.log")); !bytes.Contains(b, []byte("log role started")) {
			return "the log role has not started"
		}
		return ""
	})
	out, err := testenv.Command(bin, "log-key", "--data-dir", data, "--log-origin", "audit.example.com/talos").Output()
	if err != nil {
		t.Fatalf("talosd log-key: %v", err)
	}
	verifier, err := note.NewVerifier(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("talosd log-key printed %q: %v", out, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, js := testenv.ConnectJS(t, ns.URL())
	a := &auditor{t: t, base: "http://" + httpAddr, verifier: verifier, conn: conn, db: db, js: js}

	if err := loadgen.SendUnsigned(ns.URL(), "tlog-1", 20); err != nil {
		t.Fatal(err)
	}
	size1, root1 := a.checkpointCovering(a.waitIndexed(ctx))
	id, index, stored := a.someReceipt(ctx)
	if uint64(index) >= uint64(size1) {
		t.Fatalf("receipt %s at index %d is not under the checkpoint of size %d", id, index, size1)
	}
	thr := tlog.TileHashReader(tlog.Tree{N: size1, Hash: root1}, a)
	proof, err := tlog.ProveRecord(size1, index, thr)
	if err != nil {
		t.Fatalf("inclusion proof from the served tiles: %v", err)
	}
	if err := tlog.CheckRecord(proof, size1, root1, index, tlog.RecordHash(stored)); err != nil {
		t.Errorf("receipt %s is not included at %d in the tree of size %d: %v", id, index, size1, err)
	}
	if entry := a.entry(index, size1); !bytes.Equal(entry, stored) {
		t.Errorf("entry %d is not receipt %s as stored:\n%s\n%s", index, id, entry, stored)
	}

	if err := loadgen.SendUnsigned(ns.URL(), "tlog-2", 20); err != nil {
		t.Fatal(err)
	}
	size2, root2 := a.checkpointCovering(a.waitIndexed(ctx))
	if size2 <= size1 {
		t.Fatalf("the log did not grow: %d then %d", size1, size2)
	}
	tp, err := tlog.ProveTree(size2, size1, tlog.TileHashReader(tlog.Tree{N: size2, Hash: root2}, a))
	if err != nil {
		t.Fatalf("consistency proof from the served tiles: %v", err)
	}
	if err := tlog.CheckTree(tp, size2, root2, size1, root1); err != nil {
		t.Errorf("checkpoint %d is not consistent with checkpoint %d: %v", size2, size1, err)
	}
	// A different old root must fail the same check.
	if err := tlog.CheckTree(tp, size2, root2, size1, tlog.RecordHash([]byte("forged"))); err == nil {
		t.Error("a forged old root passed the consistency check")
	}
}

// auditor reads the log over HTTP and ClickHouse with SQL, and checks
// with x/mod alone. It is the tlog.TileReader of the served tiles.
type auditor struct {
	t        *testing.T
	base     string
	verifier note.Verifier
	conn     driver.Conn
	db       string
	js       jetstream.JetStream
}

func (a *auditor) get(path string) (int, []byte) {
	a.t.Helper()
	resp, err := http.Get(a.base + path)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (a *auditor) Height() int { return 8 }

// ReadTiles fetches tiles: x/mod names them tile/8/L/N[.p/W], C2SP
// tlog-tiles (height 8) tile/L/N[.p/W].
func (a *auditor) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, tile := range tiles {
		p := "/" + strings.Replace(tile.Path(), "tile/8/", "tile/", 1)
		code, b := a.get(p)
		if code != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %d", p, code)
		}
		out[i] = b
	}
	return out, nil
}

func (a *auditor) SaveTiles([]tlog.Tile, [][]byte) {}

// waitIndexed waits until ClickHouse holds every receipt and
// ToolCallEvent TALOS_AUDIT holds, each with its log index, the indexes
// being exactly 0 to N-1 for N records (no record twice, nothing else in
// the log, per-chain checkpoints included), and checks that each index's
// leaf hash is the hash of the stored record. It returns N.
func (a *auditor) waitIndexed(ctx context.Context) int64 {
	a.t.Helper()
	var records, indexed, bad, entries, top uint64
	waitFor(a.t, 2*time.Minute, func() string {
		inStream := uint64(0)
		for _, m := range testenv.StreamMsgs(a.t, a.js, schemas.StreamAudit) {
			if strings.HasPrefix(m.Subject, schemas.SubjectReceipt) || strings.HasPrefix(m.Subject, schemas.SubjectToolCall) {
				inStream++
			}
		}
		q := "SELECT count(), countIf(e.event_id != ''), countIf(e.event_id != '' AND lower(hex(SHA256(concat(unhex('00'), r.ce)))) != e.leaf_hash) FROM (" +
			"SELECT receipt_id AS id, any(cloudevent) AS ce FROM `" + a.db + "`.receipts GROUP BY receipt_id UNION ALL " +
			"SELECT event_id AS id, any(cloudevent) AS ce FROM `" + a.db + "`.tool_calls GROUP BY event_id) AS r " +
			"ALL LEFT JOIN (SELECT event_id, any(leaf_hash) AS leaf_hash FROM `" + a.db + "`.v_log_entries GROUP BY event_id) AS e ON r.id = e.event_id"
		if err := a.conn.QueryRow(ctx, q).Scan(&records, &indexed, &bad); err != nil {
			return err.Error() // the sink has not migrated the database yet
		}
		if err := a.conn.QueryRow(ctx, "SELECT uniqExact(log_index), max(log_index) FROM `"+a.db+"`.v_log_entries").Scan(&entries, &top); err != nil {
			return err.Error()
		}
		if records == 0 || records != inStream || indexed != records || entries != records || top+1 != records {
			return fmt.Sprintf("TALOS_AUDIT holds %d records, ClickHouse %d, %d with a log index; %d log indexes up to %d", inStream, records, indexed, entries, top)
		}
		return ""
	})
	if bad != 0 {
		a.t.Errorf("%d stored records are not the leaf their log index names", bad)
	}
	return int64(records)
}

// checkpointCovering fetches /checkpoint until it covers size entries,
// checking each it reads: a signed note of exactly the log's key, whose
// text is a C2SP tlog-checkpoint of the log's origin.
func (a *auditor) checkpointCovering(size int64) (int64, tlog.Hash) {
	a.t.Helper()
	var n int64
	var root tlog.Hash
	waitFor(a.t, time.Minute, func() string {
		code, raw := a.get("/checkpoint")
		if code != http.StatusOK {
			return fmt.Sprintf("/checkpoint: %d", code)
		}
		msg, err := note.Open(raw, note.VerifierList(a.verifier))
		if err != nil {
			a.t.Fatalf("checkpoint does not verify with the log's key: %v\n%s", err, raw)
		}
		if len(msg.Sigs) != 1 || len(msg.UnverifiedSigs) != 0 || msg.Sigs[0].Name != "audit.example.com/talos" {
			a.t.Fatalf("checkpoint signatures: %+v, unverified %+v", msg.Sigs, msg.UnverifiedSigs)
		}
		lines := strings.Split(msg.Text, "\n")
		if len(lines) != 4 || lines[0] != "audit.example.com/talos" || lines[3] != "" {
			a.t.Fatalf("checkpoint body is not origin, size, root hash: %q", msg.Text)
		}
		if n, err = strconv.ParseInt(lines[1], 10, 64); err != nil || n < 0 || strconv.FormatInt(n, 10) != lines[1] {
			a.t.Fatalf("checkpoint size %q", lines[1])
		}
		h, err := base64.StdEncoding.DecodeString(lines[2])
		if err != nil || len(h) != len(root) {
			a.t.Fatalf("checkpoint root hash %q", lines[2])
		}
		copy(root[:], h)
		if n < size {
			return fmt.Sprintf("checkpoint of size %d, want %d", n, size)
		}
		return ""
	})
	// The root is the tree's: recomputed from the served tiles.
	if th, err := tlog.TreeHash(n, tlog.TileHashReader(tlog.Tree{N: n, Hash: root}, a)); err != nil || th != root {
		a.t.Errorf("tree hash of size %d from the tiles: %v %v, checkpoint says %v", n, th, err, root)
	}
	return n, root
}

// someReceipt is a decision receipt of the run as ClickHouse stores it,
// and its log index as ClickHouse records it.
func (a *auditor) someReceipt(ctx context.Context) (id string, index int64, stored []byte) {
	a.t.Helper()
	var ce string
	var idx uint64
	err := a.conn.QueryRow(ctx, "SELECT r.receipt_id, r.cloudevent, e.log_index FROM `"+a.db+"`.v_receipts AS r "+
		"ALL INNER JOIN `"+a.db+"`.v_log_entries AS e ON r.receipt_id = e.event_id WHERE r.kind = 'decision' ORDER BY r.time_ms DESC LIMIT 1").Scan(&id, &ce, &idx)
	if err != nil {
		a.t.Fatal(err)
	}
	return id, int64(idx), []byte(ce)
}

// entry reads entry i from the served entry bundles of a tree of size n
// (C2SP tlog-tiles: each entry a 16-bit big-endian length, then its bytes).
func (a *auditor) entry(i, n int64) []byte {
	a.t.Helper()
	tile := tlog.Tile{H: 8, L: 0, N: i / 256, W: 256}
	if end := (i/256 + 1) * 256; end > n {
		tile.W = int(n - i/256*256)
	}
	p := "/" + strings.Replace(tile.Path(), "tile/8/0/", "tile/entries/", 1)
	code, b := a.get(p)
	if code != http.StatusOK {
		a.t.Fatalf("GET %s: %d", p, code)
	}
	for k := int64(0); ; k++ {
		if len(b) < 2 {
			a.t.Fatalf("%s ends before entry %d", p, i)
		}
		l := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+l {
			a.t.Fatalf("%s: entry %d cut short", p, k)
		}
		if k == i%256 {
			return b[2 : 2+l]
		}
		b = b[2+l:]
	}
}
