package tlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/ingest/kv"
)

// errLeaseLost ends a Role that no longer holds the appender lease.
var errLeaseLost = errors.New("tlog: the appender lease was lost")

// appender runs the log role on whichever instance holds the log's
// appender lease (kv.AcquireLease, named after the origin): the others
// stand by, and the first to take the lease after its holder dies (it is
// not renewed for --log-lease-ttl) resumes from the log's cursor. A
// holder that loses the lease stops appending at once and stands by. On
// one machine the appender lock of the log directory (Open) also keeps a
// second process off it.
type appender struct {
	js           jetstream.JetStream
	lo           Options
	ro           RoleOptions
	leaseTTL     time.Duration
	holder       string
	stalledAfter time.Duration

	role                 atomic.Pointer[Role] // the running role; nil while standing by
	mu                   sync.Mutex
	appended, duplicates uint64 // of the roles that ended
	lastSize, lastSeq    uint64
}

// leaseName is the KV key of the log's appender lease.
func leaseName(origin string) string {
	h := sha256.Sum256([]byte(origin))
	return "tlog-" + hex.EncodeToString(h[:8])
}

// run holds the lease and appends, again after each loss, until ctx ends;
// it returns an error only for what restarting cannot fix (the log and
// the stream disagree).
func (a *appender) run(ctx context.Context) error {
	log := a.ro.Logger
	for {
		lease, err := kv.AcquireLease(ctx, a.js, kv.LeaseOptions{Name: leaseName(a.lo.Key.Signer.Name()), Holder: a.holder, TTL: a.leaseTTL})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			log.Warn("log role: appender lease not taken; trying again", "err", err)
			if !sleepCtx(ctx, a.leaseTTL/3) {
				return nil
			}
			continue
		}
		log.Info("log role: holds the appender lease", "holder", a.holder)
		err = a.hold(ctx, lease)
		lease.Release()
		var f fatal
		var c crashed
		switch {
		case ctx.Err() != nil && !errors.As(err, &f):
			return nil
		case errors.As(err, &f), errors.As(err, &c):
			return err
		}
		log.Warn("log role: standing by", "err", err)
		if !sleepCtx(ctx, a.leaseTTL/3) {
			return nil
		}
	}
}

// hold opens the log and runs the role until ctx ends or the lease is
// lost, then closes the log (waiting up to 10 s for a checkpoint covering
// every entry).
func (a *appender) hold(ctx context.Context, lease *kv.Lease) error {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lost atomic.Bool
	go func() {
		select {
		case <-lease.Lost():
			lost.Store(true)
			cancel()
		case <-hctx.Done():
		}
	}()
	l, err := Open(a.lo)
	if err != nil {
		return err
	}
	r, err := NewRole(a.js, l, a.ro)
	if err != nil {
		return errors.Join(err, l.Close(time.Second))
	}
	a.role.Store(r)
	var wg sync.WaitGroup
	wg.Go(func() { l.watchPublished(hctx, a.js.Conn(), a.stalledAfter) })
	err = r.Run(hctx)
	cancel()
	wg.Wait()
	a.retire(r)
	err = errors.Join(err, l.Close(10*time.Second))
	if lost.Load() {
		return errors.Join(errLeaseLost, err)
	}
	return err
}

// retire keeps the figures of a role that ended for the metrics.
func (a *appender) retire(r *Role) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.appended += r.Appended()
	a.duplicates += r.Duplicates()
	a.lastSize, a.lastSeq = r.Size(), r.StreamSeq()
	a.role.Store(nil)
}

// figures are the metrics' values: the running role's, on top of those
// of the roles that ended.
func (a *appender) figures() (size, seq, appended, duplicates uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	size, seq, appended, duplicates = a.lastSize, a.lastSeq, a.appended, a.duplicates
	if r := a.role.Load(); r != nil {
		size, seq = r.Size(), r.StreamSeq()
		appended += r.Appended()
		duplicates += r.Duplicates()
	}
	return
}

func (a *appender) register(reg prometheus.Registerer) {
	f := func(pick func(size, seq, appended, duplicates uint64) uint64) func() float64 {
		return func() float64 { return float64(pick(a.figures())) }
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talos_log_size", Help: "Entries integrated in the transparency log (as this instance last appended)."},
			f(func(size, _, _, _ uint64) uint64 { return size })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talos_log_stream_seq", Help: "Last TALOS_AUDIT sequence the log role has fully handled (its cursor)."},
			f(func(_, seq, _, _ uint64) uint64 { return seq })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "talos_log_appended_total", Help: "Records this log role appended."},
			f(func(_, _, appended, _ uint64) uint64 { return appended })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "talos_log_duplicates_total", Help: "Records found already in the log (redelivered or published again), not appended."},
			f(func(_, _, _, duplicates uint64) uint64 { return duplicates })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "talos_log_appender", Help: "1 while this instance holds the appender lease and appends, 0 while it stands by."},
			func() float64 {
				if a.role.Load() != nil {
					return 1
				}
				return 0
			}),
	)
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
