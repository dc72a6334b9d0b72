package ingest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
)

// hangingJS stores the third receipt the worker publishes but never
// acknowledges it: that publish and every later receipt publish wait for
// their context to end, as a stream that stops answering in the middle of
// a stop would.
type hangingJS struct {
	jetstream.JetStream
	mu    sync.Mutex
	n     int
	stuck chan struct{} // closed once the third receipt is stored
}

func (h *hangingJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if !strings.HasPrefix(msg.Subject, "talos.audit.receipt.") {
		return h.JetStream.PublishMsg(ctx, msg, opts...)
	}
	h.mu.Lock()
	h.n++
	n := h.n
	h.mu.Unlock()
	switch {
	case n < 3:
		return h.JetStream.PublishMsg(ctx, msg, opts...)
	case n == 3:
		if _, err := h.JetStream.PublishMsg(ctx, msg, opts...); err != nil {
			return nil, err
		}
		close(h.stuck)
	}
	<-ctx.Done()
	return nil, ctx.Err()
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
	h := &hangingJS{stuck: make(chan struct{})}
	nc, err := nats.Connect(s.natsURL, s.natsOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if h.JetStream, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	w, err := ingest.NewWorker(nc, h, s.dec, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = w.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })

	const n = 10
	s.publishCalls(t, "stop-cut", n)
	select {
	case <-h.stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the third receipt was never published")
	}
	cancel()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not stop")
	}
	s.startWorker(t, s.workerOpts, nil)
	s.checkExactlyOnce(t, "stop-cut", n)
}
