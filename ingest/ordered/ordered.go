// Package ordered follows a JetStream stream with an ordered consumer
// (Follow), re-created after a failure with Backoff, or reads it to its
// end (Scan), and hands a durable
// pull consumer's messages to a channel (Pull, built on Consume, or
// polling with pulls that do not wait): what the
// control follower, the enforcement point's approval reader, the enforce
// workers, the sink and the control service share; and Heartbeat, the idle
// heartbeat of every consumer Talos pulls from. It imports no other project
// package, so the enforcement-point library (ingest/ep) may use it and
// still link none of talosd.
package ordered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Heartbeat is how often the server of a consumer Talos keeps a pull open
// on says it is there while no message comes: Follow's ordered consumers,
// and the enforce workers' and the control service's durable ones (the
// sink polls, and a pull that does not wait needs none). In a
// NATS cluster a pull request waits on the node that leads the consumer;
// when that node stops (or a new consumer has no leader yet), the request is
// lost without a word, and the client notices only after two missed
// heartbeats, then pulls again (an ordered consumer is re-created from the
// next sequence). nats.go's defaults, 5 s for ordered consumers and 15 s
// for the others, would leave a follower unaware of new control events for
// over 10 s and a worker idle for 30 s.
const Heartbeat = time.Second

// followBuffer is how many events Follow's consumption hands over ahead of
// handle; the client library queues the rest.
const followBuffer = 64

// errStopped is Follow's error when its consumption stopped by itself.
var errStopped = errors.New("ordered consumer stopped")

// Follow reads stream through an ordered consumer of cfg (created within
// opTimeout) and hands each message to handle, in stream order and on the
// caller's goroutine, until ctx ends (nil), the consumption stops by itself
// (an error: the connection closed) or handle returns an error (that
// error). The consumer's server side is deleted when it returns.
// Shutdown: Follow stops the consumption (Consume) and waits for it before
// returning; no handle call happens after it returns.
func Follow(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig,
	opTimeout time.Duration, handle func(jetstream.Msg) error) error {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	cons, err := js.OrderedConsumer(cctx, stream, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("ordered consumer: %w", err)
	}
	defer deleteConsumer(js, stream, cons)
	msgs := make(chan jetstream.Msg, followBuffer)
	var consumed error
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(msgs)
		consumed = Consume(cctx, cons, msgs, nil)
	})
	defer func() {
		stop()
		wg.Wait()
	}()
	for m := range msgs {
		if ctx.Err() != nil {
			return nil
		}
		if err := handle(m); err != nil {
			return err
		}
	}
	switch {
	case consumed != nil:
		return fmt.Errorf("ordered consumer messages: %w", consumed)
	case ctx.Err() != nil:
		return nil
	}
	return errStopped
}

// Consume hands cons's messages to out, in the order they come, until ctx
// ends (nil) or the consumption stops by itself (nil, ctx still live: the
// consumer deleted or its connection closed); it returns an error only if
// the consumption cannot start. opts add to Heartbeat. onErr, if not nil,
// is told each error the client library recovers from by itself (it pulls
// again).
//
// While out is full the client library queues what a pull brought in the
// subscription's own buffer and pulls again only once it was handed over.
// A channel iterator (Messages) would drop what overflows its buffer, as
// happens when a pull made before a reconnect and one made after both
// deliver (nats.go "slow consumer"): a dropped message then comes back
// only after AckWait, or, on an ordered consumer, only once a later one
// shows the gap.
//
// Shutdown: a message being handed over when ctx ends is handed back
// (Nak); Consume then stops the consumption and returns once its handler
// has returned for good. Messages still queued in the client come again
// after AckWait.
func Consume(ctx context.Context, cons jetstream.Consumer, out chan<- jetstream.Msg, onErr func(error), opts ...jetstream.PullConsumeOpt) error {
	return consume(ctx, cons, out, onErr, false, opts...)
}

// consume is Consume; with watch, it also ends (nil) once the consumer is
// found gone after a pull nobody answered (see Pull).
func consume(ctx context.Context, cons jetstream.Consumer, out chan<- jetstream.Msg, onErr func(error), watch bool,
	opts ...jetstream.PullConsumeOpt) error {
	opts = append(opts, jetstream.PullHeartbeat(Heartbeat))
	unanswered := make(chan struct{}, 1)
	if onErr != nil || watch {
		opts = append(opts, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if watch && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat)) {
				select {
				case unanswered <- struct{}{}:
				default:
				}
			}
			if onErr != nil {
				onErr(err)
			}
		}))
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case out <- m:
		case <-ctx.Done():
			_ = m.Nak()
		}
	}, opts...)
	if err != nil {
		return err
	}
	closed := cc.Closed()
	for {
		select {
		case <-ctx.Done():
			cc.Stop()
			<-closed
			return nil
		case <-closed:
			return nil
		case <-unanswered:
			if consumerGone(ctx, cons) {
				cc.Stop()
				<-closed
				return nil
			}
		}
	}
}

// consumerGone reports whether the server says cons, or its stream, does
// not exist. Any other answer, or none within two heartbeats (a cluster
// electing a leader), is not taken for gone.
func consumerGone(ctx context.Context, cons jetstream.Consumer) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*Heartbeat)
	defer cancel()
	_, err := cons.Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// PullOptions says how Pull pulls and logs.
type PullOptions struct {
	// Batch is how many messages one pull asks for (PullMaxMessages).
	Batch int
	// What names the consumer's user in the log: "<What> consumer stopped".
	What string
	// OnErr is told each error the client library recovers from by itself.
	OnErr func(error)
	Log   *slog.Logger
	// Poll, when positive, takes the messages every Poll with a pull that
	// does not wait (poll) instead of keeping one open (Consume). A
	// consumer that need not have a message the moment it is stored (the
	// sink) then gets what was stored meanwhile in one delivery, where an
	// open pull has the server deliver each message as it is stored: a
	// wake-up of its own in the server and in the consumer's process, at
	// the moment the writer of that message waits for its acknowledgement.
	Poll time.Duration
}

// Pull hands cons's messages to out (Consume, or poll with o.Poll) until
// ctx ends, then returns nil. When the consumption stops by itself (the
// durable consumer deleted, its stream recreated), Pull waits a second
// and takes the consumer bind returns, which creates or binds it again;
// bind's error, with ctx still live, is Pull's. The messages not yet
// acked wait in the stream meanwhile. The server tells a pull waiting on
// a consumer that the consumer was deleted; a consumer deleted while no
// pull waits on it (before the first one, or while the connection was
// down) is answered by nobody, and the client library would pull for
// ever. So when a pull goes unanswered (no responders, missed
// heartbeats), or a poll's pull fails, Pull asks for the consumer's info,
// and if the server says the consumer or its stream does not exist, it
// takes that for the consumption stopping by itself.
func Pull(ctx context.Context, cons jetstream.Consumer, bind func(context.Context) (jetstream.Consumer, error),
	out chan<- jetstream.Msg, o PullOptions) error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	for {
		var err error
		if o.Poll > 0 {
			poll(ctx, cons, out, o)
		} else {
			err = consume(ctx, cons, out, o.OnErr, true, jetstream.PullMaxMessages(o.Batch))
		}
		if err != nil {
			return fmt.Errorf("%s fetch: %w", o.What, err)
		}
		if ctx.Err() != nil {
			return nil
		}
		o.Log.Warn(o.What+" consumer stopped; binding it again", "consumer", cons.CachedInfo().Name)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if cons, err = bind(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// poll hands cons's messages to out, pulling every o.Poll at most o.Batch
// of those stored meanwhile without waiting for more, until ctx ends or a
// pull fails and the server says the consumer or its stream does not
// exist (Pull then binds it again). Any other failed pull is told to
// o.OnErr and made again at the next tick. A message being handed over
// when ctx ends is handed back (Nak), as Consume does.
func poll(ctx context.Context, cons jetstream.Consumer, out chan<- jetstream.Msg, o PullOptions) {
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	for {
		b, err := cons.FetchNoWait(o.Batch)
		if err == nil {
			for m := range b.Messages() {
				select {
				case out <- m:
				case <-ctx.Done():
					_ = m.Nak()
				}
			}
			err = b.Error()
		}
		if err != nil && ctx.Err() == nil {
			if consumerGone(ctx, cons) {
				return
			}
			if o.OnErr != nil {
				o.OnErr(err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Scan reads stream through an ordered consumer of cfg from where cfg
// starts to the stream's end as of the last message read (no waiting for
// more), handing each message and its metadata to fn until fn returns
// false. A fetch that
// brings nothing within wait (the stream's end moved back, the server
// gone) is an error. It returns how many messages it read; the consumer's
// server side is deleted when it returns. Follow is for reading on.
func Scan(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig,
	wait time.Duration, fn func(jetstream.Msg, *jetstream.MsgMetadata) bool) (int, error) {
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", stream, err)
	}
	defer deleteConsumer(js, stream, cons)
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", stream, err)
	}
	if info.NumPending == 0 {
		return 0, nil
	}
	n := 0
	for {
		// A fetch ends when its batch is full or its wait is over; the
		// scan ends at the message with nothing pending after it.
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(wait))
		if err != nil {
			return n, fmt.Errorf("scan %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			n++
			md, err := m.Metadata()
			if err != nil {
				return n, fmt.Errorf("scan %s: %w", stream, err)
			}
			if !fn(m, md) || md.NumPending == 0 {
				return n, nil
			}
		}
		if err := batch.Error(); err != nil {
			return n, fmt.Errorf("scan %s: %w", stream, err)
		}
		if got == 0 {
			return n, fmt.Errorf("scan %s: no messages within %v", stream, wait)
		}
	}
}

// deleteConsumer removes the server side of a stopped ordered consumer
// (best effort: the server drops it anyway after its inactivity threshold).
func deleteConsumer(js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil || !js.Conn().IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}

// Backoff is the doubling wait between re-creating a failed consumer,
// from Min to Max; Reset after progress starts it again from Min.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Reset makes the next Wait the shortest again.
func (b *Backoff) Reset() { b.cur = 0 }

// Wait sleeps for the next interval; it returns false if ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	if b.cur == 0 {
		b.cur = b.Min
	} else if b.cur *= 2; b.cur > b.Max {
		b.cur = b.Max
	}
	t := time.NewTimer(b.cur)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// StartPull runs Pull on a goroutine of its own, into a channel of
// o.Batch messages that it closes once Pull has returned, for a caller
// that works on what a pull brought while the next one comes. stop ends
// Pull, waits for it, hands back (Nak) what is left in the channel and
// returns Pull's error: nil once ctx ended, or why the consumer could not
// be bound again. stop may be called more than once.
func StartPull(ctx context.Context, cons jetstream.Consumer, bind func(context.Context) (jetstream.Consumer, error),
	o PullOptions) (msgs <-chan jetstream.Msg, stop func() error) {
	out := make(chan jetstream.Msg, o.Batch)
	ctx, cancel := context.WithCancel(ctx)
	var pulled error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		pulled = Pull(ctx, cons, bind, out, o)
	}()
	return out, sync.OnceValue(func() error {
		cancel()
		<-done
		for m := range out {
			_ = m.Nak()
		}
		return pulled
	})
}
