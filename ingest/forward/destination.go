package forward

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/retry"
)

// destination is one destination's loop and what it holds: the batch
// being delivered, batches delivered but not yet confirmed (held, oldest
// first) and batches whose connection failed before they were confirmed
// (resend). Only the loop's goroutine touches them.
type destination struct {
	d        Destination
	s        sender
	nc       *nats.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	instance string
	ackWait  time.Duration
	// confirm is how long a delivery waits before its ack (syslog's
	// ConfirmAfter; 0 for HTTP, whose 2xx is the destination's word).
	confirm time.Duration
	stats   Stats
	outage  outage

	held, resend []*batch
}

// batch is the messages of one fetch and their events.
type batch struct {
	msgs   []jetstream.Msg
	events []Event
	token  uint64    // the sender's, for Lost
	at     time.Time // when it was delivered
}

func (b *batch) inProgress() {
	for _, m := range b.msgs {
		_ = m.InProgress()
	}
}

func newDestination(d Destination, s sender, nc *nats.Conn, js jetstream.JetStream, o Options) *destination {
	dst := &destination{d: d, s: s, nc: nc, js: js, instance: o.Instance, ackWait: o.AckWait,
		log: o.Logger.With("destination", d.Name)}
	dst.stats.Name = d.Name
	if d.Type == TypeSyslog {
		dst.confirm = time.Duration(d.ConfirmAfter)
	}
	return dst
}

// run is the destination's loop: fetch a batch, deliver it (retried until
// accepted), hold it until confirmed, ack it. It returns when ctx ends,
// after release.
//
// Shutdown order: ctx ends → the delivery being retried stops and its
// batch is nak'ed → release acks what is confirmed and naks the rest →
// the lag poller is waited for → the sender's connection is closed.
func (d *destination) run(ctx context.Context) {
	var cons jetstream.Consumer
	if err := retry.Do(ctx, d.log, "forward consumer "+ConsumerPrefix+d.d.Name, func() (err error) {
		cons, err = d.consumer(ctx)
		return err
	}); err != nil {
		return
	}
	d.log.Info("forwarding", "type", d.d.Type, "consumer", ConsumerPrefix+d.d.Name)
	var wg sync.WaitGroup
	pctx, stopPoll := context.WithCancel(ctx)
	wg.Go(func() { d.pollLag(pctx, cons) })
	defer func() {
		stopPoll()
		wg.Wait()
		_ = d.s.Close()
	}()
	defer d.release()
	for ctx.Err() == nil {
		d.settle(time.Now())
		if len(d.resend) > 0 {
			b := d.resend[0]
			d.resend = d.resend[1:]
			d.stats.resent.Add(uint64(len(b.events)))
			if !d.deliver(ctx, b) {
				return
			}
			continue
		}
		if d.pending()+d.d.BatchEvents > d.d.MaxPending && len(d.held) > 0 {
			sleep(ctx, time.Until(d.held[0].at.Add(d.confirm)))
			continue
		}
		msgs := d.fetch(ctx, cons)
		if len(msgs) == 0 {
			continue
		}
		if !d.deliver(ctx, d.newBatch(msgs)) {
			return
		}
	}
}

func (d *destination) newBatch(msgs []jetstream.Msg) *batch {
	b := &batch{msgs: msgs, events: make([]Event, len(msgs))}
	for i, m := range msgs {
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		b.events[i] = ParseEvent(m.Subject(), m.Data(), seq)
		if !b.events[i].JSON {
			d.log.Warn("forwarding a record that is not a JSON CloudEvent", "stream_seq", seq, "subject", m.Subject())
		}
	}
	return b
}

// deliver sends b until the destination accepts it, then acks it or, for
// syslog, holds it for confirmation. It returns false, with b nak'ed,
// when ctx ended first.
func (d *destination) deliver(ctx context.Context, b *batch) bool {
	err := d.retryPolicy(b).Run(ctx, "forward to "+d.d.Name, func() error {
		token, err := d.s.Send(ctx, b.events)
		if err != nil {
			d.failed(err)
			return err
		}
		b.token, b.at = token, time.Now()
		d.recovered()
		return nil
	}, "events", len(b.events))
	if err != nil {
		nak(b)
		return false
	}
	if d.confirm == 0 {
		d.ack(b)
		return true
	}
	d.held = append(d.held, b)
	return true
}

// settle acks the held batches that have been confirmed by now and moves
// those whose connection failed to resend.
func (d *destination) settle(now time.Time) {
	for len(d.held) > 0 {
		b := d.held[0]
		if d.s.Lost(b.token) {
			d.resend = append(d.resend, b)
		} else if now.Sub(b.at) >= d.confirm {
			d.ack(b)
		} else {
			return
		}
		d.held = d.held[1:]
	}
}

// release, on the way out, waits for the held batches' confirmation (at
// most ConfirmAfter) and acks or naks them; resends are nak'ed.
func (d *destination) release() {
	if len(d.held) > 0 {
		time.Sleep(time.Until(d.held[len(d.held)-1].at.Add(d.confirm)))
		d.settle(time.Now())
	}
	for _, b := range d.resend {
		nak(b)
	}
	d.held, d.resend = nil, nil
}

// pending is how many events are held or waiting to be sent again.
func (d *destination) pending() int {
	n := 0
	for _, b := range d.held {
		n += len(b.msgs)
	}
	for _, b := range d.resend {
		n += len(b.msgs)
	}
	return n
}

func (d *destination) ack(b *batch) {
	for _, m := range b.msgs {
		if err := m.Ack(); err != nil {
			d.log.Warn("forward ack", "err", err)
		}
	}
	d.stats.delivered.Add(uint64(len(b.msgs)))
}

func nak(b *batch) {
	for _, m := range b.msgs {
		_ = m.Nak()
	}
}

// pollLag refreshes the lag every second: the events of TALOS_AUDIT not
// yet delivered to this destination (pending and unacknowledged).
func (d *destination) pollLag(ctx context.Context, cons jetstream.Consumer) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(ictx)
		cancel()
		if err == nil {
			d.stats.lag.Store(lag(info))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lag is the events of TALOS_AUDIT not yet delivered to a destination's
// consumer: pending, and delivered but not acknowledged.
func lag(info *jetstream.ConsumerInfo) uint64 { return info.NumPending + uint64(info.NumAckPending) }
