package control_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// heartbeatSub subscribes to one worker's heartbeats on a separate
// connection (as the control service would).
func heartbeatSub(t testing.TB, url, workerID string) chan *nats.Msg {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ch := make(chan *nats.Msg, 4096)
	if _, err := nc.ChanSubscribe(schemas.StatusSubject(workerID), ch); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

func nextStatus(t testing.TB, ch chan *nats.Msg) schemas.WorkerStatus {
	t.Helper()
	select {
	case m := <-ch:
		var st schemas.WorkerStatus
		if err := json.Unmarshal(m.Data, &st); err != nil {
			t.Fatalf("heartbeat %s: %v", m.Data, err)
		}
		return st
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat")
	}
	panic("unreachable")
}

// runHeartbeat starts h.Run and stops it when the test ends.
func runHeartbeat(t testing.TB, h *control.Heartbeat) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func heartbeatConn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestHeartbeatPeriodic(t *testing.T) {
	ns := testenv.NATSForTest(t)
	ch := heartbeatSub(t, ns.URL(), "worker-1")
	now := time.Date(2030, 5, 6, 7, 8, 9, 123e6, time.UTC)
	h, err := control.NewHeartbeat(heartbeatConn(t, ns.URL()), control.HeartbeatOptions{
		WorkerID: "worker-1",
		Interval: 50 * time.Millisecond,
		Status: func() schemas.WorkerStatus {
			return schemas.WorkerStatus{Instance: "talosd-a", AppliedSeq: 7, ControlLast: 9, CaughtUp: true}
		},
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	runHeartbeat(t, h)
	for i := 0; i < 5; i++ {
		st := nextStatus(t, ch)
		want := schemas.WorkerStatus{WorkerID: "worker-1", Instance: "talosd-a", AppliedSeq: 7, ControlLast: 9,
			CaughtUp: true, Time: "2030-05-06T07:08:09.123Z", IntervalMS: 50}
		if st != want {
			t.Fatalf("heartbeat %d: %+v, want %+v", i, st, want)
		}
	}
	// The first is immediate, the next four one interval apart each.
	if el := time.Since(start); el < 4*50*time.Millisecond*9/10 {
		t.Fatalf("5 heartbeats in %v: not periodic at 50 ms", el)
	}
	waitPublished(t, h, func(n uint64) bool { return n >= 5 })
}

// waitPublished waits for h.Published to satisfy ok: the counter moves
// just after the publish, so a subscriber may see a heartbeat first.
func waitPublished(t testing.TB, h *control.Heartbeat, ok func(uint64) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(h.Published()) {
		if time.Now().After(deadline) {
			t.Fatalf("published %d", h.Published())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestHeartbeatKeepsStatusFields(t *testing.T) {
	ns := testenv.NATSForTest(t)
	ch := heartbeatSub(t, ns.URL(), "worker-2")
	h, err := control.NewHeartbeat(heartbeatConn(t, ns.URL()), control.HeartbeatOptions{
		WorkerID: "worker-2",
		Status: func() schemas.WorkerStatus {
			return schemas.WorkerStatus{WorkerID: "worker-2", Time: "2030-01-01T00:00:00.000Z", IntervalMS: 3000}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runHeartbeat(t, h)
	st := nextStatus(t, ch)
	if st.Time != "2030-01-01T00:00:00.000Z" || st.IntervalMS != 3000 {
		t.Fatalf("status fields overwritten: %+v", st)
	}
}

func TestHeartbeatPoke(t *testing.T) {
	ns := testenv.NATSForTest(t)
	ch := heartbeatSub(t, ns.URL(), "worker-3")
	var applied atomic.Uint64
	h, err := control.NewHeartbeat(heartbeatConn(t, ns.URL()), control.HeartbeatOptions{
		WorkerID: "worker-3",
		Interval: time.Hour, // only the first heartbeat and pokes
		Status:   func() schemas.WorkerStatus { return schemas.WorkerStatus{AppliedSeq: applied.Load()} },
	})
	if err != nil {
		t.Fatal(err)
	}
	runHeartbeat(t, h)
	if st := nextStatus(t, ch); st.AppliedSeq != 0 || st.IntervalMS != 3600000 {
		t.Fatalf("first heartbeat %+v", st)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		applied.Store(seq)
		h.Poke()
		if st := nextStatus(t, ch); st.AppliedSeq != seq {
			t.Fatalf("after applying %d the heartbeat says %d", seq, st.AppliedSeq)
		}
	}
	select {
	case m := <-ch:
		t.Fatalf("unexpected heartbeat %s", m.Data)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestHeartbeatPokesCoalesce pokes many times while a heartbeat is being
// built: Poke never blocks, and the pokes yield one more heartbeat, not
// one each.
func TestHeartbeatPokesCoalesce(t *testing.T) {
	ns := testenv.NATSForTest(t)
	ch := heartbeatSub(t, ns.URL(), "worker-4")
	var (
		mu      sync.Mutex
		gate    chan struct{} // while set, Status blocks on it
		entered = make(chan struct{}, 16)
	)
	h, err := control.NewHeartbeat(heartbeatConn(t, ns.URL()), control.HeartbeatOptions{
		WorkerID: "worker-4",
		Interval: time.Hour,
		Status: func() schemas.WorkerStatus {
			mu.Lock()
			g := gate
			mu.Unlock()
			if g != nil {
				entered <- struct{}{}
				<-g
			}
			return schemas.WorkerStatus{}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runHeartbeat(t, h)
	nextStatus(t, ch) // the first, immediate heartbeat

	g := make(chan struct{})
	mu.Lock()
	gate = g
	mu.Unlock()
	h.Poke()
	<-entered // Run is building the poked heartbeat and is stuck there
	start := time.Now()
	for i := 0; i < 1000; i++ {
		h.Poke()
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("1000 pokes took %v: Poke blocks", el)
	}
	mu.Lock()
	gate = nil
	mu.Unlock()
	close(g)
	nextStatus(t, ch) // the one being built
	nextStatus(t, ch) // the 1000 pokes, coalesced
	select {
	case m := <-ch:
		t.Fatalf("pokes not coalesced: extra heartbeat %s", m.Data)
	case <-time.After(200 * time.Millisecond):
	}
	waitPublished(t, h, func(n uint64) bool { return n == 3 })
}

func TestNewHeartbeatValidates(t *testing.T) {
	ns := testenv.NATSForTest(t)
	nc := heartbeatConn(t, ns.URL())
	status := func() schemas.WorkerStatus { return schemas.WorkerStatus{} }
	for _, o := range []control.HeartbeatOptions{
		{WorkerID: "", Status: status},
		{WorkerID: "Worker 1", Status: status},
		{WorkerID: "w.1", Status: status}, // would be two subject tokens
		{WorkerID: "w1"},                  // no Status
	} {
		if _, err := control.NewHeartbeat(nc, o); err == nil {
			t.Errorf("NewHeartbeat(%q, status %v) accepted", o.WorkerID, o.Status != nil)
		}
	}
	h, err := control.NewHeartbeat(nc, control.HeartbeatOptions{WorkerID: "w1", Status: status})
	if err != nil {
		t.Fatal(err)
	}
	runHeartbeat(t, h)
	for h.Published() == 0 { // Run has started
		time.Sleep(time.Millisecond)
	}
	if err := h.Run(context.Background()); err == nil {
		t.Fatal("second Run accepted")
	}
}

// BenchmarkHeartbeatPoke measures a Poke until its heartbeat arrives at a
// subscriber on another connection (through the server): the part of the
// kill-switch budget a worker adds after applying an event. It reports
// p50 and p99 in microseconds.
func BenchmarkHeartbeatPoke(b *testing.B) {
	ns := testenv.NATSForTest(b)
	ch := heartbeatSub(b, ns.URL(), "bench")
	var seq atomic.Uint64
	h, err := control.NewHeartbeat(heartbeatConn(b, ns.URL()), control.HeartbeatOptions{
		WorkerID: "bench",
		Interval: time.Hour,
		Status:   func() schemas.WorkerStatus { return schemas.WorkerStatus{AppliedSeq: seq.Load(), CaughtUp: true} },
	})
	if err != nil {
		b.Fatal(err)
	}
	runHeartbeat(b, h)
	<-ch
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq.Add(1)
		start := time.Now()
		h.Poke()
		<-ch
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
