package schemas

import "time"

// SubjectAlert is the root of operational alerts, core NATS, under the
// status subjects responders already read (talos.status.>): a heartbeat is
// talos.status.<worker_id>, one token, so a status watcher never takes an
// alert for a worker.
const SubjectAlert = SubjectStatus + "alert."

// ForwardAlertSubject is the subject of the alerts about a SIEM
// destination of talosd's forward role (talos.status.alert.forward.<name>).
func ForwardAlertSubject(destination string) string {
	return SubjectAlert + "forward." + destination
}

// Forward alert states.
const (
	// AlertDown: deliveries to the destination have failed for longer
	// than its alert limit; repeated every limit while it lasts.
	AlertDown = "down"
	// AlertResolved: a delivery succeeded again after an AlertDown.
	AlertResolved = "resolved"
)

// ForwardAlert is the payload of ForwardAlertSubject: a destination that
// stays down, or is back. Error is the forwarder's own description of the
// last failure (an address, a TLS or HTTP status error), never an event.
type ForwardAlert struct {
	Alert       string `json:"alert"` // "forward_destination"
	State       string `json:"state"` // AlertDown | AlertResolved
	Destination string `json:"destination"`
	Instance    string `json:"instance"`
	Since       string `json:"since"`   // first failure of this outage (RFC 3339)
	DownMS      int64  `json:"down_ms"` // how long it has lasted
	Failures    uint64 `json:"failures"`
	Error       string `json:"error,omitempty"`
	Time        string `json:"time"`
}

// ForwardStatus is one SIEM destination of the forward role as responders
// see it (the dashboard's incidents page): what its durable consumer on
// TALOS_AUDIT says, read from JetStream whichever process forwards, and
// the last alert raised for it.
type ForwardStatus struct {
	Name string // the destination's name (its consumer is talos-forward-<name>)
	// Lag is the events not yet delivered (pending and unacknowledged);
	// InFlight those delivered and not yet acknowledged.
	Lag, InFlight uint64
	// LastAck is when the destination last accepted a batch (zero: never).
	LastAck time.Time
	// Alert is the last alert seen for it; nil if none.
	Alert *ForwardAlert
}
