package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Batches: a lane takes whatever calls are waiting, decides them together
// and publishes their receipts together, each into a chain of its own.
// These tests pin what that must not break: a receipt publish
// that fails inside a batch, a duplicate inside a batch, and a worker that
// dies between storing a batch's receipts and acking its calls each leave
// exactly one receipt per call, every chain without a gap, and the database
// verifying clean.

// faultyJS is the worker's JetStream with a hook on every receipt publish,
// with or without waiting (the n-th, counting from 1, with the publish's
// context); the hook may
// publish (or not) and return an error of its own.
type faultyJS struct {
	jetstream.JetStream
	mu   sync.Mutex
	n    int
	hook func(ctx context.Context, n int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error)
	// events, if set, is called after each ToolCallEvent publish (the
	// n-th) with its future.
	events func(n int, fut jetstream.PubAckFuture)
	nev    int
}

func (f *faultyJS) PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if strings.HasPrefix(msg.Subject, "talos.audit.receipt.") {
		// A batch's receipts are published without waiting: the hook runs
		// here, in order, and its outcome is the future's.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ack, err := f.PublishMsg(ctx, msg, opts...)
		return doneFuture(msg, ack, err), nil
	}
	fut, err := f.JetStream.PublishMsgAsync(msg, opts...)
	if err != nil || f.events == nil || !strings.HasPrefix(msg.Subject, schemas.SubjectToolCall) {
		return fut, err
	}
	f.mu.Lock()
	f.nev++
	n := f.nev
	f.mu.Unlock()
	f.events(n, fut)
	return fut, nil
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

// doneFuture is a future already settled with ack or err.
func doneFuture(msg *nats.Msg, ack *jetstream.PubAck, err error) jetstream.PubAckFuture {
	f := &settled{msg: msg, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	if err != nil {
		f.err <- err
	} else {
		f.ok <- ack
	}
	return f
}

type settled struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *settled) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *settled) Err() <-chan error            { return f.err }
func (f *settled) Msg() *nats.Msg               { return f.msg }

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
	// The calls that waited behind the gate were taken as batches, each
	// receipt of a batch into a chain of its own.
	if chains := s.receiptChains(t); len(chains) <= 2 {
		t.Fatalf("%d receipts in %d chains: no batch spread its receipts over its lane", n, len(chains))
	}
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
	const n = 12
	var calls []*schemas.ToolCall
	for i := range n {
		c := newCall(t, "files", "list_directory", map[string]any{"path": fmt.Sprintf("dir-%d", i)})
		c.SessionID = "batch-kill"
		calls = append(calls, c)
	}
	sub := s.dieBetweenPublishAndAck(t, calls, false)
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

// TestRedeliveryAfterDuplicateWindow: the calls whose evidence a dead
// worker stored are redelivered only after TALOS_AUDIT has forgotten
// their Nats-Msg-Id (no worker ran for longer than the window, as after a
// single-node talosd's crash and a slow restart). The stream's duplicate
// check no longer stops a second receipt or ToolCallEvent, so the worker
// finds the stored ones itself: each call still has exactly one receipt,
// answered as stored, and one event, and every chain verifies. The worker
// dies once its receipts are stored, or once its events are too; a lookup
// that fails leaves its calls for a retry rather than store them blind;
// and a call stored in TALOS_CALLS a second time, that late, is answered
// as stored too.
func TestRedeliveryAfterDuplicateWindow(t *testing.T) {
	for _, tc := range []struct {
		name       string
		afterEvent bool
		lookupFail bool
	}{{"receipts stored", false, false}, {"receipts and events stored", true, false}, {"lookup fails once", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			const window = time.Second
			red, err := redact.New(redact.Config{Key: []byte(strings.Repeat("k", 32)), KeyID: "test"})
			if err != nil {
				t.Fatal(err)
			}
			s := newStack(t, stackOptions{noWorker: true, duplicateWindow: window,
				configure: func(t *testing.T, js jetstream.JetStream, o *enforce.DeciderOptions) {
					ledger := newLedger(t, js)
					o.Ledger, o.Redactor = ledger, red
				}})
			const n = 12
			// Half the calls are denied, so their ToolCallEvents are
			// stored with their receipts.
			session := strings.ReplaceAll(tc.name, " ", "-")
			var calls []*schemas.ToolCall
			for i := range n {
				tool := "list_directory"
				if i%2 == 1 {
					tool = "no_such_tool"
				}
				c := newCall(t, "files", tool, map[string]any{"path": fmt.Sprintf("dir-%d", i)})
				c.SessionID = session
				calls = append(calls, c)
			}
			sub := s.dieBetweenPublishAndAck(t, calls, tc.afterEvent)
			stored := s.storedReceipts(t)
			if tc.afterEvent {
				if k := countEvents(t, s); k != n/2 {
					t.Fatalf("%d ToolCallEvents stored before the cut, want %d", k, n/2)
				}
			}
			time.Sleep(3 * window) // the stream purges ids a window old, checking every window
			o2 := s.workerOpts
			o2.Chains = []*receipts.Chain{receipts.NewChain("late-a", s.key), receipts.NewChain("late-b", s.key)}
			var wrap func(jetstream.JetStream, *nats.Conn) jetstream.JetStream
			lookups := &auditLookups{failFirst: true}
			if tc.lookupFail {
				wrap = func(js jetstream.JetStream, _ *nats.Conn) jetstream.JetStream {
					lookups.JetStream = js
					return lookups
				}
			}
			s.startWorker(t, o2, wrap)
			got := collectDecisions(t, sub, calls)
			for id, ds := range got {
				if d := ds[len(ds)-1]; stored[d.ReceiptID] == 0 {
					t.Errorf("call %s answered with receipt %s, not the one the dead worker stored", id, d.ReceiptID)
				}
			}
			s.checkExactlyOnce(t, session, n)
			for id, k := range s.storedReceipts(t) {
				if k != 1 || stored[id] != 1 {
					t.Errorf("receipt %s is in TALOS_AUDIT %d times, want once", id, k)
				}
			}
			if k := countEvents(t, s); k != n/2 {
				t.Errorf("%d ToolCallEvents in TALOS_AUDIT, want %d", k, n/2)
			}
			if tc.lookupFail && lookups.consumers.Load() == 0 {
				t.Error("no lookup failed")
			}
			// The same call stored in TALOS_CALLS again (another
			// Nats-Msg-Id) is a first delivery, but its claim is old: it
			// is looked up too.
			raw, err := json.Marshal(calls[0])
			if err != nil {
				t.Fatal(err)
			}
			again := &nats.Msg{Subject: schemas.CallSubject(schemas.PhasePre, "test-ep", "files"), Data: raw, Header: nats.Header{}}
			again.Header.Set(jetstream.MsgIDHeader, "again")
			if _, err := s.js.PublishMsg(context.Background(), again); err != nil {
				t.Fatal(err)
			}
			if d := collectDecisions(t, sub, calls[:1])[calls[0].ToolCallID]; stored[d[len(d)-1].ReceiptID] == 0 {
				t.Errorf("the call stored again was answered with receipt %s, not the stored one", d[len(d)-1].ReceiptID)
			}
			for id, k := range s.storedReceipts(t) {
				if k != 1 {
					t.Errorf("after the call was stored again, receipt %s is in TALOS_AUDIT %d times", id, k)
				}
			}
		})
	}
}

// auditLookups is a worker's JetStream that counts the consumers of
// TALOS_AUDIT it creates; with failFirst, the first cannot be created.
type auditLookups struct {
	jetstream.JetStream
	failFirst bool
	consumers atomic.Int64
}

func (l *auditLookups) OrderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	if stream == schemas.StreamAudit && l.consumers.Add(1) == 1 && l.failFirst {
		return nil, errors.New("injected: no consumer")
	}
	return l.JetStream.OrderedConsumer(ctx, stream, cfg)
}

// TestLateFirstClaimIsNotLookedUp: calls the ledger refused to claim until
// they were older than the duplicate window were delivered many times but
// never sealed, so the worker does not look them up (a ledger outage
// would otherwise make every batch after it scan TALOS_AUDIT): no consumer
// of TALOS_AUDIT is created, and each call gets one receipt.
func TestLateFirstClaimIsNotLookedUp(t *testing.T) {
	const window = time.Second
	var down atomic.Bool
	down.Store(true)
	s := newStack(t, stackOptions{noWorker: true, duplicateWindow: window,
		configure: func(t *testing.T, js jetstream.JetStream, o *enforce.DeciderOptions) {
			ledger := newLedger(t, js)
			o.Ledger = &refusingLedger{CallLedger: ledger, down: &down}
		}})
	sub, err := s.nc.SubscribeSync(schemas.DecisionSubjects("test-ep"))
	if err != nil {
		t.Fatal(err)
	}
	counted := &auditLookups{}
	s.startWorker(t, s.workerOpts, func(js jetstream.JetStream, _ *nats.Conn) jetstream.JetStream {
		counted.JetStream = js
		return counted
	})
	const n = 8
	calls := s.publishCalls(t, "late-first-claim", n)
	time.Sleep(3 * window) // delivered and nak'ed meanwhile, each about once a second
	down.Store(false)
	collectDecisions(t, sub, calls)
	s.checkExactlyOnce(t, "late-first-claim", n)
	for id, k := range s.storedReceipts(t) {
		if k != 1 {
			t.Errorf("receipt %s is in TALOS_AUDIT %d times, want once", id, k)
		}
	}
	if k := counted.consumers.Load(); k != 0 {
		t.Errorf("%d lookups in TALOS_AUDIT for calls never sealed before", k)
	}
}

// refusingLedger fails every operation while down is set.
type refusingLedger struct {
	enforce.CallLedger
	down *atomic.Bool
}

func (l *refusingLedger) Do(ops []*enforce.LedgerOp) {
	if !l.down.Load() {
		l.CallLedger.Do(ops)
		return
	}
	for _, op := range ops {
		op.Err = errors.New("injected: ledger down")
	}
}

// dieBetweenPublishAndAck publishes calls, which one worker takes as one
// batch: it stores every receipt, and at the last receipt publish (or,
// with afterEvents, once the last ToolCallEvent is stored) its connection
// is cut before it acks any call. It returns a subscription to the calls'
// decisions.
func (s *stack) dieBetweenPublishAndAck(t *testing.T, calls []*schemas.ToolCall, afterEvents bool) *nats.Subscription {
	t.Helper()
	sub, err := s.nc.SubscribeSync(schemas.DecisionSubjects("test-ep"))
	if err != nil {
		t.Fatal(err)
	}
	n := len(calls)
	for _, c := range calls {
		raw, _ := json.Marshal(c)
		if err := s.client.Publish(context.Background(), schemas.PhasePre, c.ServerID, c.ToolCallID, raw); err != nil {
			t.Fatal(err)
		}
	}
	o := s.workerOpts
	o.MaxBatch = n
	o.Chains = nil
	for i := range n {
		o.Chains = append(o.Chains, receipts.NewChain(fmt.Sprintf("dying-%d", i), s.key))
	}
	var dead sync.Once
	killed := make(chan struct{})
	s.startWorker(t, o, func(js jetstream.JetStream, nc *nats.Conn) jetstream.JetStream {
		f := &faultyJS{JetStream: js, hook: func(_ context.Context, k int, publish func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
			ack, err := publish()
			if k == n && !afterEvents {
				dead.Do(func() { nc.Close(); close(killed) })
				return nil, errors.New("injected: connection lost")
			}
			return ack, err
		}}
		if afterEvents {
			f.events = func(k int, fut jetstream.PubAckFuture) {
				if k == n/2 {
					<-fut.Ok()
					dead.Do(func() { nc.Close(); close(killed) })
				}
			}
		}
		return f
	})
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("the first worker never stored the batch")
	}
	total := 0
	for _, k := range s.storedReceipts(t) {
		total += k
	}
	if total != n {
		t.Fatalf("%d receipts stored before the cut, want %d", total, n)
	}
	return sub
}

// countEvents is how many ToolCallEvents TALOS_AUDIT holds.
func countEvents(t *testing.T, s *stack) uint64 {
	t.Helper()
	audit, err := s.js.Stream(context.Background(), schemas.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := audit.Info(context.Background(), jetstream.WithSubjectFilter(schemas.SubjectToolCall+">"))
	if err != nil {
		t.Fatal(err)
	}
	var k uint64
	for _, c := range info.State.Subjects {
		k += c
	}
	return k
}

// storedReceipts returns how many times each receipt id is in TALOS_AUDIT
// (which holds some).
func (s *stack) storedReceipts(t *testing.T) map[string]int {
	t.Helper()
	ids := map[string]int{}
	s.scanReceipts(t, func(id, _ string) { ids[id]++ })
	return ids
}

// receiptChains returns how many receipts each chain has in TALOS_AUDIT.
func (s *stack) receiptChains(t *testing.T) map[string]int {
	t.Helper()
	chains := map[string]int{}
	s.scanReceipts(t, func(_, chainID string) { chains[chainID]++ })
	return chains
}

// scanReceipts calls each with the id and chain id of every receipt in
// TALOS_AUDIT.
func (s *stack) scanReceipts(t *testing.T, each func(id, chainID string)) {
	t.Helper()
	_, err := ordered.Scan(context.Background(), s.js, schemas.StreamAudit,
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{"talos.audit.receipt.>"}}, 5*time.Second,
		func(m jetstream.Msg, _ *jetstream.MsgMetadata) bool {
			var ev struct {
				ID   string `json:"id"`
				Data struct {
					Chain schemas.Chain `json:"chain"`
				} `json:"data"`
			}
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Error(err)
			}
			each(ev.ID, ev.Data.Chain.ChainID)
			return true
		})
	if err != nil {
		t.Fatal(err)
	}
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
