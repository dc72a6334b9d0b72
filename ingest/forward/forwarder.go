package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/schemas"
)

// ConsumerPrefix starts the name of each destination's durable consumer
// on TALOS_AUDIT: talos-forward-<name>.
const ConsumerPrefix = "talos-forward-"

// Options configure New. Zero values mean defaults.
type Options struct {
	// Instance names this process in alerts, and is the syslog HOSTNAME
	// and HEC host of destinations that set none (default "talosd").
	Instance string
	// AckWait is the consumers' redelivery timer (default 30s); a batch
	// whose delivery is being retried is kept in progress.
	AckWait time.Duration
	Logger  *slog.Logger
}

// sender delivers events to one destination. Send returns nil only once
// the destination accepted every event (syslog: written and flushed;
// HTTP: a 2xx answer), and a token for Lost: whether what was sent under
// it may since have been lost (a syslog connection that failed). Both
// are called from the destination's loop only.
type sender interface {
	Send(ctx context.Context, events []Event) (token uint64, err error)
	Lost(token uint64) bool
	Close() error
}

// Forwarder is the forward role: one loop per destination, each on its
// own durable consumer.
type Forwarder struct {
	dests []*destination
	log   *slog.Logger
}

// New checks c, reads the destinations' CA, certificate and token files,
// and prepares a loop per destination; Run starts them.
func New(nc *nats.Conn, js jetstream.JetStream, c Config, o Options) (*Forwarder, error) {
	if o.Instance == "" {
		o.Instance = "talosd"
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if len(c.Destinations) == 0 {
		return nil, errors.New("forward: no destinations")
	}
	f := &Forwarder{log: o.Logger}
	seen := map[string]bool{}
	for _, raw := range c.Destinations {
		d, err := raw.withDefaults(o.Instance)
		if err != nil {
			return nil, fmt.Errorf("forward: %w", err)
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("forward: destination %s named twice", d.Name)
		}
		seen[d.Name] = true
		if d.Type == TypeSyslog && time.Duration(d.ConfirmAfter) > o.AckWait/2 {
			return nil, fmt.Errorf("forward: destination %s: confirm_after %s must be at most half the ack wait (%s)", d.Name, time.Duration(d.ConfirmAfter), o.AckWait)
		}
		s, err := newSender(d)
		if err != nil {
			return nil, fmt.Errorf("forward: %w", err)
		}
		f.dests = append(f.dests, newDestination(d, s, nc, js, o))
	}
	return f, nil
}

func newSender(d Destination) (sender, error) {
	if d.Type == TypeSyslog {
		return newSyslogSender(d)
	}
	return newHTTPSender(d)
}

// Run forwards until ctx ends, each destination on its own goroutine
// (owned here: Run returns once all have stopped and released what they
// held). It returns nil when ctx ends.
func (f *Forwarder) Run(ctx context.Context) error {
	f.log.Info("forward role started", "destinations", f.Names())
	var wg sync.WaitGroup
	for _, d := range f.dests {
		wg.Go(func() { d.run(ctx) })
	}
	wg.Wait()
	return nil
}

// Stats are the destinations' counters, in configuration order.
func (f *Forwarder) Stats() []*Stats {
	out := make([]*Stats, len(f.dests))
	for i, d := range f.dests {
		out[i] = &d.stats
	}
	return out
}

// Names are the destinations' names, in configuration order.
func (f *Forwarder) Names() []string {
	out := make([]string, len(f.dests))
	for i, d := range f.dests {
		out[i] = d.d.Name
	}
	return out
}

// consumer creates the destination's durable consumer, or updates it
// keeping where it starts (a cursor is never moved by a new setting).
func (d *destination) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       ConsumerPrefix + d.d.Name,
		Description:   "Talos SIEM forwarder: " + d.d.Type + " " + d.d.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       d.ackWait,
		MaxAckPending: d.d.MaxPending,
		// The signed records only: the log role's index records
		// (talos.audit.log.index) are no evidence of their own.
		FilterSubjects: schemas.SignedAuditSubjects(),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if d.d.Start == "new" {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if old, err := d.js.Consumer(ctx, schemas.StreamAudit, cfg.Durable); err == nil {
		info := old.CachedInfo()
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = info.Config.DeliverPolicy, info.Config.OptStartSeq, info.Config.OptStartTime
	}
	return d.js.CreateOrUpdateConsumer(ctx, schemas.StreamAudit, cfg)
}

// fetch takes up to BatchEvents messages, waiting at most BatchAge. The
// wait is the server's (FetchMaxWait): a client-side deadline could end
// the fetch while messages are on their way, which JetStream would then
// count as delivered and redeliver only after AckWait.
func (d *destination) fetch(ctx context.Context, cons jetstream.Consumer) []jetstream.Msg {
	mb, err := cons.Fetch(d.d.BatchEvents, jetstream.FetchMaxWait(time.Duration(d.d.BatchAge)))
	if err != nil {
		d.log.Debug("forward fetch", "err", err)
		sleep(ctx, 100*time.Millisecond)
		return nil
	}
	var msgs []jetstream.Msg
	for m := range mb.Messages() {
		msgs = append(msgs, m)
	}
	if err := mb.Error(); err != nil && len(msgs) == 0 {
		d.log.Debug("forward fetch", "err", err)
		sleep(ctx, 100*time.Millisecond)
	}
	return msgs
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// retryPolicy is how a batch's delivery is retried: never dropped,
// backing off from 100 ms to 5 s, every message held kept in progress.
func (d *destination) retryPolicy(b *batch) retry.Policy {
	return retry.Policy{First: 100 * time.Millisecond, Max: 5 * time.Second, KeepAlive: d.ackWait / 3, Log: d.log,
		InProgress: func() {
			b.inProgress()
			for _, h := range d.held {
				h.inProgress()
			}
			for _, h := range d.resend {
				h.inProgress()
			}
		}}
}
