package kv

import (
	"context"
	"testing"
	"time"

	"github.com/talos-audit/talos/testenv"
)

// TestLease: one holder at a time; a released lease goes to the waiting
// instance at once, one whose holder died (stopped renewing) after its
// TTL; a holder whose lease was taken over sees Lost.
func TestLease(t *testing.T) {
	_, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := func(holder string) LeaseOptions {
		return LeaseOptions{Name: "log-test", Holder: holder, TTL: 900 * time.Millisecond}
	}
	a, err := AcquireLease(ctx, js, o("a"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	go func() {
		b, err := AcquireLease(ctx, js, o("b"))
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	select {
	case <-got:
		t.Fatal("b took the lease a holds and renews")
	case <-time.After(3 * time.Second): // three TTLs: a's renewals keep it
	}
	a.Release()
	var b *Lease
	select {
	case b = <-got:
	case <-time.After(2 * time.Second):
		t.Fatal("a released lease did not go to b")
	}

	// b's holder dies: it stops renewing without releasing (as after
	// SIGKILL); c gets the lease once the TTL has passed, and b, were it
	// still running, would see Lost.
	b.stop() // its renewals stop; its key stays until the TTL
	b.done.Wait()
	start := time.Now()
	c, err := AcquireLease(ctx, js, o("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("c took a lease that was renewed %v ago", waited)
	}
}

// TestLeaseLost: a holder whose lease another took over (its key
// rewritten) sees Lost at its next renewal.
func TestLeaseLost(t *testing.T) {
	_, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := AcquireLease(ctx, js, LeaseOptions{Name: "log-test", Holder: "a", TTL: 900 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	if _, err := a.kv.Put(ctx, "log-test", []byte("usurper")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("a holder whose lease was rewritten did not see Lost")
	}
}
