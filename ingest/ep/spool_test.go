package ep_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// openOutbox is ep.OpenOutbox on dir, failing the test on an error.
func openOutbox(t *testing.T, dir string) *ep.Outbox {
	t.Helper()
	out, err := ep.OpenOutbox(slog.New(slog.DiscardHandler), dir)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// spooled is the names of the events waiting in dir (*.json).
func spooled(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// streamWithCalls is a NATS server with the Talos streams.
func streamWithCalls(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	return js
}

// storedCalls is the tool_call_ids TALOS_CALLS holds, oldest first, each
// checked to carry its Nats-Msg-Id.
func storedCalls(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var ids []string
	for _, m := range testenv.StreamMsgs(t, js, schemas.StreamCalls) {
		var c schemas.ToolCall
		if err := json.Unmarshal(m.Data, &c); err != nil {
			t.Fatal(err)
		}
		if got, want := m.Header.Get(jetstream.MsgIDHeader), schemas.CallMsgID(c.EPID, c.ToolCallID, c.Phase, m.Data); got != want {
			t.Fatalf("Nats-Msg-Id %q, want %q", got, want)
		}
		ids = append(ids, c.ToolCallID)
	}
	return ids
}

// TestOutboxSpoolReplaysInOrder: events sent to a spooled outbox that
// never reached NATS are on disk (0600 files in a 0700 directory) when
// Send returns and after Drain; a new outbox on the directory delivers
// them in their original order before one sent after it opened, each
// once, and removes each file once JetStream acknowledged it.
func TestOutboxSpoolReplaysInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	first := openOutbox(t, dir)
	var want []string
	for range 3 {
		p := outboxPost(t)
		first.Send(p)
		want = append(want, p.ToolCallID)
	}
	if first.Full() {
		t.Fatal("three spooled posts: Full")
	}
	files := spooled(t, dir)
	if len(files) != 3 {
		t.Fatalf("spool holds %d files after three sends, want 3", len(files))
	}
	for _, f := range append(files, dir) {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]os.FileMode{true: 0o700, false: 0o600}[st.IsDir()]; st.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, want %v", f, st.Mode().Perm(), want)
		}
	}
	if n := first.Drain(0); n != 3 {
		t.Fatalf("Drain without NATS: %d not delivered, want 3", n)
	}
	if n := len(spooled(t, dir)); n != 3 {
		t.Fatalf("spool holds %d files after Drain, want 3", n)
	}

	second := openOutbox(t, dir)
	late := outboxPost(t)
	second.Send(late)
	want = append(want, late.ToolCallID)
	js := streamWithCalls(t)
	second.Start(js)
	if n := second.Drain(10 * time.Second); n != 0 {
		t.Fatalf("%d events not delivered", n)
	}
	if got := storedCalls(t, js); !slices.Equal(got, want) {
		t.Fatalf("TALOS_CALLS holds %v, want %v (spooled first, in order)", got, want)
	}
	if left := spooled(t, dir); len(left) != 0 {
		t.Fatalf("files left in the spool after every ack: %v", left)
	}
}

// TestOutboxSpoolQuarantine: a spool left by a crash holds a good event,
// a file cut short, a temporary file cut short and a temporary file
// written whole (the crash came before its rename). The outbox starts,
// moves the two broken files to quarantine/ (kept, not deleted) and
// delivers the other two in their order.
func TestOutboxSpoolQuarantine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	prev := openOutbox(t, dir)
	good := outboxPost(t)
	prev.Send(good)
	prev.Drain(0)
	whole := outboxPost(t)
	raw, err := json.Marshal(whole)
	if err != nil {
		t.Fatal(err)
	}
	broken := map[string][]byte{
		"00000000000000000002.json": raw[:len(raw)/2],
		"00000000000000000003.tmp":  raw[:10],
	}
	files := map[string][]byte{"00000000000000000004.tmp": raw}
	for name, b := range broken {
		files[name] = b
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	out := openOutbox(t, dir)
	js := streamWithCalls(t)
	out.Start(js)
	if n := out.Drain(10 * time.Second); n != 0 {
		t.Fatalf("%d events not delivered", n)
	}
	if got, want := storedCalls(t, js), []string{good.ToolCallID, whole.ToolCallID}; !slices.Equal(got, want) {
		t.Fatalf("TALOS_CALLS holds %v, want %v", got, want)
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"lock", "quarantine"}) {
		t.Fatalf("spool after delivery holds %v, want only the lock and quarantine/", names)
	}
	q, err := os.ReadDir(filepath.Join(dir, "quarantine"))
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != len(broken) {
		t.Fatalf("quarantine holds %d files, want %d", len(q), len(broken))
	}
	for _, e := range q {
		b, err := os.ReadFile(filepath.Join(dir, "quarantine", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var orig []byte
		for name, o := range broken { // quarantined as <name>.<UTC time>
			if strings.HasPrefix(e.Name(), name+".") {
				orig = o
			}
		}
		if orig == nil || string(b) != string(orig) {
			t.Fatalf("quarantined %s does not hold a broken file as it was", e.Name())
		}
	}
}

// TestOutboxSpoolInUse: a second outbox on a spool another one holds is
// refused; once the first has drained, it opens.
func TestOutboxSpoolInUse(t *testing.T) {
	dir := t.TempDir()
	first := openOutbox(t, dir)
	if _, err := ep.OpenOutbox(slog.New(slog.DiscardHandler), dir); !errors.Is(err, ep.ErrSpoolInUse) {
		t.Fatalf("second OpenOutbox: %v, want ErrSpoolInUse", err)
	}
	first.Drain(0)
	openOutbox(t, dir).Drain(0)
}

// TestOutboxSpoolFailureIsFull: an event the spool cannot take (its
// directory is gone) is still delivered from memory, and the outbox is
// Full (no call taken) until it is.
func TestOutboxSpoolFailureIsFull(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	out := openOutbox(t, dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	post := outboxPost(t)
	out.Send(post)
	if !out.Full() {
		t.Fatal("an event the spool could not take: not Full")
	}
	js := streamWithCalls(t)
	out.Start(js)
	testenv.WaitFor(t, 10*time.Second, func() bool { return !out.Full() })
	if n := out.Drain(10 * time.Second); n != 0 {
		t.Fatalf("%d events not delivered", n)
	}
	if got := storedCalls(t, js); !slices.Equal(got, []string{post.ToolCallID}) {
		t.Fatalf("TALOS_CALLS holds %v", got)
	}
}

// TestOutboxSendsDirectWhileConnected: a started spooled outbox with
// nothing waiting has JetStream store a post before Send returns and
// writes no file: the spool's directory is gone, so a post spooled instead
// would leave the outbox Full.
func TestOutboxSendsDirectWhileConnected(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	out := openOutbox(t, dir)
	js := streamWithCalls(t)
	out.Start(js)
	defer out.Drain(10 * time.Second)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	var want []string
	for range 3 {
		post := outboxPost(t)
		out.Send(post)
		want = append(want, post.ToolCallID)
		if out.Full() {
			t.Fatal("Full after a Send while connected: the post went to the spool")
		}
		if got := storedCalls(t, js); !slices.Equal(got, want) {
			t.Fatalf("TALOS_CALLS holds %v when Send returns, want %v", got, want)
		}
	}
}
