package ep

import (
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// Resolution is a responder's answer to a parked call: an accepted
// approve or reject control event.
type Resolution struct {
	Verb      string // schemas.VerbApprove or VerbReject
	Actor     string
	ReceiptID string // the control receipt's id
}

// Approvals is the enforcement point's side of require_approval: it
// listens for approve and reject control events (core NATS subscriptions
// on their TALOS_CONTROL subjects, which NATS permissions let only the
// control service publish) and hands each to the call parked on its
// tool_call_id. An event for a call this enforcement point is not waiting
// for is ignored. Its subscriptions end with the NATS connection.
type Approvals struct {
	nc  *nats.Conn
	log *slog.Logger

	mu      sync.Mutex
	waiting map[string]chan Resolution
	subs    []*nats.Subscription
}

// NewApprovals builds the listener; Start subscribes.
func NewApprovals(nc *nats.Conn, log *slog.Logger) *Approvals {
	return &Approvals{nc: nc, log: log, waiting: map[string]chan Resolution{}}
}

// Start subscribes; subscriptions made while NATS is away are sent when it
// returns.
func (a *Approvals) Start() {
	for _, verb := range []string{schemas.VerbApprove, schemas.VerbReject} {
		sub, err := a.nc.Subscribe(schemas.ControlSubject(verb), a.onEvent)
		if err != nil {
			a.log.Error("cannot listen for approvals; parked calls will time out", "verb", verb, "err", err)
			continue
		}
		a.subs = append(a.subs, sub)
	}
}

// Expect registers a parked call: its resolution arrives on the channel.
// Call it before the call is published, so no answer is missed.
func (a *Approvals) Expect(toolCallID string) <-chan Resolution {
	ch := make(chan Resolution, 1)
	a.mu.Lock()
	a.waiting[toolCallID] = ch
	a.mu.Unlock()
	return ch
}

// Forget removes a call Expect registered.
func (a *Approvals) Forget(toolCallID string) {
	a.mu.Lock()
	delete(a.waiting, toolCallID)
	a.mu.Unlock()
}

// approvalEvent is the part of a control receipt CloudEvent Approvals reads.
type approvalEvent struct {
	ID   string `json:"id"`
	Data struct {
		Control *schemas.ControlRecord `json:"control"`
	} `json:"data"`
}

func (a *Approvals) onEvent(m *nats.Msg) {
	var ev approvalEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Data.Control == nil {
		a.log.Warn("unreadable control event on " + m.Subject)
		return
	}
	rec := ev.Data.Control
	if !rec.Accepted || (rec.Verb != schemas.VerbApprove && rec.Verb != schemas.VerbReject) {
		return
	}
	a.mu.Lock()
	ch := a.waiting[rec.Target]
	a.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- Resolution{Verb: rec.Verb, Actor: rec.Actor, ReceiptID: ev.ID}:
	default: // already resolved; the first answer stands
	}
}
