package forward

import (
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// Stats are one destination's counters and gauges, for /metrics.
type Stats struct {
	Name                                string
	delivered, resent, failures, alerts atomic.Uint64
	lag                                 atomic.Uint64
	downSince                           atomic.Int64 // Unix ns of the outage's first failure; 0 while up
}

// Delivered is how many events the destination accepted (and were acked).
func (s *Stats) Delivered() uint64 { return s.delivered.Load() }

// Resent is how many events were sent again because the connection they
// were written on failed before they were confirmed.
func (s *Stats) Resent() uint64 { return s.resent.Load() }

// Failures is how many delivery attempts failed.
func (s *Stats) Failures() uint64 { return s.failures.Load() }

// Alerts is how many down alerts were raised.
func (s *Stats) Alerts() uint64 { return s.alerts.Load() }

// Lag is the events not yet delivered, as of the last poll (every second).
func (s *Stats) Lag() uint64 { return s.lag.Load() }

// Down is how long deliveries have been failing (0 while they succeed).
func (s *Stats) Down(now time.Time) time.Duration {
	ns := s.downSince.Load()
	if ns == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, ns))
}

// outage is the destination's current run of failures.
type outage struct {
	since     time.Time // first failure; zero while up
	failures  uint64
	lastErr   error
	lastAlert time.Time // zero: no alert raised for this outage
}

// failed records a failed delivery and raises the down alert once the
// outage has lasted AlertAfter, and again every AlertAfter while it lasts.
func (d *destination) failed(err error) {
	now := time.Now()
	d.stats.failures.Add(1)
	o := &d.outage
	if o.since.IsZero() {
		o.since = now
		d.stats.downSince.Store(now.UnixNano())
	}
	o.failures++
	o.lastErr = err
	limit := time.Duration(d.d.AlertAfter)
	if now.Sub(o.since) < limit || (!o.lastAlert.IsZero() && now.Sub(o.lastAlert) < limit) {
		return
	}
	o.lastAlert = now
	d.stats.alerts.Add(1)
	d.log.Error("forward destination down past its alert limit; events wait in TALOS_AUDIT",
		"since", o.since.UTC().Format(time.RFC3339), "failures", o.failures, "alert_after", limit, "err", err)
	d.alert(schemas.AlertDown, now)
}

// recovered ends an outage after a successful delivery, and says so when
// it had been alerted.
func (d *destination) recovered() {
	o := &d.outage
	if o.since.IsZero() {
		return
	}
	if !o.lastAlert.IsZero() {
		now := time.Now()
		d.log.Info("forward destination back", "down_for", now.Sub(o.since).Round(time.Millisecond), "failures", o.failures)
		d.alert(schemas.AlertResolved, now)
	}
	*o = outage{}
	d.stats.downSince.Store(0)
}

// alert publishes the destination's state on its alert subject (core
// NATS: a responder that listens gets it; the log and the metrics keep it
// for the others).
func (d *destination) alert(state string, now time.Time) {
	o := d.outage
	a := schemas.ForwardAlert{Alert: "forward_destination", State: state, Destination: d.d.Name, Instance: d.instance,
		Since: o.since.UTC().Format(time.RFC3339Nano), DownMS: now.Sub(o.since).Milliseconds(), Failures: o.failures,
		Time: now.UTC().Format(time.RFC3339Nano)}
	if o.lastErr != nil && state == schemas.AlertDown {
		a.Error = o.lastErr.Error()
	}
	b, err := json.Marshal(a)
	if err == nil {
		err = d.nc.Publish(schemas.ForwardAlertSubject(d.d.Name), b)
	}
	if err != nil {
		d.log.Warn("forward alert not published", "state", state, "err", err)
	}
}
