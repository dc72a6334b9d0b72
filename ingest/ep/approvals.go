package ep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Resolution is a responder's answer to a parked call: an accepted
// approve or reject control event.
type Resolution struct {
	Verb      string // schemas.VerbApprove or VerbReject
	Actor     string
	ReceiptID string // the control receipt's id
}

// ApprovalOptions configure Approvals.
type ApprovalOptions struct {
	// Keys are talosd's public signing keys. An event is applied only if
	// one of them signed it; with none, no event is applied and every
	// parked call times out (fail closed), which Run says when it starts.
	Keys verify.KeySet
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Approvals is the enforcement point's side of require_approval: it
// follows the approve and reject events of TALOS_CONTROL and hands each
// to the call parked on its tool_call_id.
//
// It reads them with one JetStream ordered consumer per verb, filtered on
// the verb's subject (the only consumers an enforcement point's NATS user
// may create), starting after the stream's last event when Run starts. An
// ordered consumer re-creates itself from the next sequence after a
// disconnect or a server restart, so an event stored while the enforcement
// point was away is delivered when it is back.
//
// An event is applied only if all of these hold; otherwise it is logged
// (sequence, subject, reason, event id and key id), counted in Rejected,
// and skipped:
//
//   - verify.VerifyEvent passes with the keys of ApprovalOptions;
//   - it is a control receipt (type dev.talos.receipt.control.v1,
//     data.event_type "control") of an accepted command whose verb is the
//     record's, approve or reject, and the subject's;
//   - its signed control.seq is the stream sequence it is stored at.
//
// An event for a call this enforcement point is not waiting for is
// ignored.
type Approvals struct {
	js   jetstream.JetStream
	keys verify.KeySet
	log  *slog.Logger

	readyOnce sync.Once
	ready     chan struct{} // closed once the first sequence to read is known
	rejected  atomic.Uint64

	mu      sync.Mutex
	waiting map[string]chan Resolution
}

// approvalOpTimeout bounds each JetStream API call Approvals makes.
const approvalOpTimeout = 5 * time.Second

// NewApprovals builds the follower; Run follows TALOS_CONTROL.
func NewApprovals(js jetstream.JetStream, o ApprovalOptions) *Approvals {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Approvals{js: js, keys: o.Keys, log: o.Logger, ready: make(chan struct{}), waiting: map[string]chan Resolution{}}
}

// Ready is closed once Run knows the first sequence it reads (the
// stream's tail when it started), or at once without keys. A call parked
// after that cannot miss its answer: do not publish calls before.
func (a *Approvals) Ready() <-chan struct{} { return a.ready }

// Rejected is how many events Approvals refused to apply.
func (a *Approvals) Rejected() uint64 { return a.rejected.Load() }

// Run follows the approve and reject events until ctx ends. NATS being
// unreachable, the stream missing or a consumer failing are logged and
// retried (100 ms doubling to 5 s); Run returns when ctx ends or the NATS
// connection is closed, once the event being handled is done.
func (a *Approvals) Run(ctx context.Context) {
	if len(a.keys) == 0 {
		a.log.Error("no talosd public key to verify approvals with: approve and reject events are ignored, and calls that need an approval are denied when their wait times out")
		a.readyOnce.Do(func() { close(a.ready) })
		return
	}
	bo := ordered.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	var last uint64
	for {
		var err error
		if last, err = a.streamLast(ctx); err == nil {
			break
		}
		if ctx.Err() != nil || a.js.Conn().IsClosed() {
			return
		}
		a.log.Warn("approvals: waiting for the control stream", "stream", schemas.StreamControl, "err", err)
		if !bo.Wait(ctx) {
			return
		}
	}
	a.readyOnce.Do(func() { close(a.ready) })
	var wg sync.WaitGroup
	for _, verb := range []string{schemas.VerbApprove, schemas.VerbReject} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.follow(ctx, verb, last+1)
		}()
	}
	wg.Wait()
}

// streamLast is TALOS_CONTROL's last sequence (0 when it is empty).
func (a *Approvals) streamLast(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, approvalOpTimeout)
	defer cancel()
	s, err := a.js.Stream(ctx, schemas.StreamControl)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.LastSeq, nil
}

// follow reads verb's events from sequence next on, re-creating its
// consumer after a failure, until ctx ends or the connection is closed.
func (a *Approvals) follow(ctx context.Context, verb string, next uint64) {
	bo := ordered.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		before := next
		err := a.consume(ctx, verb, &next)
		if ctx.Err() != nil || a.js.Conn().IsClosed() {
			return
		}
		if next != before {
			bo.Reset()
		}
		a.log.Warn("approvals: consumer failed; re-creating it", "verb", verb, "next_seq", next, "err", err)
		if !bo.Wait(ctx) {
			return
		}
	}
}

// consume runs one ordered consumer of verb's subject from *next, which
// it advances past each event handled.
func (a *Approvals) consume(ctx context.Context, verb string, next *uint64) error {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{schemas.ControlSubject(verb)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    *next,
	}
	return ordered.Follow(ctx, a.js, schemas.StreamControl, cfg, approvalOpTimeout, func(m jetstream.Msg) error {
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("message without metadata: %w", err)
		}
		a.handle(m.Subject(), m.Data(), md.Sequence.Stream)
		*next = md.Sequence.Stream + 1
		return nil
	})
}

// handle checks one event and hands it to the call it resolves.
func (a *Approvals) handle(subject string, data []byte, seq uint64) {
	ev, why := checkApproval(subject, data, seq, a.keys)
	if why != "" {
		a.rejected.Add(1)
		attrs := []any{"seq", seq, "subject", subject, "why", why}
		if ev != nil {
			attrs = append(attrs, "event_id", ev.ID, "kid", ev.KID)
		}
		a.log.Error("approval event rejected", attrs...)
		return
	}
	rec := ev.Data.Control
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

// checkApproval verifies one approve or reject event stored at seq: the
// event and "" if it may be applied, else why not (with the event when it
// could be parsed; untrusted if its signature is why).
func checkApproval(subject string, data []byte, seq uint64, keys verify.KeySet) (*verify.Event, string) {
	ev, err := verify.VerifyEvent(data, keys)
	if err != nil {
		var ve *verify.VerifyError
		if errors.As(err, &ve) && ve.Kind != verify.ProblemMalformed {
			return ev, "signature invalid or untrusted (" + ve.Kind + ")"
		}
		return nil, "malformed event"
	}
	c := ev.Data.Control
	switch {
	case ev.Type != schemas.TypeReceiptControl || ev.Data.EventType != schemas.KindControl:
		return ev, "not a control receipt"
	case c == nil:
		return ev, "no control record"
	case !c.Accepted || c.Command == nil:
		return ev, "command not accepted"
	case c.Command.Verb != c.Verb || (c.Verb != schemas.VerbApprove && c.Verb != schemas.VerbReject):
		return ev, "not an approve or reject command"
	case subject != schemas.ControlSubject(c.Verb):
		return ev, "subject is not the verb's control subject"
	case c.Seq != seq:
		return ev, fmt.Sprintf("signed seq is not the stream sequence (re-published event): signed %d, stored at %d", c.Seq, seq)
	}
	return ev, ""
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
