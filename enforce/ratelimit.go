package enforce

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// RateStore counts events in fixed windows shared by every worker (ingest
// keeps it in a NATS KV bucket). Take adds one to the counter of (key,
// window index) and reports the count after adding, atomically across
// workers: n takes in one window return 1..n, each once.
//
// The window index is WindowIndex(now, window) = floor(unix time of now /
// window), so that every worker counts the same window whatever its start
// time. The now a store receives comes from RateLimiter, which measures
// elapsed time on the monotonic clock (CP-MONO: "time.monotonic() for rate
// limiting"); see RateLimiter for how the two combine.
//
// An error means no decision: the caller retries the call later (fail
// closed), never allows it unchecked.
type RateStore interface {
	Take(key string, window time.Duration, now time.Time) (count int64, err error)
}

// ErrRateStore wraps every failure of a RateStore returned by
// RateLimiter.Check: the call MUST NOT be decided (retry it; fail closed).
var ErrRateStore = errors.New("enforce: rate store")

// WindowIndex is the fixed window of length window that t falls in:
// floor(t's Unix nanoseconds / window). window must be positive.
func WindowIndex(t time.Time, window time.Duration) int64 {
	n, w := t.UnixNano(), int64(window)
	q := n / w
	if n%w < 0 {
		q--
	}
	return q
}

// RateLimiter applies a Policy's rate limits (DENY_RATE_LIMIT, CSP MUST 7):
// every limit matching (agent, server, tool) counts the call in
// its current window, per (limit name, agent, server, tool), and the call is
// denied when any count exceeds the limit. Denied calls count too, so a
// client that keeps calling stays denied until the window turns.
//
// Clock: windows are numbered on wall-clock time (WindowIndex), which is
// what lets workers on different machines share them; but within a process,
// time runs on the monotonic clock. NewRateLimiter reads time.Now() once as
// an anchor; Check turns its now into anchor's wall time + now.Sub(anchor).
// For a now from time.Now() that difference is monotonic elapsed time, so a
// wall-clock step (NTP, an operator) after start neither skips nor repeats
// a window for this worker; workers agree on window boundaries up to their
// wall-clock skew at start. A now without a monotonic reading (tests inject
// time.Unix(...)) is used as is.
//
// A RateLimiter is safe for concurrent use.
type RateLimiter struct {
	policy     *Policy
	store      RateStore
	anchor     time.Time // with its monotonic reading
	anchorWall time.Time // the same instant, wall clock only
}

// NewRateLimiter applies p's limits, counting in store. A nil p limits
// nothing; a nil store is a NewMemoryRateStore (one worker only).
func NewRateLimiter(p *Policy, store RateStore) *RateLimiter {
	if store == nil {
		store = NewMemoryRateStore()
	}
	now := time.Now()
	return &RateLimiter{policy: p, store: store, anchor: now, anchorWall: now.Round(0)}
}

// Now is the limiter's reading of now: anchor wall time plus the elapsed
// time since the anchor (monotonic when now carries a monotonic reading).
func (l *RateLimiter) Now(now time.Time) time.Time {
	return l.anchorWall.Add(now.Sub(l.anchor))
}

// Check counts one call of (agent, server, tool) at now against every
// matching limit. It returns DENY_RATE_LIMIT once, with one detail per
// exceeded limit naming the limit (never the agent), or nothing. An error
// (wrapping ErrRateStore) means the store did not answer: no decision, and
// limits taken before the failure stay counted (a retry may count the call
// twice, erring towards denial).
func (l *RateLimiter) Check(agent, server, tool string, now time.Time) (codes, details []string, err error) {
	if l == nil || l.policy == nil {
		return nil, nil, nil
	}
	limits := l.policy.Limits(agent, server, tool)
	if len(limits) == 0 {
		return nil, nil, nil
	}
	t := l.Now(now)
	for _, lim := range limits {
		n, err := l.store.Take(rateKey(lim.Name, agent, server, tool), lim.Window.Duration(), t)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: limit %q: %w", ErrRateStore, lim.Name, err)
		}
		if n > int64(lim.Limit) {
			if len(codes) == 0 {
				codes = []string{schemas.CodeDenyRateLimit}
			}
			details = append(details, fmt.Sprintf("rate_limit %s: more than %d calls per %s", lim.Name, lim.Limit, lim.Window))
		}
	}
	return codes, details, nil
}

// rateKey is the counter key of a limit for one (agent, server, tool):
// length-prefixed fields, so no choice of names can make two keys equal.
func rateKey(limit, agent, server, tool string) string {
	b := make([]byte, 0, len(limit)+len(agent)+len(server)+len(tool)+16)
	for _, f := range [...]string{limit, agent, server, tool} {
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	return string(b)
}

// ErrRateWindow is returned by a RateStore for a window that is not
// positive (or that the store cannot hold).
var ErrRateWindow = errors.New("enforce: rate store: invalid window")

// MemoryRateStore is an in-process RateStore: for tests and a single
// worker (counts are not shared and are lost on restart). It keeps one
// counter per (key, window), for the newest window index seen; an older
// index (a now earlier than a previous one) counts against the newer
// window. Counters of past windows are swept as it goes. Safe for
// concurrent use.
type MemoryRateStore struct {
	mu       sync.Mutex // guards counters and takes
	counters map[memRateKey]memCounter
	takes    int
}

type memRateKey struct {
	key    string
	window time.Duration
}

type memCounter struct{ index, count int64 }

// memSweepEvery is how many takes pass between sweeps of past windows.
const memSweepEvery = 4096

// NewMemoryRateStore returns an empty store.
func NewMemoryRateStore() *MemoryRateStore {
	return &MemoryRateStore{counters: map[memRateKey]memCounter{}}
}

// Take implements RateStore.
func (s *MemoryRateStore) Take(key string, window time.Duration, now time.Time) (int64, error) {
	if window <= 0 {
		return 0, ErrRateWindow
	}
	idx := WindowIndex(now, window)
	k := memRateKey{key, window}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counters[k]
	if idx > c.index || c.count == 0 {
		c = memCounter{index: idx}
	}
	c.count++
	s.counters[k] = c
	if s.takes++; s.takes%memSweepEvery == 0 {
		for k2, c2 := range s.counters {
			if c2.index < WindowIndex(now, k2.window) {
				delete(s.counters, k2)
			}
		}
	}
	return c.count, nil
}

// Len is how many counters the store holds.
func (s *MemoryRateStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.counters)
}
