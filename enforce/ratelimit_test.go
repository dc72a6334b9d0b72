package enforce

import (
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

func rateTestPolicy(t *testing.T, limits string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(`{"rate_limits":[` + limits + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRateLimiterWindow(t *testing.T) {
	p := rateTestPolicy(t, `{"name":"fs-per-agent","agents":["*"],"servers":["fs"],"tools":["*"],"limit":3,"window":"1m"}`)
	l := NewRateLimiter(p, NewMemoryRateStore())
	// Injected times have no monotonic reading: used as is.
	start := time.Unix(1_700_000_040, 0) // 1_700_000_040 is a multiple of 60
	for i := 0; i < 3; i++ {
		codes, _, err := l.Check("agent-1", "fs", "read", start.Add(time.Duration(i)*10*time.Second))
		if err != nil || codes != nil {
			t.Fatalf("call %d: %v %v", i+1, codes, err)
		}
	}
	codes, details, err := l.Check("agent-1", "fs", "read", start.Add(59*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(codes, []string{schemas.CodeDenyRateLimit}) {
		t.Fatalf("4th call: codes %v", codes)
	}
	if len(details) != 1 || !strings.Contains(details[0], "fs-per-agent") || strings.Contains(details[0], "agent-1") {
		t.Fatalf("details %q: want the limit named, not the agent", details)
	}
	// Counted per (agent, server, tool): others are unaffected.
	for _, c := range [][3]string{{"agent-2", "fs", "read"}, {"agent-1", "fs", "write"}} {
		if codes, _, _ := l.Check(c[0], c[1], c[2], start.Add(59*time.Second)); codes != nil {
			t.Fatalf("%v limited by another key's count", c)
		}
	}
	// A server no limit matches is never limited.
	for i := 0; i < 10; i++ {
		if codes, _, _ := l.Check("agent-1", "github", "read", start); codes != nil {
			t.Fatal("unmatched call limited")
		}
	}
	// The next window allows again.
	if codes, _, err := l.Check("agent-1", "fs", "read", start.Add(time.Minute)); err != nil || codes != nil {
		t.Fatalf("next window: %v %v", codes, err)
	}
}

func TestRateLimiterEveryMatchingLimit(t *testing.T) {
	p := rateTestPolicy(t, `{"name":"wide","agents":["*"],"servers":["*"],"tools":["*"],"limit":10,"window":"1m"},
		{"name":"narrow","agents":["*"],"servers":["*"],"tools":["write_*"],"limit":1,"window":"10s"}`)
	l := NewRateLimiter(p, NewMemoryRateStore())
	now := time.Unix(1_700_000_040, 0)
	if codes, _, _ := l.Check("a", "fs", "write_file", now); codes != nil {
		t.Fatal("first write limited")
	}
	codes, details, _ := l.Check("a", "fs", "write_file", now)
	if !reflect.DeepEqual(codes, []string{schemas.CodeDenyRateLimit}) || len(details) != 1 || !strings.Contains(details[0], "narrow") {
		t.Fatalf("second write: %v %q", codes, details)
	}
	// Eight more calls reach the wide limit (10): the 11th exceeds both
	// while the narrow window is still the same.
	for i := 0; i < 8; i++ {
		l.Check("a", "fs", "write_file", now)
	}
	codes, details, _ = l.Check("a", "fs", "write_file", now)
	if !reflect.DeepEqual(codes, []string{schemas.CodeDenyRateLimit}) || len(details) != 2 {
		t.Fatalf("11th call: %v %q, want one code and two details", codes, details)
	}
}

type failingStore struct{}

func (failingStore) Take(string, time.Duration, time.Time) (int64, error) {
	return 0, errors.New("nats: timeout")
}

func TestRateLimiterStoreErrorFailsClosed(t *testing.T) {
	p := rateTestPolicy(t, `{"name":"l","agents":["*"],"servers":["*"],"tools":["*"],"limit":1,"window":"1s"}`)
	l := NewRateLimiter(p, failingStore{})
	codes, details, err := l.Check("a", "s", "t", time.Now())
	if !errors.Is(err, ErrRateStore) || codes != nil || details != nil {
		t.Fatalf("Check = %v %v %v; want an ErrRateStore error and no decision", codes, details, err)
	}
}

func TestRateLimiterNilPolicy(t *testing.T) {
	l := NewRateLimiter(nil, nil)
	for i := 0; i < 5; i++ {
		if codes, _, err := l.Check("a", "s", "t", time.Now()); codes != nil || err != nil {
			t.Fatalf("nil policy: %v %v", codes, err)
		}
	}
	var nilLimiter *RateLimiter
	if codes, _, err := nilLimiter.Check("a", "s", "t", time.Now()); codes != nil || err != nil {
		t.Fatalf("nil limiter: %v %v", codes, err)
	}
}

func TestRateLimiterNow(t *testing.T) {
	l := NewRateLimiter(nil, nil)
	// A time without a monotonic reading is used as is.
	fixed := time.Unix(1_000_000, 0)
	if got := l.Now(fixed); !got.Equal(fixed) {
		t.Fatalf("Now(%v) = %v", fixed, got)
	}
	// A time with one is the anchor's wall time plus monotonic elapsed
	// time: with no clock step, its own wall time up to the nanoseconds
	// between the wall and monotonic readings of time.Now.
	now := time.Now().Add(time.Hour)
	if d := l.Now(now).Sub(now.Round(0)); d < -time.Second || d > time.Second {
		t.Fatalf("Now(now) is %s off its wall time", d)
	}
	if l.Now(now).Sub(l.Now(now.Add(-time.Hour))) != time.Hour {
		t.Fatal("elapsed time not preserved")
	}
}

func TestWindowIndex(t *testing.T) {
	cases := []struct {
		t    time.Time
		w    time.Duration
		want int64
	}{
		{time.Unix(0, 0), time.Minute, 0},
		{time.Unix(59, 999), time.Minute, 0},
		{time.Unix(60, 0), time.Minute, 1},
		{time.Unix(-1, 0), time.Minute, -1}, // floor, not truncation
		{time.Unix(-60, 0), time.Minute, -1},
		{time.Unix(-61, 0), time.Minute, -2},
	}
	for _, tc := range cases {
		if got := WindowIndex(tc.t, tc.w); got != tc.want {
			t.Errorf("WindowIndex(%v, %s) = %d, want %d", tc.t.Unix(), tc.w, got, tc.want)
		}
	}
}

func TestRateKeyUnambiguous(t *testing.T) {
	if rateKey("l", "a:b", "s", "t") == rateKey("l", "a", "b:s", "t") {
		t.Fatal("keys collide")
	}
	if a, b := rateKey("l", "a", "s", "t"), rateKey("l", "a", "s", "t"); a != b {
		t.Fatal("key not deterministic")
	}
}

func TestMemoryRateStore(t *testing.T) {
	s := NewMemoryRateStore()
	if _, err := s.Take("k", 0, time.Now()); !errors.Is(err, ErrRateWindow) {
		t.Fatalf("zero window: %v", err)
	}
	t0 := time.Unix(600, 0)
	for want := int64(1); want <= 3; want++ {
		if n, _ := s.Take("k", time.Minute, t0); n != want {
			t.Fatalf("Take = %d, want %d", n, want)
		}
	}
	// The same key with another window is another counter.
	if n, _ := s.Take("k", time.Second, t0); n != 1 {
		t.Fatalf("other window: %d", n)
	}
	// A new window restarts; an older time counts against the newer one.
	if n, _ := s.Take("k", time.Minute, t0.Add(time.Minute)); n != 1 {
		t.Fatalf("next window: %d", n)
	}
	if n, _ := s.Take("k", time.Minute, t0); n != 2 {
		t.Fatalf("earlier time: %d, want 2", n)
	}
}

func TestMemoryRateStoreConcurrent(t *testing.T) {
	s := NewMemoryRateStore()
	const goroutines, each = 8, 500
	now := time.Unix(6000, 0)
	seen := make([]bool, goroutines*each+1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				n, err := s.Take("k", time.Hour, now)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if n < 1 || int(n) >= len(seen) || seen[n] {
					t.Errorf("count %d returned twice or out of range", n)
				} else {
					seen[n] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(seen); i++ {
		if !seen[i] {
			t.Fatalf("count %d never returned", i)
		}
	}
}

func TestMemoryRateStoreSweeps(t *testing.T) {
	s := NewMemoryRateStore()
	t0 := time.Unix(600, 0)
	for i := 0; i < 100; i++ {
		s.Take(strings.Repeat("k", i+1), time.Second, t0)
	}
	later := t0.Add(time.Hour)
	for i := 0; i < memSweepEvery; i++ {
		s.Take("live", time.Second, later)
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("store holds %d counters after a sweep, want 1", n)
	}
}
