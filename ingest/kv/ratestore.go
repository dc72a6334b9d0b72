package kv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
)

// RateBucket is the NATS KV bucket of the shared rate-limit counters.
const RateBucket = "TALOS_RATE"

// Rate store bounds.
const (
	// minRateTTL is the shortest lifetime of a counter key.
	minRateTTL = time.Minute
	// maxRateValue bounds a stored message: the count (decimal int64, at
	// most 20 bytes) plus the compare-and-set headers the server counts.
	maxRateValue = 256
	// rateKeyHexLen is how many hex digits of sha256 name a counter (128
	// bits: collisions are out of reach).
	rateKeyHexLen = 32
	// rateCacheSize bounds the revisions a store remembers.
	rateCacheSize = 16384
	// rateStripes is how many local locks serialise takes per key.
	rateStripes = 256
	// maxRateAttempts bounds the compare-and-set loop of one Take.
	maxRateAttempts = 1000
	// rateTimeout bounds one Take.
	rateTimeout = 5 * time.Second
)

// ErrRateWindow is returned by Take for a window that is not positive or
// is longer than the bucket keeps counters (half its TTL).
var ErrRateWindow = errors.New("ingest: rate store: window out of range")

// KVRateStore is the rate-limit counter store shared by every worker: the
// NATS KV bucket TALOS_RATE, one key per (limit key, window length, window
// index) whose value is the decimal count. It implements enforce.RateStore.
//
// Take is a compare-and-set on the key's revision, so concurrent takes on
// any number of workers never lose an update: n takes in one window return
// 1..n, each once. In the common case it is one round trip: the store
// remembers the revision it last wrote for each key and updates against it
// (a new window's key is created against revision 0, "absent"); only when
// another worker wrote in between does it read the key and retry. Takes on
// one key within this process are serialised by a local lock, so they do
// not contend with each other.
//
// Keys expire TTL after their last update: the bucket's TTL is twice the
// longest window (at least 1 min), so a key outlives its window and an
// expired counter is never one still in use.
//
// A KVRateStore is safe for concurrent use.
type KVRateStore struct {
	kv     jetstream.KeyValue
	ttl    time.Duration
	cache  *lru.Cache[string, rateRevision]
	stripe [rateStripes]sync.Mutex // stripe[k] serialises takes on the keys hashing to k
}

// rateRevision is the last count this store wrote to a key, at revision.
type rateRevision struct {
	revision uint64
	count    int64
}

// NewKVRateStore creates the TALOS_RATE bucket, or updates an existing one
// (history 1, TTL = 2 × maxWindow, at least 1 min), with replicas replicas
// (<= 0: 1), and returns a store on it. maxWindow is the longest window the
// store will count (the policy's MaxWindow; <= 0 means 30 s). Updating never
// shortens the TTL or lowers the replica count of an existing bucket
// (another worker may count longer windows). Every worker calls it at start.
func NewKVRateStore(ctx context.Context, js jetstream.JetStream, maxWindow time.Duration, replicas int) (*KVRateStore, error) {
	kv, st, err := ensureBucket(ctx, js, bucket{
		name:         RateBucket,
		description:  "Talos rate limits: (limit key, window) -> count",
		ttl:          max(2*maxWindow, minRateTTL),
		maxValueSize: maxRateValue,
		replicas:     replicas,
		keepTTL:      true,
	})
	if err != nil {
		return nil, err
	}
	ttl := st.CachedInfo().Config.MaxAge
	cache, err := lru.New[string, rateRevision](rateCacheSize)
	if err != nil {
		return nil, err
	}
	return &KVRateStore{kv: kv, ttl: ttl, cache: cache}, nil
}

// TTL is how long a counter key lives after its last update.
func (s *KVRateStore) TTL() time.Duration { return s.ttl }

// RateKey is the bucket key counting key in the window of length window
// that now falls in: hex sha256(key, window) truncated to 128 bits, ".",
// and the window index floor(unix time / window) (no raw key, which names
// an agent, reaches a subject).
func RateKey(key string, window time.Duration, now time.Time) string {
	h := sha256.New()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, int64(window), 10))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	b := make([]byte, 0, rateKeyHexLen+21)
	b = hex.AppendEncode(b, sum[:rateKeyHexLen/2])
	b = append(b, '.')
	b = strconv.AppendInt(b, enforce.WindowIndex(now, window), 10)
	return string(b)
}

// Take adds one to the counter of key in the window now falls in and
// returns the count after adding (enforce.RateStore). The caller's now is
// used as given (enforce.RateLimiter supplies monotonic-clock time). An
// error means nothing is known: the caller must fail closed.
func (s *KVRateStore) Take(key string, window time.Duration, now time.Time) (int64, error) {
	if window <= 0 || window > s.ttl/2 {
		return 0, ErrRateWindow
	}
	k := RateKey(key, window, now)
	mu := &s.stripe[stripeOf(k)]
	mu.Lock()
	defer mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), rateTimeout)
	defer cancel()

	last, _ := s.cache.Get(k) // zero: assume the key is absent (a new window)
	for attempt := 0; attempt < maxRateAttempts; attempt++ {
		next := last.count + 1
		rev, err := s.kv.Update(ctx, k, strconv.AppendInt(nil, next, 10), last.revision)
		if err == nil {
			s.cache.Add(k, rateRevision{rev, next})
			return next, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			s.cache.Remove(k)
			return 0, fmt.Errorf("ingest: rate take: %w", err)
		}
		// Another worker wrote (or the key is gone): read the current count.
		if last, err = s.read(ctx, k); err != nil {
			s.cache.Remove(k)
			return 0, err
		}
		if last.revision == 0 {
			// Absent, or its last revision is a delete/purge marker:
			// Create handles both.
			rev, err := s.kv.Create(ctx, k, []byte("1"))
			if err == nil {
				s.cache.Add(k, rateRevision{rev, 1})
				return 1, nil
			}
			if !errors.Is(err, jetstream.ErrKeyExists) {
				s.cache.Remove(k)
				return 0, fmt.Errorf("ingest: rate take: %w", err)
			}
			if last, err = s.read(ctx, k); err != nil {
				s.cache.Remove(k)
				return 0, err
			}
		}
	}
	s.cache.Remove(k)
	return 0, fmt.Errorf("ingest: rate take: no update after %d attempts (contention)", maxRateAttempts)
}

// read returns the key's current count and revision; revision 0 if the key
// is absent or deleted.
func (s *KVRateStore) read(ctx context.Context, k string) (rateRevision, error) {
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rateRevision{}, nil
	}
	if err != nil {
		return rateRevision{}, fmt.Errorf("ingest: rate take: read: %w", err)
	}
	n, err := strconv.ParseInt(string(e.Value()), 10, 64)
	if err != nil || n < 0 {
		return rateRevision{}, fmt.Errorf("ingest: rate take: key %s holds no count", k)
	}
	return rateRevision{e.Revision(), n}, nil
}

// stripeOf picks the local lock of a bucket key from its hash prefix.
func stripeOf(k string) int {
	v, err := strconv.ParseUint(k[:2], 16, 8)
	if err != nil {
		return 0
	}
	return int(v)
}

// NewRateLimiter is the rate limiter of p's rate limits, counting across
// workers in the TALOS_RATE bucket (NewKVRateStore) sized to p's longest
// window (Policy.MaxWindow), with replicas replicas. It is nil, and no
// bucket is created, when p has no rate limits.
func NewRateLimiter(ctx context.Context, js jetstream.JetStream, p *enforce.Policy, replicas int) (*enforce.RateLimiter, error) {
	if p == nil || len(p.RateLimits) == 0 {
		return nil, nil
	}
	store, err := NewKVRateStore(ctx, js, p.MaxWindow(), replicas)
	if err != nil {
		return nil, fmt.Errorf("rate store: %w", err)
	}
	return enforce.NewRateLimiter(p, store), nil
}
