package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Applier applies one verified control event to a worker's enforcement
// state. It is called from a single goroutine (the follower's Run), in
// TALOS_CONTROL stream order, each seq at most once per follower. rec has
// passed every check of ControlFollower (signature by a trusted talosd
// key, accepted mutating command, signed seq = stream seq); at is the
// event's CloudEvent time. An error is logged and the event still counts
// as processed: the follower does not retry it.
type Applier interface {
	Apply(seq uint64, rec *schemas.ControlRecord, at time.Time) error
}

// FollowerOptions configures a ControlFollower.
type FollowerOptions struct {
	// Keys are the trusted talosd signing keys. Required: a follower that
	// trusts nobody would reject every event.
	Keys verify.KeySet
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnApplied, if set, is called from Run after each event is processed
	// (applied or rejected), with caughtUp true once the follower has
	// reached the tail of the stream. It runs before the next event is
	// handled, so it must not block (a Heartbeat.Poke fits).
	OnApplied func(seq uint64, caughtUp bool)
}

// ControlFollower rebuilds a worker's enforcement state from TALOS_CONTROL
// (DESIGN.md §1): Run replays the stream from its first event, then tails
// it, handing each verified event to an Applier in stream order.
//
// An event is applied only if all of these hold; otherwise it is logged
// (sequence, subject, reason; never command contents beyond verb and
// target), counted in Rejected, and skipped:
//
//   - verify.VerifyEvent passes with the trusted keys;
//   - its type is dev.talos.receipt.control.v1 and data.event_type is "control";
//   - data.control is accepted, has a command, and command.verb equals
//     control.verb, which is a mutating verb (schemas.MutatingVerbs);
//   - data.control.seq equals the stream sequence the event is stored at
//     (a signed event re-published into the stream is refused), and the
//     subject is schemas.ControlSubject(verb);
//   - it has a CloudEvent time.
//
// Applied advances over rejected events too: they are processed, not
// pending. Reading the stream uses an ordered consumer, which re-creates
// itself from the next sequence after a gap, a reconnect or a server
// restart; if it fails anyway, Run creates a new one from Applied()+1.
//
// A follower assumes the stream is never deleted and re-created: its
// sequence must not go backwards.
type ControlFollower struct {
	js  jetstream.JetStream
	a   Applier
	o   FollowerOptions
	log *slog.Logger

	running  atomic.Bool
	applied  atomic.Uint64
	last     atomic.Uint64
	rejected atomic.Uint64
	caughtUp atomic.Bool

	// After a reconnect the follower may have missed events stored while
	// it was away (in a cluster, through the other nodes), and nothing
	// says so until it has read the stream's tail again. resyncGen counts
	// lost connections; syncTo is the tail read after reconnect syncToGen;
	// syncedGen is the last reconnect after which the follower reached that
	// tail. Current is true when syncedGen == resyncGen.
	resyncGen, syncToGen, syncedGen atomic.Uint64
	syncTo                          atomic.Uint64

	caughtOnce sync.Once
	caughtCh   chan struct{} // closed once caught up
}

// followerOpTimeout bounds each JetStream API call the follower makes.
const followerOpTimeout = 5 * time.Second

// NewControlFollower validates the options and returns a follower; call Run.
func NewControlFollower(js jetstream.JetStream, a Applier, o FollowerOptions) (*ControlFollower, error) {
	if js == nil {
		return nil, errors.New("ingest: control follower needs a JetStream context")
	}
	if a == nil {
		return nil, errors.New("ingest: control follower needs an applier")
	}
	if len(o.Keys) == 0 {
		return nil, errors.New("ingest: control follower needs the trusted talosd keys")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &ControlFollower{js: js, a: a, o: o, log: o.Logger, caughtCh: make(chan struct{})}, nil
}

// Applied is the last stream sequence processed (applied or rejected).
func (f *ControlFollower) Applied() uint64 { return f.applied.Load() }

// Last is the last stream sequence the follower knows of: the stream's
// last sequence when Run started, or a later one learned from the
// messages since.
func (f *ControlFollower) Last() uint64 { return f.last.Load() }

// CaughtUp reports whether the follower has processed every event that
// existed when Run started. It never goes back to false.
func (f *ControlFollower) CaughtUp() bool { return f.caughtUp.Load() }

// Current reports whether the follower is caught up and, since the NATS
// connection last reconnected, has processed every event the stream held
// once it was back: a worker decides calls only while it is current, so a
// worker that was cut off from a cluster does not decide with a state that
// misses the kill switches set meanwhile.
func (f *ControlFollower) Current() bool {
	return f.caughtUp.Load() && f.syncedGen.Load() == f.resyncGen.Load()
}

// Rejected is how many events the follower refused to apply.
func (f *ControlFollower) Rejected() uint64 { return f.rejected.Load() }

// WaitCaughtUp returns nil once every event that existed when Run started
// (the stream's last sequence then) has been processed, or ctx.Err() if
// ctx ends first. It may be called before Run starts.
func (f *ControlFollower) WaitCaughtUp(ctx context.Context) error {
	select {
	case <-f.caughtCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *ControlFollower) markCaughtUp() {
	f.caughtOnce.Do(func() {
		f.caughtUp.Store(true)
		close(f.caughtCh)
	})
}

// Run follows TALOS_CONTROL until ctx ends, then returns nil. NATS being
// unreachable, the stream not existing yet, or the consumer failing are
// logged and retried with a backoff (100 ms doubling to 5 s). It returns
// an error only if called twice or if the NATS connection is closed (it
// can never come back). Run returns once the event being applied is
// done; no Apply or OnApplied call happens after it returns.
func (f *ControlFollower) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("ingest: ControlFollower.Run called twice")
	}
	bo := ordered.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}

	// Where the stream ends now: WaitCaughtUp waits for this sequence.
	var target uint64
	for {
		t, err := f.streamLast(ctx)
		if err == nil {
			target = t
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if f.js.Conn().IsClosed() {
			return fmt.Errorf("ingest: control follower: NATS connection closed: %w", err)
		}
		f.log.Warn("control follower: stream info", "stream", schemas.StreamControl, "err", err)
		if !bo.Wait(ctx) {
			return nil
		}
	}
	if target > f.last.Load() {
		f.last.Store(target)
	}
	if target == 0 {
		f.markCaughtUp() // empty stream: nothing to replay
	}
	bo.Reset()
	resynced := f.watchReconnects(ctx)
	defer resynced()

	for ctx.Err() == nil {
		before := f.applied.Load()
		err := f.follow(ctx, target)
		if ctx.Err() != nil {
			break
		}
		if f.js.Conn().IsClosed() {
			return fmt.Errorf("ingest: control follower: NATS connection closed: %w", err)
		}
		if f.applied.Load() != before {
			bo.Reset() // it made progress: this is a new failure, not the same one
		}
		f.log.Warn("control follower: consumer failed; re-creating it", "applied", f.applied.Load(), "err", err)
		if !bo.Wait(ctx) {
			break
		}
	}
	return nil
}

// watchReconnects makes the follower not current from the moment its NATS
// connection is lost until, once reconnected, it has processed the
// stream's tail as read after the reconnect. Shutdown: the returned func
// stops the listener goroutine and waits for it.
func (f *ControlFollower) watchReconnects(ctx context.Context) (stop func()) {
	nc := f.js.Conn()
	events := nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var st nats.Status
			select {
			case <-ctx.Done():
				return
			case st = <-events:
			}
			if st == nats.RECONNECTING {
				f.resyncGen.Add(1)
				continue
			}
			f.log.Info("control follower: reconnected; reading the stream's tail before deciding again")
			if !f.readTail(ctx, f.resyncGen.Load()) {
				return
			}
		}
	})
	return func() {
		nc.RemoveStatusListener(events)
		cancel()
		wg.Wait()
	}
}

// readTail reads the stream's last sequence for reconnect gen, retrying
// until it has it (false if ctx ended first), and marks the follower
// current if it is there already.
func (f *ControlFollower) readTail(ctx context.Context, gen uint64) bool {
	bo := ordered.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	for {
		t, err := f.streamLast(ctx)
		if err == nil {
			f.syncTo.Store(t)
			f.syncToGen.Store(gen)
			f.markSynced(f.applied.Load())
			return true
		}
		if !bo.Wait(ctx) {
			return false
		}
	}
}

// markSynced makes the follower current again if applied reaches the
// tail read after the last reconnect.
func (f *ControlFollower) markSynced(applied uint64) {
	gen := f.resyncGen.Load()
	if f.syncedGen.Load() != gen && f.syncToGen.Load() == gen && applied >= f.syncTo.Load() {
		f.syncedGen.Store(gen)
		if f.caughtUp.Load() {
			f.log.Info("control follower: current again", "applied", applied)
		}
	}
}

// streamLast returns TALOS_CONTROL's last sequence, or 0 if it holds no
// message.
func (f *ControlFollower) streamLast(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, followerOpTimeout)
	defer cancel()
	s, err := f.js.Stream(ctx, schemas.StreamControl)
	if err != nil {
		return 0, err
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return 0, nil
	}
	return st.LastSeq, nil
}

// follow runs one ordered consumer from Applied()+1 until it fails or ctx
// ends (ordered.Follow).
func (f *ControlFollower) follow(ctx context.Context, target uint64) error {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if a := f.applied.Load(); a > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = a + 1
	}
	return ordered.Follow(ctx, f.js, schemas.StreamControl, cfg, followerOpTimeout, func(m jetstream.Msg) error {
		f.handle(m, target)
		return nil
	})
}

// handle processes one message: verify, apply or reject, advance.
func (f *ControlFollower) handle(m jetstream.Msg, target uint64) {
	md, err := m.Metadata()
	if err != nil {
		// An ordered consumer's messages always carry metadata.
		f.log.Error("control follower: message without metadata", "subject", m.Subject(), "err", err)
		return
	}
	seq := md.Sequence.Stream
	if seq <= f.applied.Load() {
		return // already processed (cannot happen with an ordered consumer)
	}
	if l := seq + md.NumPending; l > f.last.Load() {
		f.last.Store(l)
	}

	ev, at, why := followCheckEvent(m.Subject(), m.Data(), seq, f.o.Keys)
	if why != "" {
		f.rejected.Add(1)
		attrs := []any{"seq", seq, "subject", m.Subject(), "why", why}
		if ev != nil {
			attrs = append(attrs, "event_id", ev.ID, "kid", ev.KID)
			if c := ev.Data.Control; c != nil && !strings.HasPrefix(why, followWhyBadSignature) {
				attrs = append(attrs, "verb", c.Verb, "target", c.Target)
			}
		}
		f.log.Error("control event rejected", attrs...)
	} else {
		c := ev.Data.Control
		if err := f.a.Apply(seq, c, at); err != nil {
			f.log.Error("control event not applied", "seq", seq, "verb", c.Verb, "target", c.Target, "err", err)
		}
	}
	f.applied.Store(seq)
	f.markSynced(seq)
	caught := md.NumPending == 0 || seq >= target
	if caught {
		f.caughtUp.Store(true) // CaughtUp() is true inside OnApplied already
	}
	if f.o.OnApplied != nil {
		f.o.OnApplied(seq, caught)
	}
	if caught {
		f.markCaughtUp() // WaitCaughtUp returns after OnApplied
	}
}

// Reasons a control event is rejected (the "why" of the log line).
const (
	followWhyBadSignature = "signature invalid or untrusted"
	followWhyMalformed    = "malformed event"
	followWhyNotControl   = "not a control receipt"
	followWhyNoRecord     = "no control record"
	followWhyNotAccepted  = "command not accepted"
	followWhyNoCommand    = "no command"
	followWhyVerbMismatch = "command verb differs from control verb"
	followWhyNotMutating  = "verb does not mutate enforcement state"
	followWhySeqMismatch  = "signed seq is not the stream sequence (re-published event)"
	followWhyWrongSubject = "subject is not the verb's control subject"
	followWhyNoTime       = "no valid event time"
)

// followCheckEvent verifies one TALOS_CONTROL message. It returns the
// event (nil if it could not be parsed), its time, and "" if it may be
// applied, else why not. For an event with a bad or untrusted signature
// the returned event is untrusted.
func followCheckEvent(subject string, data []byte, seq uint64, keys verify.KeySet) (*verify.Event, time.Time, string) {
	ev, err := verify.VerifyEvent(data, keys)
	if err != nil {
		var ve *verify.VerifyError
		if errors.As(err, &ve) && ve.Kind != verify.ProblemMalformed {
			return ev, time.Time{}, followWhyBadSignature + " (" + ve.Kind + ")"
		}
		return nil, time.Time{}, followWhyMalformed
	}
	c := ev.Data.Control
	switch {
	case ev.Type != schemas.TypeReceiptControl || ev.Data.EventType != schemas.KindControl:
		return ev, time.Time{}, followWhyNotControl
	case c == nil:
		return ev, time.Time{}, followWhyNoRecord
	case !c.Accepted:
		return ev, time.Time{}, followWhyNotAccepted
	case c.Command == nil:
		return ev, time.Time{}, followWhyNoCommand
	case c.Command.Verb != c.Verb:
		return ev, time.Time{}, followWhyVerbMismatch
	case !schemas.MutatingVerbs[c.Verb]:
		return ev, time.Time{}, followWhyNotMutating
	case c.Seq != seq:
		return ev, time.Time{}, fmt.Sprintf("%s: signed %d, stored at %d", followWhySeqMismatch, c.Seq, seq)
	case subject != schemas.ControlSubject(c.Verb):
		return ev, time.Time{}, followWhyWrongSubject
	}
	at, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil {
		return ev, time.Time{}, followWhyNoTime
	}
	return ev, at, ""
}

// Precheck returns a ControlHooks.Precheck that judges a command with check
// once this follower has applied at least the control service's last seq,
// so a command is checked against every event before it (a pin right after
// its publish). It refuses with CtlInternal if the follower has not got
// there within wait.
func (f *ControlFollower) Precheck(check func(*schemas.ControlCommand) Verdict, wait time.Duration) func(context.Context, *schemas.ControlCommand, uint64) Verdict {
	return func(ctx context.Context, cmd *schemas.ControlCommand, lastSeq uint64) Verdict {
		ctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		for f.Applied() < lastSeq {
			select {
			case <-ctx.Done():
				return Verdict{Code: schemas.CtlInternal, Detail: fmt.Sprintf("control state not caught up (applied %d of %d); retry", f.Applied(), lastSeq)}
			case <-time.After(time.Millisecond):
			}
		}
		return check(cmd)
	}
}
