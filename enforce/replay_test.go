package enforce

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// memStore is a ReplayStore in memory, shared by the guards of several
// "workers" like the NATS KV bucket it stands for.
type memStore struct {
	mu     sync.Mutex
	owners map[[2]string]string
	claims atomic.Int64
	fail   error // returned by Claim when set
}

func newMemStore() *memStore { return &memStore{owners: map[[2]string]string{}} }

func (m *memStore) Claim(sessionID, correlationID, toolCallID string) (string, error) {
	m.claims.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return "", m.fail
	}
	k := [2]string{sessionID, correlationID}
	if o, ok := m.owners[k]; ok {
		return o, nil
	}
	m.owners[k] = toolCallID
	return toolCallID, nil
}

func (m *memStore) setFail(err error) {
	m.mu.Lock()
	m.fail = err
	m.mu.Unlock()
}

func TestReplayCacheBounds(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{PerSession: 3, Sessions: 2})
	for i := 1; i <= 4; i++ {
		c.Add("s1", fmt.Sprintf("c%d", i), fmt.Sprintf("call-%d", i))
	}
	if _, ok := c.Lookup("s1", "c1"); ok {
		t.Error("c1 survived past PerSession")
	}
	if o, ok := c.Lookup("s1", "c4"); !ok || o != "call-4" {
		t.Errorf("c4: %q %v", o, ok)
	}
	if c.Len() != 3 {
		t.Errorf("Len %d, want 3", c.Len())
	}
	// A lookup makes c2 recent, so c3 is evicted next.
	if _, ok := c.Lookup("s1", "c2"); !ok {
		t.Fatal("c2 missing")
	}
	c.Add("s1", "c5", "call-5")
	if _, ok := c.Lookup("s1", "c3"); ok {
		t.Error("c3 should have been the least recently used")
	}
	if _, ok := c.Lookup("s1", "c2"); !ok {
		t.Error("c2 was evicted although recently used")
	}

	// Sessions: s1 is touched last, so s2 is evicted by s3.
	c.Add("s2", "c1", "x")
	c.Lookup("s1", "c2")
	c.Add("s3", "c1", "y")
	if c.Sessions() != 2 {
		t.Errorf("Sessions %d, want 2", c.Sessions())
	}
	if _, ok := c.Lookup("s2", "c1"); ok {
		t.Error("s2 survived past Sessions")
	}
	if _, ok := c.Lookup("s1", "c5"); !ok {
		t.Error("s1 evicted although recently used")
	}
	// The same correlation id in another session is another pair.
	if o, _ := c.Lookup("s3", "c1"); o != "y" {
		t.Errorf("s3/c1 owner %q", o)
	}

	c.Flush("s3")
	if _, ok := c.Lookup("s3", "c1"); ok || c.Len() != 3 {
		t.Errorf("Flush(s3): Len %d", c.Len())
	}
	c.Flush("")
	if c.Len() != 0 || c.Sessions() != 0 {
		t.Errorf("Flush all: Len %d Sessions %d", c.Len(), c.Sessions())
	}
}

// TestReplayCacheDefaults: seed 002's 10k ids per session, 4096 sessions.
func TestReplayCacheDefaults(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{})
	for i := range DefaultReplayPerSession + 1 {
		c.Add("s", fmt.Sprint(i), "o")
	}
	if c.Len() != DefaultReplayPerSession {
		t.Errorf("Len %d, want %d", c.Len(), DefaultReplayPerSession)
	}
	if _, ok := c.Lookup("s", "0"); ok {
		t.Error("oldest id kept past the default bound")
	}
	c.Flush("")
	for i := range DefaultReplaySessions + 1 {
		c.Add(fmt.Sprint(i), "c", "o")
	}
	if c.Sessions() != DefaultReplaySessions {
		t.Errorf("Sessions %d, want %d", c.Sessions(), DefaultReplaySessions)
	}
	if _, ok := c.Lookup("0", "c"); ok {
		t.Error("oldest session kept past the default bound")
	}
}

// TestReplayGuardAcrossWorkers: two guards over one store are two workers;
// a correlation_id is owned by the first call that used it, wherever.
func TestReplayGuardAcrossWorkers(t *testing.T) {
	store := newMemStore()
	w1 := NewReplayGuard(store, ReplayCacheOptions{})
	w2 := NewReplayGuard(store, ReplayCacheOptions{})
	steps := []struct {
		name         string
		g            *ReplayGuard
		sess, corr   string
		call         string
		replayed     bool
		storeClaimed bool // went to the store (local miss)
	}{
		{"first use on w1", w1, "s1", "corr-1", "A", false, true},
		{"same pair, another call, on w2", w2, "s1", "corr-1", "B", true, true},
		{"redelivery of A on w2", w2, "s1", "corr-1", "A", false, false},
		{"redelivery of A on w1 (local hit)", w1, "s1", "corr-1", "A", false, false},
		{"B again on w1 (local hit)", w1, "s1", "corr-1", "B", true, false},
		{"same correlation id in another session", w2, "s2", "corr-1", "B", false, true},
		{"another correlation id", w1, "s1", "corr-2", "B", false, true},
	}
	for _, st := range steps {
		before := store.claims.Load()
		replayed, err := st.g.Check(st.sess, st.corr, st.call)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if replayed != st.replayed {
			t.Errorf("%s: replayed %v, want %v", st.name, replayed, st.replayed)
		}
		if claimed := store.claims.Load() > before; claimed != st.storeClaimed {
			t.Errorf("%s: went to the store %v, want %v", st.name, claimed, st.storeClaimed)
		}
	}

	// Flushing a worker's cache does not forget the shared owner.
	w1.Flush("")
	if replayed, err := w1.Check("s1", "corr-1", "B"); err != nil || !replayed {
		t.Errorf("after a local flush: replayed %v err %v", replayed, err)
	}
}

func TestReplayGuardStoreError(t *testing.T) {
	store := newMemStore()
	g := NewReplayGuard(store, ReplayCacheOptions{})
	boom := errors.New("kv: timeout")
	store.setFail(boom)
	replayed, err := g.Check("s1", "corr-1", "A")
	if !errors.Is(err, ErrReplayStore) || !errors.Is(err, boom) || replayed {
		t.Fatalf("Check = %v, %v", replayed, err)
	}
	if g.Cache().Len() != 0 {
		t.Error("a failed claim was cached")
	}
	store.setFail(nil)
	if replayed, err := g.Check("s1", "corr-1", "A"); err != nil || replayed {
		t.Errorf("after recovery: %v %v", replayed, err)
	}
}

type noOwnerStore struct{}

func (noOwnerStore) Claim(string, string, string) (string, error) { return "", nil }

func TestReplayGuardStoreWithoutOwner(t *testing.T) {
	g := NewReplayGuard(noOwnerStore{}, ReplayCacheOptions{})
	if _, err := g.Check("s", "c", "A"); !errors.Is(err, ErrReplayStore) {
		t.Fatalf("err %v", err)
	}
}

// TestReplayGuardLocalOnly: with no store, concurrent calls racing for one
// pair still have exactly one owner.
func TestReplayGuardLocalOnly(t *testing.T) {
	g := NewReplayGuard(nil, ReplayCacheOptions{})
	const n = 32
	var wg sync.WaitGroup
	var owners atomic.Int64
	for i := range n {
		wg.Go(func() {
			replayed, err := g.Check("s1", "corr", fmt.Sprintf("call-%d", i))
			if err != nil {
				t.Error(err)
			}
			if !replayed {
				owners.Add(1)
			}
		})
	}
	wg.Wait()
	if owners.Load() != 1 {
		t.Fatalf("%d calls own the pair, want 1", owners.Load())
	}
	owner, _ := g.Cache().Lookup("s1", "corr")
	if replayed, _ := g.Check("s1", "corr", owner); replayed {
		t.Error("the owner's redelivery is a replay")
	}
	g.Flush("s1")
	if replayed, _ := g.Check("s1", "corr", "someone-else"); replayed {
		t.Error("a local-only guard remembered a flushed pair")
	}
}

func TestReplayCacheConcurrent(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{PerSession: 50, Sessions: 8})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				s := fmt.Sprintf("s%d", (w+i)%12)
				c.Add(s, fmt.Sprint(i), "o")
				c.Lookup(s, fmt.Sprint(i-1))
				if i%100 == 0 {
					c.Flush(s)
				}
			}
		})
	}
	wg.Wait()
	if c.Sessions() > 8 || c.Len() > 8*50 {
		t.Fatalf("bounds exceeded: %d sessions, %d ids", c.Sessions(), c.Len())
	}
}
