package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// flakyWriter fails its first `fail` writes, then records what it gets.
// It stands in for ClickHouse only to test the sink's ack discipline; the
// pipeline tests use the real database.
type flakyWriter struct {
	mu      sync.Mutex
	fail    int
	calls   int
	written map[string]int
}

func (w *flakyWriter) Write(_ context.Context, recs []schemas.AuditRecord) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	if w.calls <= w.fail {
		return errors.New("database unavailable")
	}
	for _, r := range recs {
		w.written[string(r.Data)]++
	}
	return nil
}

func (w *flakyWriter) snapshot() (int, map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := make(map[string]int, len(w.written))
	for k, v := range w.written {
		m[k] = v
	}
	return w.calls, m
}

// TestSinkRetriesAndAcksOnlyAfterWrite: while the writer fails, nothing is
// acked and nothing is dropped; once it recovers every record is written
// and then acked.
func TestSinkRetriesAndAcksOnlyAfterWrite(t *testing.T) {
	ns := testenv.NATSForTest(t)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, schemas.ReceiptSubject("decision", "files"), []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	w := &flakyWriter{fail: 4, written: map[string]int{}}
	sink, err := ingest.NewSink(js, w, ingest.SinkOptions{BatchAge: 20 * time.Millisecond, RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sink.Run(ctx); close(done) }()

	// While the writer fails, the consumer must hold every record un-acked.
	deadline := time.Now().Add(10 * time.Second)
	for {
		calls, _ := w.snapshot()
		if calls >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sink never tried to write")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cons, err := js.Consumer(ctx, schemas.StreamAudit, "talos-sink")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(ctx); err != nil || info.AckFloor.Stream != 0 {
		t.Fatalf("acked before a successful write: ack floor %+v, err %v", info.AckFloor, err)
	}

	for {
		_, written := w.snapshot()
		if len(written) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records written", len(written), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not all acked after the write: %+v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	calls, written := w.snapshot()
	if calls <= w.fail {
		t.Fatalf("writer called %d times", calls)
	}
	for k, c := range written {
		if c != 1 {
			t.Fatalf("record %s written %d times", k, c)
		}
	}
}

// TestSinkBindsItsConsumerAgain: when the sink's durable consumer is
// deleted under it (an operator, or its stream recreated), the sink binds
// it again and writes what comes after, instead of stopping for good.
func TestSinkBindsItsConsumerAgain(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	w := &flakyWriter{written: map[string]int{}}
	sink, err := ingest.NewSink(js, w, ingest.SinkOptions{BatchAge: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sink.Run(ctx) }()
	publishAndWait := func(rec string) {
		t.Helper()
		if _, err := js.Publish(ctx, schemas.ReceiptSubject("decision", "files"), []byte(rec)); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		testenv.WaitFor(t, 10*time.Second, func() bool {
			_, written := w.snapshot()
			return written[rec] == 1
		})
		t.Logf("%s written after %v", rec, time.Since(began).Round(time.Millisecond))
	}
	publishAndWait(`{"n":1}`)
	if err := js.DeleteConsumer(ctx, schemas.StreamAudit, "talos-sink"); err != nil {
		t.Fatal(err)
	}
	publishAndWait(`{"n":2}`)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sink: %v", err)
	}
}

// batchLog records each batch the sink writes: when, and its records.
type batchLog struct {
	mu      sync.Mutex
	batches []loggedBatch
}

type loggedBatch struct {
	at   time.Time
	recs []string
}

func (w *batchLog) Write(_ context.Context, recs []schemas.AuditRecord) error {
	b := loggedBatch{at: time.Now()}
	for _, r := range recs {
		b.recs = append(b.recs, string(r.Data))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.batches = append(w.batches, b)
	return nil
}

func (w *batchLog) snapshot() []loggedBatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.batches)
}

// runSink runs a sink with o on a fresh stream set until the test ends.
func runSink(t *testing.T, o ingest.SinkOptions) (jetstream.JetStream, *batchLog) {
	t.Helper()
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithCancel(context.Background())
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	w := &batchLog{}
	sink, err := ingest.NewSink(js, w, o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sink.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return js, w
}

// TestSinkWritesABurstWhenItEnds: a burst is written as one batch once
// records stop coming, long before its batch age (an hour here) ends.
func TestSinkWritesABurstWhenItEnds(t *testing.T) {
	js, w := runSink(t, ingest.SinkOptions{BatchAge: time.Hour, BatchMinAge: 200 * time.Millisecond})
	const n = 30
	var futs []jetstream.PubAckFuture
	for i := range n {
		fut, err := js.PublishAsync(schemas.ReceiptSubject("decision", "files"), fmt.Appendf(nil, `{"n":%d}`, i))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, fut)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(w.snapshot()) > 0 })
	time.Sleep(300 * time.Millisecond) // a second batch, if the burst was split, is written by now
	if got := w.snapshot(); len(got) != 1 || len(got[0].recs) != n {
		sizes := make([]int, len(got))
		for i, b := range got {
			sizes[i] = len(b.recs)
		}
		t.Fatalf("the burst of %d records was written as batches of %v, want one", n, sizes)
	}
}

// TestSinkWritesNoBatchBeforeMinAge: records that come further apart than
// BatchPause are not each written alone: no batch is written before it is
// BatchMinAge old (counted from its first record's publish, which is
// earlier than its arrival).
func TestSinkWritesNoBatchBeforeMinAge(t *testing.T) {
	const minAge = 150 * time.Millisecond
	js, w := runSink(t, ingest.SinkOptions{BatchAge: time.Hour, BatchMinAge: minAge, BatchPause: 5 * time.Millisecond})
	ctx := context.Background()
	sent := map[string]time.Time{}
	for i := range 20 {
		rec := fmt.Sprintf(`{"n":%d}`, i)
		sent[rec] = time.Now()
		if _, err := js.Publish(ctx, schemas.ReceiptSubject("decision", "files"), []byte(rec)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool {
		n := 0
		for _, b := range w.snapshot() {
			n += len(b.recs)
		}
		return n == len(sent)
	})
	batches := w.snapshot()
	for _, b := range batches {
		if age := b.at.Sub(sent[b.recs[0]]); age < minAge {
			t.Errorf("a batch of %d records was written %v after its first was published, before BatchMinAge %v", len(b.recs), age, minAge)
		}
	}
	if len(batches) < 2 {
		t.Errorf("%d records over about 500 ms were written in %d batch, want one every BatchMinAge", len(sent), len(batches))
	}
}
