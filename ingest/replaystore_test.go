package ingest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/testenv"
)

func newReplayStore(t testing.TB, js jetstream.JetStream, o ingest.ReplayStoreOptions) *ingest.ReplayStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := ingest.NewReplayStore(ctx, js, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claim(t testing.TB, s *ingest.ReplayStore, session, corr, call, want string) {
	t.Helper()
	owner, err := s.Claim(session, corr, call)
	if err != nil {
		t.Fatal(err)
	}
	if owner != want {
		t.Fatalf("Claim(%s, %s, %s) = %s, want %s", session, corr, call, owner, want)
	}
}

func check(t testing.TB, s *ingest.ReplayStore, session, corr, wantOwner string) {
	t.Helper()
	owner, seen, err := s.Check(context.Background(), session, corr)
	if err != nil {
		t.Fatal(err)
	}
	if seen != (wantOwner != "") || owner != wantOwner {
		t.Fatalf("Check(%s, %s) = %q, %v; want %q", session, corr, owner, seen, wantOwner)
	}
}

func replayKeys(t testing.TB, s *ingest.ReplayStore) uint64 {
	t.Helper()
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Keys
}

func TestReplayKey(t *testing.T) {
	h := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	if got, want := ingest.ReplayKey("sess", "corr"), h("sess")+"."+h("corr"); got != want {
		t.Fatalf("ReplayKey = %s, want %s", got, want)
	}
	// The separator cannot be forged by the ids themselves.
	if ingest.ReplayKey("a.b", "c") == ingest.ReplayKey("a", "b.c") {
		t.Fatal("keys collide")
	}
}

// TestReplayStoreTwoWorkers runs two stores on two connections over the
// same bucket, as two workers do.
func TestReplayStoreTwoWorkers(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js1 := connectJS(t, ns.URL())
	_, js2 := connectJS(t, ns.URL())
	w1 := newReplayStore(t, js1, ingest.ReplayStoreOptions{})
	w2 := newReplayStore(t, js2, ingest.ReplayStoreOptions{})

	claim(t, w1, "sess-a", "corr-1", "call-1", "call-1") // first claim wins
	claim(t, w2, "sess-a", "corr-1", "call-2", "call-1") // a replay, seen by the other worker
	claim(t, w1, "sess-a", "corr-1", "call-1", "call-1") // the same call again (redelivery)
	claim(t, w2, "sess-a", "corr-1", "call-1", "call-1") // ... on the other worker
	claim(t, w2, "sess-b", "corr-1", "call-3", "call-3") // same correlation id, other session
	claim(t, w2, "sess-a", "corr-2", "call-4", "call-4")
	check(t, w2, "sess-a", "corr-1", "call-1")
	check(t, w1, "sess-b", "corr-1", "call-3")
	check(t, w1, "sess-c", "corr-1", "")

	// Many claimants at once, across both workers: exactly one wins and
	// everyone agrees on it.
	var wg sync.WaitGroup
	owners := make([]string, 16)
	errs := make([]error, 16)
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := w1
			if i%2 == 1 {
				s = w2
			}
			owners[i], errs[i] = s.Claim("sess-race", "corr-race", fmt.Sprintf("call-r%d", i))
		}()
	}
	wg.Wait()
	winners := 0
	for i, o := range owners {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if o != owners[0] {
			t.Fatalf("claimants disagree: %q and %q", owners[0], o)
		}
		if o == fmt.Sprintf("call-r%d", i) {
			winners++
		}
	}
	if winners != 1 {
		t.Fatalf("%d claimants won", winners)
	}

	st, err := w1.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Keys != 4 || st.Bytes == 0 || st.Window != "24h0m0s" {
		t.Fatalf("stats %+v, want 4 keys in a 24 h window", st)
	}

	// Flush one session: only its keys go.
	if err := w2.Flush(context.Background(), "sess-a"); err != nil {
		t.Fatal(err)
	}
	check(t, w1, "sess-a", "corr-1", "")
	check(t, w1, "sess-a", "corr-2", "")
	check(t, w1, "sess-b", "corr-1", "call-3")
	check(t, w1, "sess-race", "corr-race", owners[0])
	if n := replayKeys(t, w1); n != 2 {
		t.Fatalf("%d keys after flushing a session, want 2", n)
	}
	claim(t, w1, "sess-a", "corr-1", "call-5", "call-5") // claimable again

	// Flush everything.
	if err := w1.Flush(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	if n := replayKeys(t, w2); n != 0 {
		t.Fatalf("%d keys after flushing all", n)
	}
	check(t, w2, "sess-b", "corr-1", "")
	claim(t, w2, "sess-b", "corr-1", "call-6", "call-6")
}

// TestReplayStoreDeletedKey: a key whose last revision is a delete or
// purge marker is claimable again (nats.go Create updates on the marker's
// revision), and still only once.
func TestReplayStoreDeletedKey(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := connectJS(t, ns.URL())
	s := newReplayStore(t, js, ingest.ReplayStoreOptions{})
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, ingest.ReplayBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := ingest.ReplayKey("sess", "corr")

	claim(t, s, "sess", "corr", "call-a", "call-a")
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	check(t, s, "sess", "corr", "")
	claim(t, s, "sess", "corr", "call-b", "call-b")
	claim(t, s, "sess", "corr", "call-c", "call-b")

	if err := kv.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	check(t, s, "sess", "corr", "")
	claim(t, s, "sess", "corr", "call-d", "call-d")
	claim(t, s, "sess", "corr", "call-e", "call-d")

	// Claimants racing on a deleted key: one wins.
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	owners := make([]string, 8)
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := s.Claim("sess", "corr", fmt.Sprintf("call-r%d", i))
			if err != nil {
				t.Error(err)
			}
			owners[i] = o
		}()
	}
	wg.Wait()
	for _, o := range owners {
		if o != owners[0] || o == "" {
			t.Fatalf("claimants on a deleted key disagree: %q", owners)
		}
	}
}

func TestReplayStoreWindowExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a TTL")
	}
	ns := testenv.NATSForTest(t)
	_, js := connectJS(t, ns.URL())
	s := newReplayStore(t, js, ingest.ReplayStoreOptions{Window: time.Second})
	claim(t, s, "sess", "corr", "call-a", "call-a")
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, seen, err := s.Check(context.Background(), "sess", "corr")
		if err != nil {
			t.Fatal(err)
		}
		if !seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("claim never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Older than the window: the correlation id may be used again.
	claim(t, s, "sess", "corr", "call-b", "call-b")
}

func TestReplayStoreSurvivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts NATS")
	}
	dir := t.TempDir()
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown) // safe after the Shutdown below
	port := ns.Server().Addr().(*net.TCPAddr).Port
	_, js := connectJS(t, ns.URL())
	s := newReplayStore(t, js, ingest.ReplayStoreOptions{})
	claim(t, s, "sess", "corr", "call-a", "call-a")
	ns.Shutdown()

	ns2, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns2.Shutdown)
	_, js2 := connectJS(t, ns2.URL())
	s2 := newReplayStore(t, js2, ingest.ReplayStoreOptions{}) // a restarted worker
	claim(t, s2, "sess", "corr", "call-b", "call-a")
	check(t, s2, "sess", "corr", "call-a")
	// The old store's connection reconnects and sees the same record.
	deadline := time.Now().Add(30 * time.Second)
	for {
		owner, err := s.Claim("sess", "corr", "call-c")
		if err == nil {
			if owner != "call-a" {
				t.Fatalf("after restart the owner is %q", owner)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("old store after restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReplayStoreInput(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := connectJS(t, ns.URL())
	s := newReplayStore(t, js, ingest.ReplayStoreOptions{Memory: true, Window: time.Hour})
	for _, c := range [][3]string{{"s", "", "call"}, {"s", "c", ""}, {"s", "c", string(make([]byte, 257))}} {
		if _, err := s.Claim(c[0], c[1], c[2]); !errors.Is(err, ingest.ErrReplayInput) {
			t.Errorf("Claim(%q, %q, %d bytes): %v", c[0], c[1], len(c[2]), err)
		}
	}
	if _, _, err := s.Check(context.Background(), "s", ""); !errors.Is(err, ingest.ErrReplayInput) {
		t.Errorf("Check without correlation id: %v", err)
	}
	if st, err := s.Stats(context.Background()); err != nil || st.Window != "1h0m0s" || st.Keys != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	// A store re-opened with other options updates the bucket.
	s2 := newReplayStore(t, js, ingest.ReplayStoreOptions{Memory: true, Window: 2 * time.Hour})
	kv, err := js.KeyValue(context.Background(), ingest.ReplayBucket)
	if err != nil {
		t.Fatal(err)
	}
	status, err := kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if status.TTL() != 2*time.Hour || status.History() != 1 || s2.Window() != 2*time.Hour {
		t.Fatalf("bucket TTL %v history %d", status.TTL(), status.History())
	}
}

// BenchmarkReplayClaim measures the hot path: a first claim (one KV
// create round trip), on file and memory storage, and a replayed claim.
func BenchmarkReplayClaim(b *testing.B) {
	for _, mem := range []bool{false, true} {
		b.Run(fmt.Sprintf("new/memory=%v", mem), func(b *testing.B) {
			ns := testenv.NATSForTest(b)
			_, js := connectJS(b, ns.URL())
			s := newReplayStore(b, js, ingest.ReplayStoreOptions{Memory: mem})
			corr := make([]string, b.N)
			for i := range corr {
				corr[i] = fmt.Sprintf("corr-%d", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := s.Claim("bench-session", corr[i], "0190b6a0-0000-7000-8000-000000000000"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("replay", func(b *testing.B) {
		ns := testenv.NATSForTest(b)
		_, js := connectJS(b, ns.URL())
		s := newReplayStore(b, js, ingest.ReplayStoreOptions{})
		if _, err := s.Claim("bench-session", "corr", "first"); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if owner, err := s.Claim("bench-session", "corr", "again"); err != nil || owner != "first" {
				b.Fatal(owner, err)
			}
		}
	})
}
