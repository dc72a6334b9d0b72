// Package loadgen is the load generator behind talosctl bench and
// bench-mcp. It builds and signs tool-call envelopes ahead of their send
// (off the measured path), paces them from N simulated enforcement points
// at an offered rate, and counts decision latency from each call's
// scheduled send time, so a stalled sender cannot hide queueing (no
// coordinated omission). It also measures kill-switch propagation rounds,
// the generator's own CPU, and what an MCP proxy adds to a tools/call.
//
// It talks to the pipeline only through ingest's clients and an MCP
// client session; reading ClickHouse is left to the caller (WaitStored
// takes a counting function).
package loadgen

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
)

// Pacing is how a run offers its calls.
type Pacing struct {
	// Rate is the offered calls/s across all enforcement points; 0 sends
	// as fast as decisions come back.
	Rate int
	// Inflight is the calls each enforcement point keeps in flight when
	// Rate is 0 (at least 1); with a Rate it is 1.
	Inflight int
	Server   string        // the calls' server_id
	Timeout  time.Duration // decision timeout per call (none in time counts as no decision)
}

// Prepared is a run whose envelopes are ready: all of them, or about
// depth per enforcement point, with the rest built during the run.
//
// Shutdown: Stop ends the producers; call it once Send has returned (or
// instead of Send).
type Prepared struct {
	envs     *envelopeQueues
	Count    int           // envelopes ready when Prepare returned
	Duration time.Duration // what building and signing them took
	CPU      CPUSample     // this process's CPU time spent on that
	// End is the CPU sample when Prepare returned: the start of the
	// timed part's CPU accounting.
	End CPUSample
}

// Prepare builds and signs the envelopes of calls spread over the
// enforcement points of clients (Send must be given the same clients in
// the same order), at most prepareAhead in all (0: all of them, before it
// returns), then collects the garbage that made, so neither is on the
// measured path.
func Prepare(m *Maker, clients []*ep.Client, calls, prepareAhead int) (*Prepared, error) {
	epIDs := make([]string, len(clients))
	for e, c := range clients {
		epIDs[e] = c.EPID()
	}
	counts := splitCalls(calls, len(epIDs))
	depth := slices.Max(counts)
	if prepareAhead > 0 {
		depth = max(1, (prepareAhead+len(epIDs)-1)/len(epIDs))
	}
	cpu0 := SampleCPU()
	start := time.Now()
	p := &Prepared{envs: startEnvelopes(m, epIDs, counts, depth)}
	n, err := p.envs.ready()
	if err != nil {
		p.Stop()
		return nil, err
	}
	runtime.GC()
	p.Count, p.Duration, p.End = n, time.Since(start), SampleCPU()
	p.CPU = CPUSample{user: p.End.user - cpu0.user, system: p.End.system - cpu0.system, ok: cpu0.ok}
	return p, nil
}

// Stop ends the producers and waits for them.
func (p *Prepared) Stop() { p.envs.stop() }

// Tally is what a run's sending found.
type Tally struct {
	Start    time.Time       // when the clock started
	Elapsed  time.Duration   // from Start until the last decision
	Latency  []time.Duration // one per call, sorted
	Allowed  int64
	Denied   int64
	None     int64 // no decision in time
	Posted   int64 // post events sent and decided
	BuildErr error // the first envelope that could not be built
}

// Send sends every prepared envelope, clients[i] those of the i-th
// enforcement point, and returns when each has its decision (or timed
// out). After an allow it also sends the call's post event, if built.
func (p *Prepared) Send(clients []*ep.Client, pace Pacing) *Tally {
	var interval time.Duration
	if pace.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(len(clients)) / float64(pace.Rate))
	}
	inflight := pace.Inflight
	if pace.Rate > 0 || inflight < 1 {
		inflight = 1
	}
	t := &Tally{Start: time.Now()}
	lat := make([][]time.Duration, len(clients))
	var wg sync.WaitGroup
	var c counters
	for e, client := range clients {
		// Stagger the enforcement points across one interval.
		offset := interval * time.Duration(e) / time.Duration(len(clients))
		wg.Go(func() {
			lat[e] = sender{client: client, pace: pace, c: &c}.run(p.envs.q[e], t.Start.Add(offset), interval, inflight)
		})
	}
	wg.Wait()
	t.Elapsed = time.Since(t.Start)
	for _, l := range lat {
		t.Latency = append(t.Latency, l...)
	}
	slices.Sort(t.Latency)
	t.Allowed, t.Denied, t.None, t.Posted = c.allowed.Load(), c.denied.Load(), c.none.Load(), c.posted.Load()
	t.BuildErr = p.envs.failed()
	return t
}

// counters are a run's outcomes, shared by its senders.
type counters struct{ allowed, denied, none, posted atomic.Int64 }

// sender is one enforcement point of a run.
type sender struct {
	client *ep.Client
	pace   Pacing
	c      *counters
}

// run sends the envelopes of q, the k-th at first+k·interval (as soon as
// possible with no interval), at most inflight at a time, and returns
// their latencies.
func (s sender) run(q <-chan *envelope, first time.Time, interval time.Duration, inflight int) []time.Duration {
	type job struct {
		env   *envelope
		sched time.Time
	}
	// inflight goroutines take the calls in turn: one started per call
	// would grow a fresh stack for each (about a tenth of this process's
	// CPU at 2,000 calls/s).
	jobs := make(chan job)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var lat []time.Duration
	for range inflight {
		wg.Go(func() {
			for j := range jobs {
				l := s.call(j.env, j.sched)
				mu.Lock()
				lat = append(lat, l)
				mu.Unlock()
			}
		})
	}
	k := 0
	for env := range q {
		sched := time.Now()
		if interval > 0 {
			sched = first.Add(time.Duration(k) * interval)
			time.Sleep(time.Until(sched))
		}
		k++
		jobs <- job{env, sched} // waits for a free goroutine: at most inflight in flight
	}
	close(jobs)
	wg.Wait()
	return lat
}

// call sends one envelope (and its post event after an allow) and returns
// the decision's latency from the scheduled send time.
func (s sender) call(env *envelope, sched time.Time) time.Duration {
	d, err := send(s.client, schemas.PhasePre, s.pace.Server, env, s.pace.Timeout)
	// Latency counts from the scheduled send time, so a stalled sender
	// cannot hide queueing (no coordinated omission).
	l := time.Since(sched)
	switch {
	case err != nil:
		s.c.none.Add(1)
	case d.Decision == schemas.DecisionAllow:
		s.c.allowed.Add(1)
		if env.post != nil {
			if _, err := send(s.client, schemas.PhasePost, s.pace.Server, env, s.pace.Timeout); err == nil {
				s.c.posted.Add(1)
			}
		}
	default:
		s.c.denied.Add(1)
	}
	return l
}

// WaitStored polls count until it reports at least receipts receipts and
// events ToolCallEvents, or until deadline; it returns the last counts.
func WaitStored(ctx context.Context, count func(context.Context) (receipts, events uint64, err error),
	receipts, events uint64, deadline time.Time) (gotReceipts, gotEvents uint64, ok bool) {
	for {
		n, m, err := count(ctx)
		if err == nil && n >= receipts && m >= events {
			return n, m, true
		}
		if time.Now().After(deadline) {
			return n, m, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
