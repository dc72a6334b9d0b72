package web

import (
	"context"
	"fmt"

	"github.com/talos-audit/talos/schemas"
)

// forwardingPanel is the incidents page's forwarding panel.
type forwardingPanel struct {
	Shown        bool // Options.Forwarding is set
	Destinations []forwardRow
	Err          string // why the statuses could not be read
}

type forwardRow struct {
	Name          string
	Lag, InFlight uint64
	LastAck       string // "never", or the time
	State         string // "down", "resolved" or "" (no alert)
	Detail        string // the alert, in words
}

// forwarding reads the destinations' statuses for the incidents page; a
// failure is shown in the panel, never fails the page.
func (h *handler) forwarding(ctx context.Context) forwardingPanel {
	if h.o.Forwarding == nil {
		return forwardingPanel{}
	}
	p := forwardingPanel{Shown: true}
	st, err := h.o.Forwarding(ctx)
	if err != nil {
		h.o.Logger.Warn("forwarding status not read", "err", err)
		p.Err = "The destinations' state could not be read from NATS."
		return p
	}
	for _, s := range st {
		r := forwardRow{Name: s.Name, Lag: s.Lag, InFlight: s.InFlight, LastAck: "never"}
		if !s.LastAck.IsZero() {
			r.LastAck = fmtTime(s.LastAck)
		}
		if a := s.Alert; a != nil {
			r.State = a.State
			switch a.State {
			case schemas.AlertDown:
				r.Detail = fmt.Sprintf("failing since %s, %d failures", a.Since, a.Failures)
				if a.Error != "" {
					r.Detail += ": " + a.Error
				}
			case schemas.AlertResolved:
				r.Detail = fmt.Sprintf("recovered at %s after %d failures", a.Time, a.Failures)
			}
		}
		p.Destinations = append(p.Destinations, r)
	}
	return p
}
