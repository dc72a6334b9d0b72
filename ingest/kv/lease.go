package kv

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LeaseBucket holds the leases of components of which one instance at a
// time may run (the transparency log's appender).
const LeaseBucket = "TALOS_LEASES"

// LeaseOptions name a lease and its holder.
type LeaseOptions struct {
	// Name is the lease's key (KV key characters: letters, digits, -_.=/).
	Name string
	// Holder names this instance in the lease's value (for operators).
	Holder string
	// TTL is how long a lease outlives its holder's last renewal (default
	// 10 s); the holder renews it every TTL/3.
	TTL      time.Duration
	Replicas int
}

// Lease is a held lease. Its holder stops what the lease guards as soon
// as Lost is closed.
type Lease struct {
	kv   jetstream.KeyValue
	o    LeaseOptions
	rev  atomic.Uint64 // of the holder's last write
	lost chan struct{}
	stop context.CancelFunc
	done sync.WaitGroup
}

// AcquireLease waits until the lease o.Name is free (never created, released,
// or not renewed for TTL: its holder died or lost NATS), takes it and keeps
// renewing it. It returns when it holds the lease or ctx ends.
func AcquireLease(ctx context.Context, js jetstream.JetStream, o LeaseOptions) (*Lease, error) {
	if o.TTL <= 0 {
		o.TTL = 10 * time.Second
	}
	kv, _, err := ensureBucket(ctx, js, bucket{name: LeaseBucket, description: "Talos leases: one holder at a time",
		ttl: o.TTL, maxValueSize: 1024, replicas: o.Replicas})
	if err != nil {
		return nil, err
	}
	for {
		// Held by another (ErrKeyExists) or NATS unreachable: try again.
		if rev, err := kv.Create(ctx, o.Name, []byte(o.Holder)); err == nil {
			return startLease(kv, o, rev), nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.TTL / 3):
		}
	}
}

func startLease(kv jetstream.KeyValue, o LeaseOptions, rev uint64) *Lease {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lease{kv: kv, o: o, lost: make(chan struct{}), stop: cancel}
	l.rev.Store(rev)
	l.done.Go(func() { l.renew(ctx) })
	return l
}

// renew renews the lease every TTL/3 until Release, and closes lost when
// it cannot: the lease was taken (its revision moved) or no renewal got
// through for a TTL, after which another may hold it.
func (l *Lease) renew(ctx context.Context) {
	last := time.Now()
	t := time.NewTicker(l.o.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, l.o.TTL/3)
		next, err := l.kv.Update(rctx, l.o.Name, []byte(l.o.Holder), l.rev.Load())
		cancel()
		switch {
		case err == nil:
			l.rev.Store(next)
			last = time.Now()
		case ctx.Err() != nil:
			return
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound), time.Since(last) >= l.o.TTL:
			close(l.lost)
			return
		}
	}
}

// Lost is closed when the lease is no longer held.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Release stops renewing and frees the lease for another holder at once
// (when it still holds it).
func (l *Lease) Release() {
	l.stop()
	l.done.Wait()
	select {
	case <-l.lost:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.o.TTL/3)
	defer cancel()
	_ = l.kv.Delete(ctx, l.o.Name, jetstream.LastRevision(l.rev.Load())) // never another holder's
}
