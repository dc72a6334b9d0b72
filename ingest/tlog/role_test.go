package tlog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// bench is one embedded NATS with the three streams, and a log directory
// with its key.
type bench struct {
	js  jetstream.JetStream
	dir string
	key *Key
	// sent is every record published, in stream order, with what the log
	// should make of it.
	sent []sentRecord
}

type sentRecord struct {
	subject string
	data    []byte
}

func newBench(t *testing.T) *bench {
	t.Helper()
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, err := LoadOrCreateKey(filepath.Join(dir, "keys", "log.key"), "audit.example.com/talos", true)
	if err != nil {
		t.Fatal(err)
	}
	return &bench{js: js, dir: filepath.Join(dir, "tlog"), key: key}
}

// publish stores n records in TALOS_AUDIT, alternating receipts and
// ToolCallEvents, with a per-chain checkpoint (which the log must not
// take) every tenth.
func (b *bench) publish(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range n {
		i := len(b.sent)
		subject := "talos.audit.receipt.decision.files"
		if i%2 == 1 {
			subject = "talos.audit.toolcall.files"
		}
		data := fmt.Appendf(nil, `{"data":{"n":%d},"id":"0190a3f0-0000-7000-8000-%012d","type":"dev.talos.test"}`, i, i)
		b.raw(ctx, t, subject, data)
		if i%10 == 9 {
			if _, err := b.js.Publish(ctx, "talos.audit.checkpoint.chain-1", fmt.Appendf(nil, `{"id":"cp-%d"}`, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// raw publishes one record as it is, with no Nats-Msg-Id: a copy
// published again is stored again, as one published after the stream's
// duplicate window would be.
func (b *bench) raw(ctx context.Context, t *testing.T, subject string, data []byte) {
	t.Helper()
	if _, err := b.js.Publish(ctx, subject, data); err != nil {
		t.Fatal(err)
	}
	b.sent = append(b.sent, sentRecord{subject, data})
}

// start opens the log and runs a role over it; done reports Run's result.
func (b *bench) start(t *testing.T, o RoleOptions) (l *Log, r *Role, done chan error, cancel func()) {
	t.Helper()
	l, err := Open(Options{Dir: b.dir, Key: b.key, CheckpointInterval: 100 * time.Millisecond, BatchAge: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r, err = NewRole(b.js, l, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return l, r, done, stop
}

// checkLog asserts that the log holds each distinct record sent exactly
// once, in the order of its first copy in the stream, and that the index
// records TALOS_AUDIT holds point every event at its entry.
func (b *bench) checkLog(t *testing.T, l *Log) {
	t.Helper()
	var want [][32]byte
	seen := map[[32]byte]uint64{}
	for _, s := range b.sent {
		entry, _ := EntryOf(s.subject, s.data)
		h := LeafHash(entry)
		if _, dup := seen[h]; !dup {
			seen[h] = uint64(len(want))
			want = append(want, h)
		}
	}
	ctx := context.Background()
	size, err := l.Size(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if size != uint64(len(want)) {
		t.Fatalf("log size %d, want %d (distinct records sent)", size, len(want))
	}
	err = l.LeafHashes(ctx, 0, size, func(i uint64, h [32]byte) {
		if h != want[i] {
			t.Errorf("entry %d is not the %d-th distinct record of the stream", i, i)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	announced := map[string]uint64{}
	for _, m := range testenv.StreamMsgs(t, b.js, schemas.StreamAudit) {
		if m.Subject != schemas.SubjectLogIndex {
			continue
		}
		var batch schemas.LogIndexBatch
		if err := json.Unmarshal(m.Data, &batch); err != nil {
			t.Fatal(err)
		}
		for _, e := range batch.Entries {
			h, _ := hex.DecodeString(e.LeafHash)
			if i, ok := seen[[32]byte(h)]; !ok || i != e.LogIndex {
				t.Errorf("index record puts %s at %d; the log has it at %d (known %v)", e.EventID, e.LogIndex, i, ok)
			}
			announced[e.EventID] = e.LogIndex
		}
	}
	for _, s := range b.sent {
		if _, ok := announced[EventID(s.data)]; !ok {
			t.Errorf("no index record names %s", EventID(s.data))
		}
	}
}

func waitSize(t *testing.T, r *Role, n int) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, func() bool { return r.Size() >= uint64(n) })
}

// TestRoleAppendsEachRecordOnce: receipts and ToolCallEvents are appended
// in stream order, checkpoints are not, and a record stored twice in the
// stream (published again after the duplicate window) is appended once
// and announced at its first index.
func TestRoleAppendsEachRecordOnce(t *testing.T) {
	b := newBench(t)
	b.publish(t, 120)
	ctx := context.Background()
	again := b.sent[7]
	b.raw(ctx, t, again.subject, again.data)
	// Larger than a tile entry may be: logged as its stand-in.
	big := fmt.Appendf(nil, `{"data":{"payload":"%s"},"id":"0190a3f0-0000-7000-8000-big000000000","type":"dev.talos.test"}`, strings.Repeat("x", MaxEntryBytes))
	b.raw(ctx, t, "talos.audit.toolcall.files", big)
	l, r, done, stop := b.start(t, RoleOptions{FetchMax: 32})
	waitSize(t, r, 121)
	b.publish(t, 30)
	b.raw(ctx, t, again.subject, again.data) // again, across batches
	waitSize(t, r, 151)
	testenv.WaitFor(t, 10*time.Second, func() bool { return r.StreamSeq() == lastSeq(t, b.js) })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.Duplicates() != 2 || r.Appended() != 151 {
		t.Errorf("appended %d, duplicates %d; want 151 and 2", r.Appended(), r.Duplicates())
	}
	if err := l.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b.checkLog(t, l)
	// The stand-in names the record and its digest; its entry is in the
	// bundle, and its index record says it stands in.
	want := OversizeEntry("talos.audit.toolcall.files", "0190a3f0-0000-7000-8000-big000000000", big)
	sum := sha256.Sum256(big)
	if !bytes.Contains(want, []byte(hex.EncodeToString(sum[:]))) || !bytes.Contains(want, fmt.Appendf(nil, `"size":%d,`, len(big))) {
		t.Errorf("stand-in %s", want)
	}
	found := false
	for _, m := range testenv.StreamMsgs(t, b.js, schemas.StreamAudit) {
		if m.Subject == schemas.SubjectLogIndex && bytes.Contains(m.Data, []byte(`"event_id":"0190a3f0-0000-7000-8000-big000000000"`)) {
			found = bytes.Contains(m.Data, []byte(`"leaf_hash":"`+hex.EncodeToString(func() []byte { h := LeafHash(want); return h[:] }())+`","subject":"talos.audit.toolcall.files","stream_seq":`)) &&
				bytes.Contains(m.Data, []byte(`"oversize":true`))
		}
	}
	if !found {
		t.Error("no index record announces the oversize record's stand-in")
	}
}

func lastSeq(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	var last uint64
	for _, m := range testenv.StreamMsgs(t, js, schemas.StreamAudit) {
		for _, s := range LoggedSubjects {
			if len(m.Subject) >= len(s)-1 && m.Subject[:len(s)-1] == s[:len(s)-1] {
				last = m.Sequence
			}
		}
	}
	return last
}

// TestRoleKilledBetweenAppendAndAck: the role dies after a batch is
// integrated and before it is acked — before announcing it, before moving
// its cursor, or before acking — and a new one starts on the same log.
// Nothing is appended twice and nothing is missed; the records the dead
// role appended but did not account for are found in the log, not
// appended again.
func TestRoleKilledBetweenAppendAndAck(t *testing.T) {
	for _, tc := range []struct {
		stage      string
		duplicates bool // the new role reads the dead one's last batch again
	}{
		{"appended", true},
		{"announced", true},
		{"cursor", false},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			b := newBench(t)
			b.publish(t, 100)
			batches := 0
			died := errors.New("killed")
			crash := func(stage string) error {
				if stage == tc.stage {
					if batches++; batches == 2 {
						return died
					}
				}
				return nil
			}
			l, r, done, stop := b.start(t, RoleOptions{FetchMax: 30, crash: crash})
			if err := <-done; !errors.Is(err, died) {
				t.Fatalf("Run: %v", err)
			}
			stop()
			l.abandon()
			if r.Size() != 60 {
				t.Fatalf("the dead role integrated %d entries, want 60", r.Size())
			}
			b.publish(t, 50)
			l, r, done, stop = b.start(t, RoleOptions{FetchMax: 30})
			waitSize(t, r, 150)
			testenv.WaitFor(t, 10*time.Second, func() bool { return r.StreamSeq() == lastSeq(t, b.js) })
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := l.Close(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			if got := r.Duplicates() > 0; got != tc.duplicates {
				t.Errorf("the new role found %d records already in the log; want some: %v", r.Duplicates(), tc.duplicates)
			}
			if r.Appended() != 90 {
				t.Errorf("the new role appended %d, want 90", r.Appended())
			}
			b.checkLog(t, l)
		})
	}
}
