package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// HeartbeatOptions configures a Heartbeat. The zero value of every field
// but WorkerID and Status means its default.
type HeartbeatOptions struct {
	// WorkerID names the worker; it must be a valid subject token
	// (schemas.ValidID). The heartbeat goes to schemas.StatusSubject(WorkerID).
	WorkerID string
	// Interval between periodic heartbeats (default 1 s). Watchers count a
	// worker gone after 3 intervals without one.
	Interval time.Duration
	// Status returns what the worker enforces now. It is called from Run's
	// goroutine before each publish, so it must be safe to call
	// concurrently with the worker (read atomics or take a short lock).
	// Required.
	Status func() schemas.WorkerStatus
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock for WorkerStatus.Time (default time.Now).
	Now func() time.Time
}

// Heartbeat publishes a worker's schemas.WorkerStatus on core NATS every
// Interval, and at once after Poke. The control service and `talosctl
// --wait` read it to learn which control seq every live worker enforces,
// so the latency from Poke to publish is part of the kill-switch budget:
// Poke only signals Run's goroutine, which publishes without any delay,
// batching or flush wait (the NATS client's flusher sends it at once).
type Heartbeat struct {
	nc      *nats.Conn
	o       HeartbeatOptions
	subject string
	log     *slog.Logger
	poke    chan struct{} // capacity 1: a pending poke; more coalesce into it

	running   atomic.Bool
	stopping  atomic.Bool
	published atomic.Uint64
}

// NewHeartbeat validates the options and returns a heartbeat; call Run.
func NewHeartbeat(nc *nats.Conn, o HeartbeatOptions) (*Heartbeat, error) {
	if nc == nil {
		return nil, errors.New("ingest: heartbeat needs a NATS connection")
	}
	if !schemas.ValidID(o.WorkerID) {
		return nil, fmt.Errorf("ingest: heartbeat: worker id %q must match %s", o.WorkerID, schemas.IDPattern)
	}
	if o.Status == nil {
		return nil, errors.New("ingest: heartbeat needs a Status function")
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Heartbeat{nc: nc, o: o, subject: schemas.StatusSubject(o.WorkerID), log: o.Logger,
		poke: make(chan struct{}, 1)}, nil
}

// Poke asks for a heartbeat now (after a control event was applied). It
// never blocks: pokes that arrive while one is pending coalesce into it,
// and the status is read when the heartbeat is built, so the published
// status is at least as recent as the last Poke. Safe for concurrent use,
// also before Run starts (the poke then waits for Run).
func (h *Heartbeat) Poke() {
	select {
	case h.poke <- struct{}{}:
	default:
	}
}

// Published is how many heartbeats were handed to the NATS connection.
func (h *Heartbeat) Published() uint64 { return h.published.Load() }

// Run publishes one heartbeat at once, then one every Interval and one
// after each (coalesced) Poke, until ctx ends; then it returns nil. A
// publish failure (connection closed, not yet reconnected) is logged once
// per outage, not retried: the next heartbeat carries the newer status.
// The last heartbeat, when ctx ends, says Stopping, so watchers stop
// counting this worker as live at once. It returns an error only if called
// twice.
func (h *Heartbeat) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return errors.New("ingest: Heartbeat.Run called twice")
	}
	t := time.NewTicker(h.o.Interval)
	defer t.Stop()
	failing := false
	beat := func() {
		err := h.publish()
		switch {
		case err != nil && !failing:
			h.log.Warn("heartbeat publish failed", "subject", h.subject, "err", err)
		case err == nil && failing:
			h.log.Info("heartbeat publishing again", "subject", h.subject)
		}
		failing = err != nil
	}
	beat()
	for {
		select {
		case <-ctx.Done():
			h.stopping.Store(true)
			_ = h.publish()
			return nil
		case <-h.poke:
			beat()
		case <-t.C:
			beat()
		}
	}
}

func (h *Heartbeat) publish() error {
	st := h.o.Status()
	if st.WorkerID == "" {
		st.WorkerID = h.o.WorkerID
	}
	if st.Time == "" {
		st.Time = h.o.Now().UTC().Format(schemas.TimeFormat)
	}
	if st.IntervalMS == 0 {
		st.IntervalMS = h.o.Interval.Milliseconds()
	}
	st.Stopping = h.stopping.Load()
	data, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	if err := h.nc.Publish(h.subject, data); err != nil {
		return err
	}
	h.published.Add(1)
	return nil
}
