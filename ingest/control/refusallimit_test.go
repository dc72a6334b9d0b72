package control

import (
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestRefusalLimiterBuckets(t *testing.T) {
	t0 := time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC)
	l := newRefusalLimiter(RefusalLimits{Rate: rate.Every(time.Minute), Burst: 2})
	type step struct {
		signer string
		at     time.Duration
		ok     bool
		n      uint64
	}
	for i, s := range []step{
		{"alice", 0, true, 0},
		{"alice", 0, true, 0},
		{"alice", 0, false, 1}, // over the burst
		{"alice", 0, false, 2},
		{"bob", 0, true, 0}, // a bucket of his own
		{"", 0, true, 0},    // the shared bucket of unverified commands
		{"", 0, true, 0},
		{"", 0, false, 1},
		{"alice", 0, false, 3},
		{"alice", time.Minute, true, 3}, // one token back: the receipt counts the three
		{"alice", time.Minute, false, 1},
		{"", time.Minute, true, 1},
	} {
		n, ok := l.take(s.signer, t0.Add(s.at))
		if ok != s.ok || n != s.n {
			t.Fatalf("step %d (%q at +%s): take = %d, %v; want %d, %v", i, s.signer, s.at, n, ok, s.n, s.ok)
		}
	}
	// A receipt that could not be written gives its count back.
	l.restore("alice", 5)
	if n, ok := l.take("alice", t0.Add(3*time.Minute)); !ok || n != 6 {
		t.Fatalf("after restore: take = %d, %v; want 6 (1 suppressed + 5 restored), true", n, ok)
	}
}

func TestRefusalLimitsDefaults(t *testing.T) {
	l := newRefusalLimiter(RefusalLimits{})
	if l.lim.Rate != 1 || l.lim.Burst != 10 {
		t.Fatalf("defaults %+v, want 1/s burst 10", l.lim)
	}
	now := time.Now()
	for i := range 10 {
		if _, ok := l.take("k", now); !ok {
			t.Fatalf("refusal %d of a burst of 10 suppressed", i+1)
		}
	}
	if _, ok := l.take("k", now); ok {
		t.Fatal("11th refusal at the same instant got a receipt")
	}
}
