package control

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// Liveness bounds of worker heartbeats.
const (
	// minStatusWindow is the shortest time a worker stays live after a
	// heartbeat, whatever interval it announces.
	minStatusWindow = time.Second
	// unheardGrace is how long after a StatusWatcher starts a worker it has
	// never heard from still counts as live (so it can answer): workers
	// announce every interval and at once after applying a control event.
	unheardGrace = 3 * time.Second
	// maxWatchedWorkers bounds the workers a watcher remembers; past it,
	// workers that are no longer live are forgotten, and heartbeats of new
	// workers are ignored while every remembered one is live.
	maxWatchedWorkers = 4096
	// maxAppliedSteps bounds the applied-seq history kept per worker.
	maxAppliedSteps = 64
)

// StatusWatcher follows worker heartbeats (talos.status.<worker_id>) and
// keeps the latest status of each worker with the time it arrived. It is
// what `talosctl --wait` and the control service use to know which workers
// are live and which control seq each has applied.
//
// It is safe for concurrent use. Close it when done; the NATS connection
// must outlive it.
type StatusWatcher struct {
	sub   *nats.Subscription
	now   func() time.Time
	start time.Time

	mu      sync.Mutex // guards workers and changed
	workers map[string]*watchedWorker
	// changed is closed, and replaced, on every accepted heartbeat: a
	// broadcast to WaitApplied calls.
	changed chan struct{}
}

type watchedWorker struct {
	last schemas.WorkerStatus
	at   time.Time // arrival of last
	// steps records when AppliedSeq first reached each value seen, in
	// increasing seq order, so WaitApplied can tell when a seq was applied
	// even if later heartbeats arrived since. Reset when AppliedSeq goes
	// down (the worker restarted).
	steps []appliedStep
}

type appliedStep struct {
	seq uint64
	at  time.Time
}

// NewStatusWatcher subscribes to every worker heartbeat.
func NewStatusWatcher(nc *nats.Conn) (*StatusWatcher, error) {
	w := &StatusWatcher{now: time.Now, workers: map[string]*watchedWorker{}, changed: make(chan struct{})}
	w.start = w.now()
	sub, err := nc.Subscribe(schemas.SubjectStatusAll, w.onStatus)
	if err != nil {
		return nil, fmt.Errorf("ingest: subscribe worker status: %w", err)
	}
	if err := sub.SetPendingLimits(4096, 16<<20); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	// The flush puts the subscription in place before the caller sends a
	// command. One interrupted by a reconnect (nats.go reports it as a
	// closed connection) is no failure: the client subscribes again before
	// it sends anything else, so the order holds.
	if err := nc.Flush(); err != nil && nc.IsClosed() {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("ingest: subscribe worker status: %w", err)
	}
	w.sub = sub
	return w, nil
}

// Close stops following heartbeats. What the watcher knows stays readable
// (it only ages out).
func (w *StatusWatcher) Close() {
	_ = w.sub.Unsubscribe()
}

// onStatus runs on the subscription's delivery goroutine (owned by the NATS
// connection; Unsubscribe ends it).
func (w *StatusWatcher) onStatus(m *nats.Msg) {
	var st schemas.WorkerStatus
	if err := json.Unmarshal(m.Data, &st); err != nil || st.WorkerID == "" {
		return
	}
	// A worker speaks for itself only: the subject names it, so NATS
	// permissions can keep one worker from posing as another.
	if m.Subject != schemas.StatusSubject(st.WorkerID) {
		return
	}
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if st.Stopping {
		// Gone now: WaitApplied reports it missing at once, not after 3 s.
		if ww := w.workers[st.WorkerID]; ww != nil {
			ww.last, ww.at = st, now.Add(-ww.window()-time.Millisecond)
			close(w.changed)
			w.changed = make(chan struct{})
		}
		return
	}
	ww := w.workers[st.WorkerID]
	if ww == nil {
		if len(w.workers) >= maxWatchedWorkers {
			w.forgetDeadLocked(now)
			if len(w.workers) >= maxWatchedWorkers {
				return
			}
		}
		ww = &watchedWorker{}
		w.workers[st.WorkerID] = ww
	}
	switch n := len(ww.steps); {
	case n == 0 || st.AppliedSeq < ww.steps[n-1].seq:
		ww.steps = append(ww.steps[:0], appliedStep{st.AppliedSeq, now})
	case st.AppliedSeq > ww.steps[n-1].seq:
		if n == maxAppliedSteps {
			ww.steps = append(ww.steps[:0], ww.steps[1:]...)
		}
		ww.steps = append(ww.steps, appliedStep{st.AppliedSeq, now})
	}
	ww.last, ww.at = st, now
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *StatusWatcher) forgetDeadLocked(now time.Time) {
	for id, ww := range w.workers {
		if !ww.liveAt(now) {
			delete(w.workers, id)
		}
	}
}

// window is how long the worker counts as live after its last heartbeat:
// 3× its announced interval, at least minStatusWindow.
func (ww *watchedWorker) window() time.Duration {
	return max(3*time.Duration(ww.last.IntervalMS)*time.Millisecond, minStatusWindow)
}

func (ww *watchedWorker) liveAt(now time.Time) bool { return now.Sub(ww.at) <= ww.window() }

// appliedAt is when the worker first reported AppliedSeq ≥ seq (since its
// last restart), or false.
func (ww *watchedWorker) appliedAt(seq uint64) (time.Time, bool) {
	for _, s := range ww.steps {
		if s.seq >= seq {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// Live returns the latest status of every live worker (heard from within
// 3× its heartbeat interval, at least 1 s), sorted by worker id.
func (w *StatusWatcher) Live() []schemas.WorkerStatus {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]schemas.WorkerStatus, 0, len(w.workers))
	for _, ww := range w.workers {
		if ww.liveAt(now) {
			out = append(out, ww.last)
		}
	}
	slices.SortFunc(out, func(a, b schemas.WorkerStatus) int {
		switch {
		case a.WorkerID < b.WorkerID:
			return -1
		case a.WorkerID > b.WorkerID:
			return 1
		}
		return 0
	})
	return out
}

// LiveIDs returns the ids of the live workers, sorted.
func (w *StatusWatcher) LiveIDs() []string {
	live := w.Live()
	ids := make([]string, len(live))
	for i, st := range live {
		ids[i] = st.WorkerID
	}
	return ids
}

// WaitApplied waits until every named worker has reported AppliedSeq ≥ seq
// or is no longer live. applied maps each worker that got there to the
// arrival time of the first heartbeat that showed it (earlier than the call
// if it was already there); missing lists, sorted, the workers that stopped
// being live first. A worker never heard from counts as live for the first
// 3 s of the watcher, then as missing. If ctx ends first, err is ctx.Err()
// and missing also lists the workers still pending.
func (w *StatusWatcher) WaitApplied(ctx context.Context, seq uint64, workers []string) (applied map[string]time.Time, missing []string, err error) {
	applied = map[string]time.Time{}
	pending := map[string]bool{}
	for _, id := range workers {
		pending[id] = true
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := w.now()
		w.mu.Lock()
		changed := w.changed
		next := time.Duration(-1) // until the next liveness deadline; -1: none
		for id := range pending {
			ww := w.workers[id]
			var wait time.Duration
			switch {
			case ww == nil:
				wait = unheardGrace - now.Sub(w.start)
			default:
				if at, ok := ww.appliedAt(seq); ok {
					applied[id] = at
					delete(pending, id)
					continue
				}
				wait = ww.window() - now.Sub(ww.at)
			}
			if wait < 0 {
				missing = append(missing, id)
				delete(pending, id)
				continue
			}
			if next < 0 || wait < next {
				next = wait
			}
		}
		w.mu.Unlock()
		if len(pending) == 0 {
			slices.Sort(missing)
			return applied, missing, nil
		}
		timer.Reset(next + time.Millisecond)
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
			for id := range pending {
				missing = append(missing, id)
			}
			slices.Sort(missing)
			return applied, missing, ctx.Err()
		}
	}
}
