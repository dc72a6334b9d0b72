package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// StatefulDecider is a Decider whose enforcement state is event-sourced
// from TALOS_CONTROL: the follower feeds it every control event (Apply, from
// one goroutine) while Decide runs concurrently.
type StatefulDecider interface {
	Decider
	control.Applier
}

// EnforcerOptions configures an Enforcer. WorkerID and Worker.Chains and
// Worker.Source are required.
type EnforcerOptions struct {
	// WorkerID names this worker in heartbeats (talos.status.<WorkerID>);
	// a valid subject token, unique among live workers.
	WorkerID string
	Worker   WorkerOptions
	// Keys are the talosd keys whose control events are applied.
	Keys verify.KeySet
	// HeartbeatInterval is the period of status heartbeats (default 1 s).
	HeartbeatInterval time.Duration
	// RegistryDigest reports the registry the decider enforces now.
	RegistryDigest func() string
	Logger         *slog.Logger
}

// Enforcer is one enforce worker with its control plane: it replays
// TALOS_CONTROL into the decider, announces what it enforces on
// talos.status.<worker_id> (at once after each control event it applies),
// and decides calls only once it has caught up with the control stream —
// a worker that has not replayed the kill switches the others enforce does
// not decide (fails closed; the calls wait in TALOS_CALLS).
type Enforcer struct {
	fol *control.ControlFollower
	hb  *control.Heartbeat
	w   *Worker
	log *slog.Logger
}

// NewEnforcer wires a follower, a heartbeat and a worker around d.
func NewEnforcer(nc *nats.Conn, js jetstream.JetStream, d StatefulDecider, o EnforcerOptions) (*Enforcer, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.RegistryDigest == nil {
		o.RegistryDigest = func() string { return "" }
	}
	if o.Worker.Logger == nil {
		o.Worker.Logger = o.Logger
	}
	e := &Enforcer{log: o.Logger}
	// The worker decides only while the follower is current (it is set
	// below, before Run starts the worker).
	o.Worker.Deciding = func() bool { return e.fol.Current() }
	w, err := NewWorker(nc, js, d, o.Worker)
	if err != nil {
		return nil, err
	}
	e.w = w
	fol, err := control.NewControlFollower(js, d, control.FollowerOptions{
		Keys:   o.Keys,
		Logger: o.Logger,
		OnApplied: func(_ uint64, caughtUp bool) {
			if caughtUp {
				e.hb.Poke() // tell --wait at once; during replay the periodic beat suffices
			}
		},
	})
	if err != nil {
		return nil, err
	}
	e.fol = fol
	hb, err := control.NewHeartbeat(nc, control.HeartbeatOptions{
		WorkerID: o.WorkerID,
		Interval: o.HeartbeatInterval,
		Logger:   o.Logger,
		Status: func() schemas.WorkerStatus {
			return schemas.WorkerStatus{
				Instance:       o.WorkerID,
				AppliedSeq:     fol.Applied(),
				ControlLast:    fol.Last(),
				CaughtUp:       fol.Current(),
				RegistryDigest: o.RegistryDigest(),
				Rejected:       fol.Rejected(),
				Handled:        w.Handled(),
			}
		},
	})
	if err != nil {
		return nil, err
	}
	e.hb = hb
	return e, nil
}

// Follower is the control follower (for metrics and tests).
func (e *Enforcer) Follower() *control.ControlFollower { return e.fol }

// Worker is the call worker (for metrics and tests).
func (e *Enforcer) Worker() *Worker { return e.w }

// Run runs until ctx ends. Start order: follower and heartbeat, then —
// once the follower has caught up — the worker. Shutdown: cancel ctx; the
// worker finishes or naks in-flight calls, then the follower and heartbeat
// stop; Run returns after all three.
func (e *Enforcer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	run := func(i int, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errs[i] = err
				cancel()
			}
		}()
	}
	run(0, e.fol.Run)
	run(1, e.hb.Run)
	start := time.Now()
	if err := e.fol.WaitCaughtUp(ctx); err == nil {
		e.log.Info("control state replayed; deciding", "control_seq", e.fol.Applied(), "took", time.Since(start).Round(time.Millisecond))
		e.hb.Poke()
		run(2, e.w.Run)
	}
	wg.Wait()
	return errors.Join(errs...)
}
