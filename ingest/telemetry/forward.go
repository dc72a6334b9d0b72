package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/ingest/forward"
)

// RegisterForwarder adds the forward role's metrics, one series per
// destination (label destination): events delivered, events sent again,
// failed deliveries, down alerts raised, the lag (events of TALOS_AUDIT
// not yet delivered), whether it is up and for how long it has been down.
func RegisterForwarder(reg prometheus.Registerer, f *forward.Forwarder) {
	for _, s := range f.Stats() {
		l := prometheus.Labels{"destination": s.Name}
		counter := func(name, help string, v func() uint64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l},
				func() float64 { return float64(v()) })
		}
		gauge := func(name, help string, v func() float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l}, v)
		}
		reg.MustRegister(
			counter("talos_forward_events_total", "Audit events the destination accepted (acked).", s.Delivered),
			counter("talos_forward_resent_total", "Events sent again because their syslog connection failed before they were confirmed.", s.Resent),
			counter("talos_forward_failures_total", "Failed delivery attempts (each is retried).", s.Failures),
			counter("talos_forward_alerts_total", "Down alerts raised (talos.status.alert.forward.<destination>).", s.Alerts),
			gauge("talos_forward_lag", "Events of TALOS_AUDIT not yet delivered to the destination (refreshed every second).",
				func() float64 { return float64(s.Lag()) }),
			gauge("talos_forward_up", "1 while deliveries succeed, 0 while they fail.", func() float64 {
				if s.Down(time.Now()) > 0 {
					return 0
				}
				return 1
			}),
			gauge("talos_forward_down_seconds", "How long deliveries have been failing (0 while up).",
				func() float64 { return s.Down(time.Now()).Seconds() }),
		)
	}
}
