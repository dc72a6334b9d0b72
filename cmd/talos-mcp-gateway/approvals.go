package main

import (
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/schemas"
)

// resolution is a responder's answer to a parked call: an accepted
// approve or reject control event.
type resolution struct {
	verb      string // schemas.VerbApprove or VerbReject
	actor     string
	receiptID string // the control receipt's id
}

// approvals listens for approve and reject control events (core NATS
// subscriptions on their TALOS_CONTROL subjects, which NATS permissions
// let only the control service publish) and hands each to the call parked
// on its tool_call_id. An event for a call this gateway is not waiting
// for is ignored.
type approvals struct {
	nc  *nats.Conn
	log *slog.Logger

	mu      sync.Mutex
	waiting map[string]chan resolution
	subs    []*nats.Subscription
}

func newApprovals(nc *nats.Conn, log *slog.Logger) *approvals {
	return &approvals{nc: nc, log: log, waiting: map[string]chan resolution{}}
}

// start subscribes; subscriptions made while NATS is away are sent when it
// returns.
func (a *approvals) start() {
	for _, verb := range []string{schemas.VerbApprove, schemas.VerbReject} {
		sub, err := a.nc.Subscribe(schemas.ControlSubject(verb), a.onEvent)
		if err != nil {
			a.log.Error("cannot listen for approvals; parked calls will time out", "verb", verb, "err", err)
			continue
		}
		a.subs = append(a.subs, sub)
	}
}

// expect registers a parked call; forget removes it.
func (a *approvals) expect(toolCallID string) <-chan resolution {
	ch := make(chan resolution, 1)
	a.mu.Lock()
	a.waiting[toolCallID] = ch
	a.mu.Unlock()
	return ch
}

func (a *approvals) forget(toolCallID string) {
	a.mu.Lock()
	delete(a.waiting, toolCallID)
	a.mu.Unlock()
}

// controlEvent is the part of a control receipt CloudEvent read here.
type controlEvent struct {
	ID   string `json:"id"`
	Data struct {
		Control *schemas.ControlRecord `json:"control"`
	} `json:"data"`
}

func (a *approvals) onEvent(m *nats.Msg) {
	var ev controlEvent
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
	case ch <- resolution{verb: rec.Verb, actor: rec.Actor, receiptID: ev.ID}:
	default: // already resolved; the first answer stands
	}
}
