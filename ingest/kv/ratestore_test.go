package kv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/testenv"
)

var _ enforce.RateStore = (*kv.KVRateStore)(nil)

func newRateStore(t testing.TB, js jetstream.JetStream, maxWindow time.Duration) *kv.KVRateStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := kv.NewKVRateStore(ctx, js, maxWindow, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func take(t testing.TB, s *kv.KVRateStore, key string, window time.Duration, now time.Time, want int64) {
	t.Helper()
	n, err := s.Take(key, window, now)
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("Take(%s, %s) = %d, want %d", key, window, n, want)
	}
}

func TestRateKey(t *testing.T) {
	now := time.Unix(120, 0)
	k := kv.RateKey("limit|agent-1|fs|read", time.Minute, now)
	hash, idx, ok := strings.Cut(k, ".")
	if !ok || len(hash) != 32 || idx != "2" {
		t.Fatalf("RateKey = %s, want <32 hex>.2", k)
	}
	if strings.Contains(k, "agent") {
		t.Fatal("key carries the raw limit key")
	}
	if kv.RateKey("limit|agent-1|fs|read", time.Second, now) == k {
		t.Fatal("windows of different lengths share a key")
	}
	if got := kv.RateKey("k", time.Minute, time.Unix(-1, 0)); !strings.HasSuffix(got, ".-1") {
		t.Fatalf("negative index: %s", got)
	}
}

// TestKVRateStoreTwoWorkers takes concurrently on one key from two stores
// on two connections, as two workers do: every count 1..n is returned
// exactly once (no lost or duplicated update).
func TestKVRateStoreTwoWorkers(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js1 := testenv.ConnectJS(t, ns.URL())
	_, js2 := testenv.ConnectJS(t, ns.URL())
	workers := []*kv.KVRateStore{newRateStore(t, js1, time.Minute), newRateStore(t, js2, time.Minute)}

	const goroutines, takes = 8, 100 // goroutines per worker, takes per goroutine
	total := len(workers) * goroutines * takes
	now := time.Unix(1_700_000_040, 0)
	counts := make(chan int64, total)
	var wg sync.WaitGroup
	for _, w := range workers {
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < takes; i++ {
					n, err := w.Take("hot", time.Minute, now)
					if err != nil {
						t.Error(err)
						return
					}
					counts <- n
				}
			}()
		}
	}
	wg.Wait()
	close(counts)
	seen := make(map[int64]bool, total)
	for n := range counts {
		if seen[n] {
			t.Fatalf("count %d returned twice", n)
		}
		seen[n] = true
	}
	if len(seen) != total {
		t.Fatalf("%d takes returned %d counts", total, len(seen))
	}
	for n := int64(1); n <= int64(total); n++ {
		if !seen[n] {
			t.Fatalf("count %d never returned", n)
		}
	}
	// The next take, from either worker, continues the shared count.
	take(t, workers[1], "hot", time.Minute, now, int64(total)+1)
	take(t, workers[0], "hot", time.Minute, now, int64(total)+2)
}

func TestKVRateStoreWindows(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	s := newRateStore(t, js, time.Minute)
	t0 := time.Unix(1_700_000_040, 0)
	take(t, s, "k", time.Minute, t0, 1)
	take(t, s, "k", time.Minute, t0.Add(59*time.Second), 2)
	take(t, s, "k", time.Minute, t0.Add(time.Minute), 1) // next window
	take(t, s, "k", time.Second, t0, 1)                  // other window length
	take(t, s, "other", time.Minute, t0, 1)              // other key

	if _, err := s.Take("k", 0, t0); !errors.Is(err, kv.ErrRateWindow) {
		t.Fatalf("zero window: %v", err)
	}
	if _, err := s.Take("k", time.Hour, t0); !errors.Is(err, kv.ErrRateWindow) {
		t.Fatalf("window beyond the TTL: %v", err)
	}
}

// TestKVRateStoreStaleRevision: a store whose remembered revision is stale
// (another worker wrote since) rereads and still counts correctly, and a
// deleted counter starts again at 1.
func TestKVRateStoreStaleRevision(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js1 := testenv.ConnectJS(t, ns.URL())
	_, js2 := testenv.ConnectJS(t, ns.URL())
	a, b := newRateStore(t, js1, time.Minute), newRateStore(t, js2, time.Minute)
	now := time.Unix(1_700_000_040, 0)
	take(t, a, "k", time.Minute, now, 1)
	take(t, b, "k", time.Minute, now, 2)
	take(t, a, "k", time.Minute, now, 3) // a's cached revision is stale
	take(t, a, "k", time.Minute, now, 4)

	bucket, err := js1.KeyValue(context.Background(), kv.RateBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := bucket.Delete(context.Background(), kv.RateKey("k", time.Minute, now)); err != nil {
		t.Fatal(err)
	}
	take(t, a, "k", time.Minute, now, 1)
	take(t, b, "k", time.Minute, now, 2)

	// A value that is not a count is an error, never a guess.
	bad := kv.RateKey("bad", time.Minute, now)
	if _, err := bucket.Put(context.Background(), bad, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Take("bad", time.Minute, now); err == nil {
		t.Fatal("corrupt counter accepted")
	}
}

func TestKVRateStoreBucketConfig(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	s := newRateStore(t, js, 10*time.Second)
	if s.TTL() != time.Minute {
		t.Fatalf("TTL = %s, want the 1 min floor", s.TTL())
	}
	s = newRateStore(t, js, time.Hour)
	if s.TTL() != 2*time.Hour {
		t.Fatalf("TTL = %s, want 2h", s.TTL())
	}
	// A worker with shorter windows does not shorten the bucket's TTL.
	s = newRateStore(t, js, time.Minute)
	if s.TTL() != 2*time.Hour {
		t.Fatalf("TTL = %s after a shorter update, want 2h kept", s.TTL())
	}
	st, err := js.Stream(context.Background(), "KV_"+kv.RateBucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxAge != 2*time.Hour || cfg.MaxMsgsPerSubject != 1 {
		t.Fatalf("bucket MaxAge %s history %d", cfg.MaxAge, cfg.MaxMsgsPerSubject)
	}
}

// TestRateLimiterOnKV runs enforce's RateLimiter over the shared store:
// two limiters (two workers) share one budget.
func TestRateLimiterOnKV(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js1 := testenv.ConnectJS(t, ns.URL())
	_, js2 := testenv.ConnectJS(t, ns.URL())
	p, err := enforce.ParsePolicy([]byte(`{"rate_limits":[{"name":"per-agent","agents":["*"],"servers":["fs"],"tools":["*"],"limit":3,"window":"1m"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	w1 := enforce.NewRateLimiter(p, newRateStore(t, js1, p.MaxWindow()))
	w2 := enforce.NewRateLimiter(p, newRateStore(t, js2, p.MaxWindow()))
	now := time.Unix(1_700_000_040, 0)
	var denied []string
	for i, w := range []*enforce.RateLimiter{w1, w2, w1, w2, w1} {
		codes, _, err := w.Check("agent-1", "fs", "read", now)
		if err != nil {
			t.Fatal(err)
		}
		denied = append(denied, fmt.Sprintf("%d%v", i+1, codes))
	}
	want := []string{"1[]", "2[]", "3[]", "4[DENY_RATE_LIMIT]", "5[DENY_RATE_LIMIT]"}
	if fmt.Sprint(denied) != fmt.Sprint(want) {
		t.Fatalf("decisions %v, want %v", denied, want)
	}
	// The next window allows again, on either worker.
	if codes, _, err := w2.Check("agent-1", "fs", "read", now.Add(time.Minute)); err != nil || codes != nil {
		t.Fatalf("next window: %v %v", codes, err)
	}
}

// TestBucketsHonourReplicas: the rate store and the call ledger ask for the
// replica count they are given (a single server refuses more than one,
// which is how this test sees the request), and an update never lowers an
// existing bucket's count or shortens the rate bucket's TTL.
func TestBucketsHonourReplicas(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kv.NewKVRateStore(ctx, js, time.Minute, 3); err == nil || !strings.Contains(strings.ToLower(err.Error()), "replica") {
		t.Errorf("rate store at 3 replicas on one server: %v, want a replicas error", err)
	}
	if _, err := kv.NewLedger(ctx, js, kv.LedgerOptions{Replicas: 3}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "replica") {
		t.Errorf("ledger at 3 replicas on one server: %v, want a replicas error", err)
	}
	long, err := kv.NewKVRateStore(ctx, js, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	short, err := kv.NewKVRateStore(ctx, js, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if long.TTL() != 2*time.Hour || short.TTL() != 2*time.Hour {
		t.Errorf("TTLs %s and %s, want the longer 2h kept", long.TTL(), short.TTL())
	}
}

// TestNewRateLimiter: a policy without rate limits gets no limiter and no
// bucket; one with limits gets a bucket sized to its longest window.
func TestNewRateLimiter(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	none, err := enforce.ParsePolicy([]byte(`{"rules":[{"name":"all","agents":["*"],"servers":["*"],"tools":["*"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*enforce.Policy{nil, none} {
		if l, err := kv.NewRateLimiter(ctx, js, p, 1); l != nil || err != nil {
			t.Fatalf("no rate limits: limiter %v, %v", l, err)
		}
	}
	if _, err := js.KeyValue(ctx, kv.RateBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("a policy without rate limits created the bucket: %v", err)
	}
	p, err := enforce.ParsePolicy([]byte(`{"rate_limits":[` +
		`{"name":"short","agents":["*"],"servers":["*"],"tools":["*"],"limit":5,"window":"10s"},` +
		`{"name":"long","agents":["*"],"servers":["*"],"tools":["*"],"limit":100,"window":"1h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := kv.NewRateLimiter(ctx, js, p, 1); l == nil || err != nil {
		t.Fatalf("rate limits: limiter %v, %v", l, err)
	}
	st, err := js.Stream(ctx, "KV_"+kv.RateBucket)
	if err != nil {
		t.Fatal(err)
	}
	if ttl := st.CachedInfo().Config.MaxAge; ttl != 2*time.Hour {
		t.Fatalf("bucket TTL %s, want 2h (twice the longest window)", ttl)
	}
}
