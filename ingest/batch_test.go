package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Batches: a chain takes whatever calls are waiting and decides them
// together. These tests pin what that must not break: a receipt publish
// that fails inside a batch, a duplicate inside a batch, and a worker that
// dies between storing a batch's receipts and acking its calls each leave
// exactly one receipt per call, every chain without a gap, and the database
// verifying clean.

// faultyJS is the worker's JetStream with a hook on every receipt publish
// (the n-th, counting from 1, with the publish's context); the hook may
// publish (or not) and return an error of its own.
type faultyJS struct {
	jetstream.JetStream
	mu   sync.Mutex
	n    int
	hook func(ctx context.Context, n int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error)
}

func (f *faultyJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	publish := func() (*jetstream.PubAck, error) { return f.JetStream.PublishMsg(ctx, msg, opts...) }
	if !strings.HasPrefix(msg.Subject, "talos.audit.receipt.") {
		return publish()
	}
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	return f.hook(ctx, n, publish)
}

// gate holds the first receipt publish until opened, so that the calls a
// test sends meanwhile wait in the worker and form batches.
type gate struct {
	once sync.Once
	ch   chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) wait(n int) {
	if n == 1 {
		<-g.ch
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// publishCalls publishes n calls of session to TALOS_CALLS without waiting
// for their decisions, and returns them.
func (s *stack) publishCalls(t *testing.T, session string, n int) []*schemas.ToolCall {
	t.Helper()
	calls := make([]*schemas.ToolCall, n)
	for i := range calls {
		c := newCall(t, "files", "list_directory", map[string]any{"path": fmt.Sprintf("dir-%d", i)})
		c.SessionID = session
		raw, _ := json.Marshal(c)
		if err := s.client.Publish(context.Background(), schemas.PhasePre, "files", c.ToolCallID, raw); err != nil {
			t.Fatal(err)
		}
		calls[i] = c
	}
	return calls
}

// decisions collects the decisions on talos.decision.test-ep until every
// call in want has one, and returns them by tool_call_id (the last one
// received for a call answered twice).
func collectDecisions(t *testing.T, sub *nats.Subscription, want []*schemas.ToolCall) map[string][]schemas.Decision {
	t.Helper()
	got := map[string][]schemas.Decision{}
	missing := map[string]bool{}
	for _, c := range want {
		missing[c.ToolCallID] = true
	}
	for len(missing) > 0 {
		m, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("%d calls without a decision: %v", len(missing), err)
		}
		var d schemas.Decision
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		got[d.ToolCallID] = append(got[d.ToolCallID], d)
		delete(missing, d.ToolCallID)
	}
	return got
}

// TestBatchPublishFailure: inside batches, one receipt publish fails before
// it reaches the stream and another is stored but its acknowledgement is
// lost. Each is retried with the same bytes; nothing after it in the chain
// is sealed before it is stored.
func TestBatchPublishFailure(t *testing.T) {
	g := newGate()
	var failed, lost sync.Once
	fired := make(chan string, 2)
	s := newStack(t, stackOptions{maxBatch: 16, workerJS: func(js jetstream.JetStream, _ *nats.Conn) jetstream.JetStream {
		return &faultyJS{JetStream: js, hook: func(_ context.Context, n int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
			g.wait(n)
			switch n {
			case 4:
				var err error
				failed.Do(func() { err = errors.New("injected: publish failed before the stream"); fired <- "failed" })
				if err != nil {
					return nil, err
				}
			case 9:
				if _, err := publish(); err != nil {
					return nil, err
				}
				var err error
				lost.Do(func() { err = errors.New("injected: acknowledgement lost"); fired <- "lost" })
				if err != nil {
					return nil, err
				}
			}
			return publish()
		}}
	}})
	sub, err := s.nc.SubscribeSync(schemas.DecisionSubjects("test-ep"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	calls := s.publishCalls(t, "batch-fail", n)
	time.Sleep(200 * time.Millisecond) // the calls wait behind the gate
	g.open()
	got := collectDecisions(t, sub, calls)
	for _, c := range calls {
		for _, d := range got[c.ToolCallID] {
			if d.Decision != schemas.DecisionAllow || d.ReceiptID == "" {
				t.Fatalf("call %s: %s %v receipt %q", c.ToolCallID, d.Decision, d.ReasonCodes, d.ReceiptID)
			}
		}
	}
	if len(fired) != 2 {
		t.Fatalf("%d of 2 faults were injected", len(fired))
	}
	s.checkExactlyOnce(t, "batch-fail", n)
}

// TestBatchDuplicateInside: a call whose receipt is already stored comes
// back inside a batch of new calls (the same envelope published again). It
// is answered with the stored receipt and takes no link; the calls after it
// in the batch are chained as if it were not there.
func TestBatchDuplicateInside(t *testing.T) {
	g := newGate()
	armed := make(chan struct{})
	var once sync.Once
	s := newStack(t, stackOptions{maxBatch: 16, workerJS: func(js jetstream.JetStream, _ *nats.Conn) jetstream.JetStream {
		return &faultyJS{JetStream: js, hook: func(_ context.Context, n int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
			select {
			case <-armed:
				// The gate applies from the first publish after arming.
				once.Do(func() { <-g.ch })
			default:
			}
			return publish()
		}}
	}})
	sub, err := s.nc.SubscribeSync(schemas.DecisionSubjects("test-ep"))
	if err != nil {
		t.Fatal(err)
	}
	first := newCall(t, "files", "list_directory", map[string]any{"path": "first"})
	first.SessionID = "batch-dup"
	d0 := s.call(t, first)
	close(armed)
	// A decoy takes the gate, so the calls behind it gather into batches.
	before := s.publishCalls(t, "batch-dup", 5)
	time.Sleep(100 * time.Millisecond)
	raw, _ := json.Marshal(first)
	// Without a Nats-Msg-Id: TALOS_CALLS keeps this second copy.
	if _, err := s.js.Publish(context.Background(), schemas.CallSubject("pre", "test-ep", "files"), raw); err != nil {
		t.Fatal(err)
	}
	after := s.publishCalls(t, "batch-dup", 5)
	time.Sleep(200 * time.Millisecond)
	g.open()
	got := collectDecisions(t, sub, append(append(before, first), after...))
	for _, d := range got[first.ToolCallID] {
		if d.ReceiptID != d0.ReceiptID || d.Decision != d0.Decision {
			t.Fatalf("the duplicate was answered %s/%s, the stored receipt is %s/%s", d.Decision, d.ReceiptID, d0.Decision, d0.ReceiptID)
		}
	}
	s.checkExactlyOnce(t, "batch-dup", 11)
}

// TestBatchWorkerDiesBetweenPublishAndAck: a worker stores the receipts of
// a batch and loses its connection before it answers or acks any of them
// (as if killed there). Another worker gets the calls again after AckWait,
// finds their receipts stored, answers with them, and adds no link of its
// own for them.
func TestBatchWorkerDiesBetweenPublishAndAck(t *testing.T) {
	s := newStack(t, stackOptions{noWorker: true})
	sub, err := s.nc.SubscribeSync(schemas.DecisionSubjects("test-ep"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	calls := s.publishCalls(t, "batch-kill", n)
	// The first worker takes them all as one batch and stores every
	// receipt; at the last publish its connection is cut before the
	// stream's acknowledgement reaches it.
	o := s.workerOpts
	o.MaxBatch = n
	o.Chains = []*receipts.Chain{receipts.NewChain("dying", s.key)}
	var dead sync.Once
	killed := make(chan struct{})
	s.startWorker(t, o, func(js jetstream.JetStream, nc *nats.Conn) jetstream.JetStream {
		return &faultyJS{JetStream: js, hook: func(_ context.Context, k int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
			ack, err := publish()
			if k == n {
				dead.Do(func() { nc.Close(); close(killed) })
				return nil, errors.New("injected: connection lost")
			}
			return ack, err
		}}
	})
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("the first worker never stored the batch")
	}
	audit, err := s.js.Stream(context.Background(), schemas.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := audit.Info(context.Background(), jetstream.WithSubjectFilter("talos.audit.receipt.>"))
	if err != nil {
		t.Fatal(err)
	}
	// State.Msgs counts the whole stream (a checkpoint the worker cut
	// meanwhile too); the filter fills State.Subjects.
	var stored uint64
	for _, k := range info.State.Subjects {
		stored += k
	}
	if stored != n {
		t.Fatalf("%d receipts stored before the cut, want %d", stored, n)
	}
	// The second worker is another process: chains of its own.
	o2 := s.workerOpts
	o2.Chains = []*receipts.Chain{receipts.NewChain("second-a", s.key), receipts.NewChain("second-b", s.key)}
	s.startWorker(t, o2, nil)
	got := collectDecisions(t, sub, calls)
	if len(got) != n {
		t.Fatalf("%d calls answered, want %d", len(got), n)
	}
	s.checkExactlyOnce(t, "batch-kill", n)
}

// TestWorkerStopCutsAReceiptShort: a worker is stopped while a receipt it
// published is stored but never acknowledged, and the publish is still
// unanswered when its drain ends. Its chain then gets no final checkpoint
// (one would claim the chain ends before the receipt the stream holds);
// another worker decides the rest, the stored receipt stands for its call,
// and the database verifies.
func TestWorkerStopCutsAReceiptShort(t *testing.T) {
	s := newStack(t, stackOptions{noWorker: true})
	o := s.workerOpts
	o.Chains = []*receipts.Chain{receipts.NewChain("test-stop", s.key)}
	o.PublishTimeout = 200 * time.Millisecond
	stuck := make(chan struct{})
	// The third receipt is stored but never acknowledged: that publish
	// and every later one wait for their context to end, as a stream
	// that stops answering in the middle of a stop would.
	stop := s.startWorker(t, o, func(js jetstream.JetStream, _ *nats.Conn) jetstream.JetStream {
		return &faultyJS{JetStream: js, hook: func(ctx context.Context, n int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
			switch {
			case n < 3:
				return publish()
			case n == 3:
				if _, err := publish(); err != nil {
					return nil, err
				}
				close(stuck)
			}
			<-ctx.Done()
			return nil, ctx.Err()
		}}
	})
	const n = 10
	s.publishCalls(t, "stop-cut", n)
	select {
	case <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the third receipt was never published")
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not stop")
	}
	s.startWorker(t, s.workerOpts, nil)
	s.checkExactlyOnce(t, "stop-cut", n)
}
