package forward

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// Watcher follows the forward alerts (talos.status.alert.forward.>) and
// reads the destinations' consumers: the dashboard's view of forwarding.
type Watcher struct {
	js     jetstream.JetStream
	sub    *nats.Subscription
	mu     sync.Mutex
	alerts map[string]schemas.ForwardAlert
}

// Watch subscribes to the forward alerts. Close it when done.
func Watch(nc *nats.Conn, js jetstream.JetStream) (*Watcher, error) {
	w := &Watcher{js: js, alerts: map[string]schemas.ForwardAlert{}}
	sub, err := nc.Subscribe(schemas.ForwardAlertSubject(">"), func(m *nats.Msg) {
		var a schemas.ForwardAlert
		if json.Unmarshal(m.Data, &a) != nil || a.Destination == "" {
			return
		}
		w.mu.Lock()
		w.alerts[a.Destination] = a
		w.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("forward: follow alerts: %w", err)
	}
	w.sub = sub
	return w, nil
}

// Close stops following the alerts.
func (w *Watcher) Close() { _ = w.sub.Unsubscribe() }

// Statuses lists every destination with a consumer on TALOS_AUDIT, by
// name.
func (w *Watcher) Statuses(ctx context.Context) ([]schemas.ForwardStatus, error) {
	stream, err := w.js.Stream(ctx, schemas.StreamAudit)
	if err != nil {
		return nil, fmt.Errorf("forward: audit stream: %w", err)
	}
	var out []schemas.ForwardStatus
	list := stream.ListConsumers(ctx)
	for info := range list.Info() {
		name, ok := strings.CutPrefix(info.Name, ConsumerPrefix)
		if !ok {
			continue
		}
		s := schemas.ForwardStatus{Name: name, Lag: lag(info), InFlight: uint64(info.NumAckPending)}
		if info.AckFloor.Last != nil {
			s.LastAck = *info.AckFloor.Last
		}
		w.mu.Lock()
		if a, ok := w.alerts[name]; ok {
			s.Alert = &a
		}
		w.mu.Unlock()
		out = append(out, s)
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("forward: list consumers: %w", err)
	}
	slices.SortFunc(out, func(a, b schemas.ForwardStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
