package ep_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

func outboxPost(t *testing.T) *schemas.ToolCall {
	t.Helper()
	pre, err := ep.NewCall("ep-outbox", "files", "read_file", map[string]any{"path": "a"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	post, err := ep.SignedPost(pre, nil, false, now, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	return post
}

// TestOutboxRetriesUntilStored: a post event queued while TALOS_CALLS does
// not exist yet is retried, and stored once (with its Nats-Msg-Id) when
// the stream appears; Drain then reports nothing left.
func TestOutboxRetriesUntilStored(t *testing.T) {
	_, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	out := ep.NewOutbox(slog.New(slog.DiscardHandler))
	out.Start(js)
	post := outboxPost(t)
	out.Send(post)
	time.Sleep(300 * time.Millisecond) // at least one failed attempt
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := out.Drain(10 * time.Second); n != 0 {
		t.Fatalf("%d post events not delivered", n)
	}
	s, err := js.Stream(ctx, schemas.StreamCalls)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, schemas.CallSubject(schemas.PhasePost, post.EPID, post.ServerID))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Header.Get(jetstream.MsgIDHeader), schemas.CallMsgID(post.EPID, post.ToolCallID, schemas.PhasePost, m.Data); got != want {
		t.Fatalf("Nats-Msg-Id %q, want %q", got, want)
	}
	var got schemas.ToolCall
	if err := json.Unmarshal(m.Data, &got); err != nil || got.ToolCallID != post.ToolCallID || got.Phase != schemas.PhasePost || got.Result != nil {
		t.Fatalf("stored %s (%v)", m.Data, err)
	}
}

// TestOutboxDrainGivesUp: with no stream to take them, Drain stops after
// its wait and counts what was not delivered; Full stays false below the
// limit.
func TestOutboxDrainGivesUp(t *testing.T) {
	_, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	out := ep.NewOutbox(slog.New(slog.DiscardHandler))
	out.Start(js)
	out.Send(outboxPost(t))
	out.Send(outboxPost(t))
	if out.Full() {
		t.Fatal("two posts: Full")
	}
	start := time.Now()
	if n := out.Drain(300 * time.Millisecond); n != 2 {
		t.Fatalf("Drain: %d not delivered, want 2", n)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("Drain took %s", d)
	}
}
