package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/ordered"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Decider decides calls in steps (see enforce.Decider): Begin does the
// local work, Resume finishes once the sender signature is verified and
// the ledger operations the call asks for have run. It must be safe for
// concurrent use, and it must answer every input: a malformed envelope is
// a deny with VAL-HTC-001, never an error. An error means no decision could
// be made (a shared store it consults is unreachable): the call is retried
// later and the enforcement point, meanwhile, fails closed. The receipt's
// EventType is its kind.
type Decider interface {
	Begin(subject string, raw []byte, now time.Time, receiptID string) (*enforce.Pending, error)
	Resume(p *enforce.Pending) (*enforce.Decided, error)
	// Ledger runs the ledger operations the decider asks for (the call
	// ledger its DeciderOptions name); nil if it asks for none.
	Ledger() enforce.CallLedger
	// Recorded is told of each call answered once its receipt is stored
	// and its ledger record final (enforce.Decider.Recorded).
	Recorded(o *enforce.Decided)
}

// WorkerOptions configures a Worker. The zero value of every field but
// Chains and Source means its default.
type WorkerOptions struct {
	// Consumer is the durable pull consumer on TALOS_CALLS shared by all
	// workers (default "talos-enforce").
	Consumer string
	// Chains are the hash chains this worker signs into. They are dealt
	// into lanes of MaxBatch chains (the last lane may have fewer), one
	// goroutine each: a chain is written by exactly one goroutine, and a
	// batch puts at most one receipt into each chain of its lane.
	Chains []*receipts.Chain
	// Source is the CloudEvent source, talos://enforce/<instance>.
	Source string
	// MaxBatch bounds the calls a lane takes at once, and so the chains of
	// a lane (default 16): the batch's signatures are verified together,
	// its ledger operations share one round trip, and its receipts, one per
	// chain, are published together and acknowledged once.
	MaxBatch int
	// MaxAckPending bounds calls in flight across all workers (default 4096).
	MaxAckPending int
	// AckWait is how long a fetched call may stay un-acked before JetStream
	// redelivers it (default 30 s).
	AckWait time.Duration
	// RetryBackoff is the first wait after a failed audit publish; it
	// doubles up to 5 s (default 50 ms). Publishing is retried until it
	// succeeds or the worker stops: an audit record is never dropped.
	RetryBackoff time.Duration
	// PublishTimeout bounds the wait for TALOS_AUDIT to acknowledge one
	// attempt at a receipt or a ToolCallEvent (default 2 s). In a cluster
	// a publish in flight to a stream leader that stops is never
	// acknowledged: the chain waits this long before it sends the same
	// bytes again (the Nats-Msg-Id dedupes them), so it bounds the stall
	// of a failover.
	PublishTimeout time.Duration
	// Checkpoints says when each chain cuts a signed checkpoint.
	Checkpoints checkpoint.Options
	Logger      *slog.Logger
	Now         func() time.Time
	// Tracer records each decision whose envelope names a sampled parent
	// span as a span of that trace (nil: none).
	Tracer trace.Tracer
	// Deciding, if set, says whether the worker may decide now (its
	// enforcement state is current: ControlFollower.Current). A batch taken
	// while it is false is nak'ed with a short delay, for this worker once
	// current again or for another.
	Deciding func() bool
}

// notDecidingDelay is how long a call a worker could not decide (its state
// not current) waits before it is delivered again.
const notDecidingDelay = 250 * time.Millisecond

// Worker consumes TALOS_CALLS, decides each call, stores one signed receipt
// per call and phase in TALOS_AUDIT, answers the enforcement point that
// published it (the ep_id of its subject) on
// talos.decision.<ep_id>.<phase>.<call>, which TALOS_DECISIONS keeps for
// it to ask again, and only then acks the call.
type Worker struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	d     Decider
	o     WorkerOptions
	audit jetstream.Stream
	log   *slog.Logger
	cp    *checkpoint.Publisher

	handled atomic.Uint64
}

// NewWorker validates the options and returns a worker; call Run.
func NewWorker(nc *nats.Conn, js jetstream.JetStream, d Decider, o WorkerOptions) (*Worker, error) {
	if d == nil {
		return nil, errors.New("ingest: worker needs a decider")
	}
	if len(o.Chains) == 0 {
		return nil, errors.New("ingest: worker needs at least one chain")
	}
	if o.Source == "" {
		return nil, errors.New("ingest: worker needs a CloudEvent source")
	}
	if o.Consumer == "" {
		o.Consumer = "talos-enforce"
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 16
	}
	if o.MaxAckPending <= 0 {
		o.MaxAckPending = 4096
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 50 * time.Millisecond
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Checkpoints = o.Checkpoints.WithDefaults()
	w := &Worker{nc: nc, js: js, d: d, o: o, log: o.Logger}
	w.cp = checkpoint.NewPublisher(js, o.Source, o.Now, o.Logger, o.RetryBackoff)
	return w, nil
}

// Handled is how many calls this worker has acked.
func (w *Worker) Handled() uint64 { return w.handled.Load() }

// Run consumes until ctx is cancelled. Calls handed to a lane but not
// finished are nak'ed so another worker takes them at once; calls the
// client library still queued come again after AckWait (ordered.Consume).
func (w *Worker) Run(ctx context.Context) error {
	// work holds as many calls as one pull brings; the lanes take them.
	// It holds enough to fill every lane's batch once, and at least 512,
	// but not more: calls pulled into a worker that dies wait AckWait
	// before another takes them, and MaxAckPending is shared by every
	// worker of the consumer.
	buffer := min(max(512, len(w.o.Chains)), w.o.MaxAckPending)
	// Owner: this function; it closes work once nothing can send on it,
	// then waits for the lanes, so no goroutine outlives Run.
	work := make(chan jetstream.Msg, buffer)
	var wg sync.WaitGroup
	for _, lane := range lanes(w.o.Chains, w.o.MaxBatch) {
		wg.Go(func() { w.runLane(ctx, lane, work) })
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	cons, err := w.consumer(ctx)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	// Consumed with a callback (ordered.Pull), not a channel iterator: a
	// call the iterator dropped would wait for AckWait, past its
	// enforcement point's deadline. A consumer that stops by itself
	// (deleted, or its stream recreated) is bound again; undecided calls
	// wait in the stream meanwhile.
	err = ordered.Pull(ctx, cons, w.consumer, work, ordered.PullOptions{
		Batch: buffer, What: "enforce", Log: w.log,
		// NATS unreachable, a missed heartbeat, the consumer being
		// recreated: the library pulls again by itself.
		OnErr: func(err error) { w.log.Warn("enforce fetch", "err", err) },
	})
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	return nil
}

// consumer creates or updates the workers' durable consumer of
// TALOS_CALLS, waiting out a cluster that is electing leaders.
func (w *Worker) consumer(ctx context.Context) (cons jetstream.Consumer, err error) {
	err = retry.Setup(ctx, w.nc, retry.SetupOptions{Log: w.log}, "enforce consumer "+w.o.Consumer, func(ctx context.Context) (err error) {
		if w.audit, err = w.js.Stream(ctx, schemas.StreamAudit); err != nil {
			return err
		}
		cons, err = w.js.CreateOrUpdateConsumer(ctx, schemas.StreamCalls, jetstream.ConsumerConfig{
			Durable:       w.o.Consumer,
			Description:   "Talos enforce workers",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       w.o.AckWait,
			MaxAckPending: w.o.MaxAckPending,
			FilterSubject: schemas.SubjectCallsAll,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		return err
	})
	return cons, err
}

// lanes deals chains into lanes of at most size chains each.
func lanes(chains []*receipts.Chain, size int) [][]*receipts.Chain {
	var out [][]*receipts.Chain
	for len(chains) > 0 {
		n := min(len(chains), size)
		out = append(out, chains[:n:n])
		chains = chains[n:]
	}
	return out
}

// runLane handles calls from work with one lane of chains until work is
// closed, a batch at a time: whatever is waiting when the lane is free, up
// to one call per chain. Each of its chains cuts a checkpoint every
// Checkpoints.Every receipts or Interval, and a final one when it stops
// (none when Checkpoints.Off).
//
// A batch being stored when ctx ends is finished on a context that ends
// PublishTimeout later, so that the receipts it stored are committed
// before the final checkpoints. If that context ends during a batch, a
// receipt whose store it cut short may be in the stream after all, and
// the chains of that batch get no final checkpoint, as after a crash.
func (w *Worker) runLane(ctx context.Context, chains []*receipts.Chain, work <-chan jetstream.Msg) {
	cpo := w.o.Checkpoints
	tick := time.NewTicker(cpo.Tick())
	defer tick.Stop()
	bctx, stopDrain := drainContext(ctx, w.o.PublishTimeout)
	defer stopDrain()
	unsettled := make([]bool, len(chains)) // the drain ended during a batch with a receipt in this chain
	final := func() {
		for i, ch := range chains {
			switch {
			case cpo.Off:
			case unsettled[i]:
				w.log.Warn("no final checkpoint: the stop may have cut a receipt's store short, so the chain's last receipt is not known; the verifier counts the receipts since the last checkpoint as uncovered", "chain_id", ch.ID())
			default:
				w.cp.Final(ch)
			}
		}
	}
	batch := make([]jetstream.Msg, 0, len(chains))
	for {
		select {
		case m, ok := <-work:
			if !ok {
				final()
				return
			}
			batch = append(batch[:0], m)
			open := true
		fill:
			for len(batch) < len(chains) {
				select {
				case m, ok := <-work:
					if !ok {
						open = false
						break fill
					}
					batch = append(batch, m)
				default:
					break fill
				}
			}
			if ctx.Err() != nil {
				for _, m := range batch {
					_ = m.Nak()
				}
			} else if w.o.Deciding != nil && !w.o.Deciding() {
				for _, m := range batch {
					_ = m.NakWithDelay(notDecidingDelay)
				}
			} else {
				used := w.handleBatch(bctx, chains, batch)
				// A drain that ended during the batch may have cut a
				// receipt's store short.
				for i := range used {
					unsettled[i] = unsettled[i] || bctx.Err() != nil
					if cpo.Full(chains[i]) {
						_ = w.cp.Cut(bctx, chains[i], false)
					}
				}
			}
			if !open {
				final()
				return
			}
		case <-tick.C:
			now := time.Now()
			for _, ch := range chains {
				if cpo.Due(ch, now) {
					_ = w.cp.Cut(ctx, ch, false)
				}
			}
		}
	}
}

// call is one message of a batch on its way through handleBatch.
type call struct {
	m    jetstream.Msg
	seq  uint64 // TALOS_CALLS stream sequence
	p    *enforce.Pending
	out  *enforce.Decided
	done bool // answered with a nak or term: nothing more to do

	// Set once the receipt is stored.
	dec      *wireDecision
	receipt  string // id of the stored receipt ("" if it could not be read back)
	dedupeID string
	server   string
	msgID    string
	after    []*enforce.LedgerOp
	// arrived is when TALOS_CALLS stored the call. prior is the receipt
	// and storedEvent whether the ToolCallEvent an earlier delivery
	// stored, when findStored looked (nil, false: none found).
	arrived     time.Time
	prior       []byte
	storedEvent bool
	// replyToken is the last token of the decision's subject: the
	// tool_call_id, or calls-seq-<n> when the envelope is malformed or has
	// none (DecisionSubject).
	replyToken string
	reply      *inflight // the decision reply on its way into TALOS_DECISIONS
	// chain signs the call's evidence: the chain its receipt is sealed
	// into, or the lane's first for a call answered with a stored receipt.
	chain *receipts.Chain
}

// drainContext returns a context that ends drain after ctx does, or when
// stop is called (a drain timer still running then cancels nothing more).
func drainContext(ctx context.Context, drain time.Duration) (_ context.Context, stop func()) {
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() { time.AfterFunc(drain, cancel) })
	return dctx, func() { stopAfter(); cancel() }
}

// inflight is one asynchronous publish of a batch to a stream that a call's
// ack waits for: its ToolCallEvent, or its decision reply.
type inflight struct {
	c    *call
	msg  *nats.Msg
	fut  jetstream.PubAckFuture // nil: the publish could not even be sent
	what string
	// buf, if set, holds msg.Data and goes back to replyBufs once the
	// stream acknowledged fut: the client library then holds the message
	// no longer (until then it may send it again by itself).
	buf *[]byte
}

// replyBufs recycles the buffers of decision replies (a reply embeds its
// receipt: about an eighth of the bytes a worker allocates).
var replyBufs = sync.Pool{New: func() any { return new([]byte) }}

// handleBatch decides a batch of calls, stores one receipt per call (and
// its ToolCallEvent), answers each enforcement point and acks. The work
// that can be shared is: the sender signatures are verified together, each
// round of ledger operations is one round trip for the batch, and the
// receipts, each sealed into a chain of its own, are published together
// and acknowledged once (storeReceipts). A chain thus never has more than
// one receipt in flight, so a receipt the stream refuses or drops as a
// duplicate never leaves a gap behind a later link. A call is acked only
// after its receipt and event are in TALOS_AUDIT; anything that fails
// before is retried. It returns how many of chains (the first ones) took
// a receipt.
func (w *Worker) handleBatch(ctx context.Context, chains []*receipts.Chain, msgs []jetstream.Msg) (used int) {
	now, began := w.o.Now().UTC(), time.Now()
	calls := make([]*call, 0, len(msgs))
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			w.log.Error("call without metadata", "subject", m.Subject(), "err", err)
			_ = m.Term()
			continue
		}
		c := &call{m: m, seq: md.Sequence.Stream, arrived: md.Timestamp}
		if c.p, err = w.begin(m.Subject(), m.Data(), now); err != nil {
			w.decideFailed(c, err)
		}
		calls = append(calls, c)
	}
	w.verifySenders(calls)
	w.resumeAll(calls)
	for _, c := range calls {
		if !c.done {
			c.identify()
		}
	}
	w.findStored(ctx, calls)
	used = w.storeReceipts(ctx, chains, calls, now)
	var waiting []*call // stored, answered once their ledger operations ran
	for _, c := range calls {
		if c.done {
			continue
		}
		if len(c.after) == 0 {
			w.answer(c)
		} else {
			waiting = append(waiting, c)
		}
	}
	if len(waiting) > 0 {
		w.ledgerAfter(ctx, waiting)
	}
	w.traceDecisions(calls, began)
	sent := w.storeEvents(ctx, calls, now)
	for _, c := range calls {
		if c.reply != nil {
			sent = append(sent, *c.reply)
		}
	}
	w.settle(ctx, sent)
	for _, c := range calls {
		if c.done {
			continue
		}
		if err := c.m.Ack(); err != nil {
			w.log.Warn("ack call", "msg_id", c.msgID, "err", err)
		}
		w.handled.Add(1)
	}
	return used
}

// verifySenders verifies the batch's sender signatures together, in one
// batch equation (verify.VerifyAllBatch: RFC 8032's cofactored check;
// a batch that fails is checked signature by signature with
// crypto/ed25519's rules).
func (w *Worker) verifySenders(calls []*call) {
	var checks []verify.SigCheck
	var of []*call
	for _, c := range calls {
		if c.done {
			continue
		}
		if s := c.p.Signature(); s != nil {
			checks = append(checks, *s)
			of = append(of, c)
		}
	}
	if len(checks) == 0 {
		return
	}
	for i, ok := range verify.VerifyAllBatch(checks) {
		of[i].p.Verified(ok)
	}
}

// resumeAll runs rounds of the batch's ledger operations, one round trip
// each, until every call is decided (or failed).
func (w *Worker) resumeAll(calls []*call) {
	pending := make([]*call, 0, len(calls))
	for _, c := range calls {
		if !c.done {
			pending = append(pending, c)
		}
	}
	for len(pending) > 0 {
		var ops []*enforce.LedgerOp
		for _, c := range pending {
			ops = append(ops, c.p.Ops()...)
		}
		if len(ops) > 0 { // only a decider with a ledger asks for operations
			w.d.Ledger().Do(ops)
		}
		next := pending[:0]
		for _, c := range pending {
			out, err := w.resume(c.p)
			switch {
			case err != nil:
				w.decideFailed(c, err)
			case out == nil:
				next = append(next, c)
			default:
				c.out = out
			}
		}
		pending = next
	}
}

// decideFailed leaves a call the decider could not decide for a retry.
func (w *Worker) decideFailed(c *call, err error) {
	w.log.Error("decider failed", "stream_seq", c.seq, "err", err)
	_ = c.m.NakWithDelay(time.Second)
	c.done = true
}

// seqID names a call by its TALOS_CALLS sequence, calls-seq-<n>, where
// its envelope names it by no tool_call_id it can be stored under.
func (c *call) seqID() string { return "calls-seq-" + strconv.FormatUint(c.seq, 10) }

// identify sets the ids the call's evidence is stored and answered
// under, from its decided receipt.
func (c *call) identify() {
	r := &c.out.Receipt
	seqID := c.seqID()
	// A call is its tool_call_id as its publisher (the subject's ep_id)
	// names it: another enforcement point's call with the same id never
	// takes this one's receipt or event.
	c.dedupeID = schemas.EPCallID(r.EPID, r.ToolCallID)
	if r.ToolCallID == "" || r.EPID == "" || slices.Contains(r.ReasonCodes, schemas.CodeEnvelopeInvalid) {
		c.dedupeID = seqID
	}
	c.replyToken = r.ToolCallID
	if c.dedupeID == seqID || !schemas.SafeToken(r.ToolCallID) {
		c.replyToken = seqID
	}
	c.server = r.ServerID
	if !schemas.ValidID(c.server) {
		c.server = "unknown"
	}
	c.msgID = schemas.AuditMsgID(c.dedupeID, r.Phase, r.EventType)
}

// storeReceipts stores the batch's receipts: each call's is sealed into
// the next chain of the lane (the i-th new receipt into chains[i]) and
// published at once, and the acknowledgements are awaited together, until
// one deadline. A receipt the stream acknowledged is committed to its
// chain; one it dropped as a duplicate is our own earlier attempt
// (committed) or another delivery's receipt (not committed: its chain
// does not advance); one not acknowledged is stored again alone, same
// bytes, until the stream has it (store). A call whose receipt an earlier
// delivery stored (found by findStored) takes no chain and is answered
// with that receipt. A call whose receipt could not be stored is left for
// a retry. It returns how many chains took a receipt.
func (w *Worker) storeReceipts(ctx context.Context, chains []*receipts.Chain, calls []*call, now time.Time) (used int) {
	type link struct {
		c       *call
		meta    receipts.Meta
		subject string
		sealed  *receipts.Sealed
		fut     jetstream.PubAckFuture // nil: the publish could not even be sent
	}
	links := make([]link, 0, len(calls))
	for _, c := range calls {
		if c.done {
			continue
		}
		if c.prior != nil {
			c.chain = chains[0]
			w.decided(c, c.prior, "")
			continue
		}
		c.chain = chains[used]
		used++
		r := &c.out.Receipt
		subjectID := r.ToolCallID
		if subjectID == "" {
			subjectID = c.seqID()
		}
		l := link{c: c, subject: schemas.ReceiptSubject(r.EventType, c.server), meta: receipts.Meta{
			ID:      c.out.ReceiptID,
			Type:    schemas.ReceiptType(r.EventType),
			Source:  w.o.Source,
			Subject: subjectID,
			Time:    now,
		}}
		var err error
		if l.sealed, err = c.chain.Seal(l.meta, r); err != nil {
			w.retryLater(ctx, c.m, "cannot sign receipt", c.msgID, err)
			c.done = true
			continue
		}
		msg := &nats.Msg{Subject: l.subject, Data: l.sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, c.msgID)
		if l.fut, err = w.js.PublishMsgAsync(msg); err != nil {
			l.fut = nil
		}
		links = append(links, l)
	}
	wctx, cancel := context.WithTimeout(ctx, w.o.PublishTimeout)
	defer cancel()
	for _, l := range links {
		c := l.c
		stored, sealedID, err := w.settleReceipt(wctx, c.chain, l.sealed, l.fut)
		if err != nil {
			// Not acknowledged (or its duplicate not read back): store
			// it alone, sealing the same bytes again, until the stream
			// has it.
			stored, sealedID, err = w.store(ctx, c.chain, c.m, l.meta, &c.out.Receipt, l.subject, c.msgID)
		}
		if err != nil {
			w.retryLater(ctx, c.m, "cannot store receipt", c.msgID, err)
			c.done = true
			continue
		}
		w.decided(c, stored, sealedID)
	}
	return used
}

// settleReceipt awaits the acknowledgement of a receipt published without
// waiting, sealed into ch, and settles it as store does (acknowledged). It
// returns an error when the stream did not acknowledge it by ctx's end or
// acknowledged's.
func (w *Worker) settleReceipt(ctx context.Context, ch *receipts.Chain, sealed *receipts.Sealed, fut jetstream.PubAckFuture) (stored []byte, sealedID string, err error) {
	if fut == nil {
		return nil, "", errors.New("not sent")
	}
	ack, err := awaitPubAck(ctx, fut)
	if err != nil {
		return nil, "", err
	}
	return w.acknowledged(ctx, ch, sealed, ack)
}

// acknowledged settles a receipt sealed into ch that the stream
// acknowledged with ack. The receipt itself, stored now or by an earlier
// attempt (a duplicate of the same bytes), is committed and returned with
// its id. Another delivery's receipt (a duplicate of other bytes) is
// returned without an id and the chain does not advance, so the dropped
// duplicate leaves no gap. A duplicate that cannot be read back is an
// error worth retrying; a link that cannot be committed is one wrapped by
// retry.Stop.
func (w *Worker) acknowledged(ctx context.Context, ch *receipts.Chain, sealed *receipts.Sealed, ack *jetstream.PubAck) (stored []byte, sealedID string, err error) {
	if ack.Duplicate {
		orig, err := w.audit.GetMsg(ctx, ack.Sequence)
		if err != nil {
			return nil, "", fmt.Errorf("read duplicate seq %d: %w", ack.Sequence, err)
		}
		if !bytes.Equal(orig.Data, sealed.JSON) {
			return orig.Data, "", nil
		}
	}
	if err := ch.Commit(sealed); err != nil {
		return nil, "", retry.Stop(err)
	}
	return sealed.JSON, sealed.ID, nil
}

// decided prepares the answer of a call whose receipt is stored: stored
// are its bytes, and sealedID its id when it is this delivery's own new
// link ("" when an earlier delivery's receipt stands for the call).
func (w *Worker) decided(c *call, stored []byte, sealedID string) {
	r := &c.out.Receipt
	dec := &wireDecision{epID: r.EPID, Decision: schemas.Decision{
		ToolCallID:     r.ToolCallID,
		Phase:          r.Phase,
		Decision:       r.Decision,
		ReasonCodes:    r.ReasonCodes,
		ReceiptID:      sealedID,
		RegistryDigest: r.RegistryDigest,
		Receipt:        stored,
		Details:        c.out.Details,
	}}
	if sealedID == "" {
		// A redelivery: answer with the receipt the stream already holds,
		// and record the call as that receipt decided it.
		var err error
		if dec, err = decisionFromReceipt(stored); err != nil {
			w.log.Error("stored receipt unreadable", "msg_id", c.msgID, "err", err)
			dec = nil
		} else {
			c.out.ToolCall = c.out.EventFor(dec.Decision.Decision, dec.Decision.ReasonCodes)
		}
	}
	c.dec = dec
	if dec != nil {
		c.receipt = dec.ReceiptID
		c.after = c.out.Stored(dec.ReceiptID, dec.Decision.Decision)
	}
}

// ledgerAfter runs the ledger operations of stored calls (one round trip)
// and answers each call whose operations succeeded; the others are left
// for a retry (their receipts are stored: the retry answers with them).
func (w *Worker) ledgerAfter(ctx context.Context, calls []*call) {
	var ops []*enforce.LedgerOp
	for _, c := range calls {
		ops = append(ops, c.after...)
	}
	w.d.Ledger().Do(ops) // Decided.Stored asks only with a ledger
	for _, c := range calls {
		var err error
		for _, op := range c.after {
			err = errors.Join(err, op.Err)
		}
		if err != nil {
			w.retryLater(ctx, c.m, "cannot record the decision in the call ledger", c.msgID, err)
			c.done = true
			continue
		}
		w.answer(c)
	}
}

// storeEvents signs the batch's ToolCallEvents with the chain's key and
// publishes them together (one per call: Nats-Msg-Id
// <ep_id>:<tool_call_id>:toolcall, or calls-seq-<n>:toolcall), for settle
// to await; a call whose event cannot be signed is left for a retry.
func (w *Worker) storeEvents(ctx context.Context, calls []*call, now time.Time) []inflight {
	var sent []inflight
	for _, c := range calls {
		if c.done || c.out.ToolCall == nil || c.storedEvent {
			continue
		}
		ev := c.out.ToolCall
		ev.ReceiptID = c.receipt
		subject := ev.ToolCallID
		if subject == "" {
			subject = c.dedupeID
		}
		sealed, err := c.chain.SignEvent(receipts.Meta{Type: schemas.TypeToolCall, Source: w.o.Source, Subject: subject, Time: now}, ev)
		if err != nil {
			w.retryLater(ctx, c.m, "cannot sign the ToolCallEvent", c.msgID, err)
			c.done = true
			continue
		}
		msg := &nats.Msg{Subject: schemas.ToolCallEventSubject(c.server), Data: sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, schemas.ToolCallEventMsgID(c.dedupeID))
		fut, err := w.js.PublishMsgAsync(msg)
		if err != nil {
			fut = nil
		}
		sent = append(sent, inflight{c: c, msg: msg, fut: fut, what: "ToolCallEvent"})
	}
	return sent
}

// settle awaits the batch's asynchronous publishes (ToolCallEvents into
// TALOS_AUDIT, decision replies into TALOS_DECISIONS) until one deadline:
// an async publish has no timeout of its own, and one lost with a stream
// leader would be waited for for ever. Each one not acknowledged by then
// is sent again alone, same bytes, until its stream takes it or ctx ends;
// its call is otherwise left for a retry, which stores and answers the
// same (a redelivery gets the receipt already stored).
func (w *Worker) settle(ctx context.Context, sent []inflight) {
	wctx, cancel := context.WithTimeout(ctx, w.o.PublishTimeout)
	defer cancel()
	for _, s := range sent {
		err := errors.New("not sent")
		if s.fut != nil {
			if err = awaitAck(wctx, s.fut); err == nil {
				if s.buf != nil {
					replyBufs.Put(s.buf)
				}
				continue
			}
		}
		if s.c.done {
			continue // already left for a retry
		}
		err = w.retry(s.c.m).Run(ctx, s.what+" publish", func() error {
			return w.publish(ctx, s.msg)
		}, "subject", s.msg.Subject, "call_msg_id", s.c.msgID, "first_err", err)
		if err != nil {
			w.retryLater(ctx, s.c.m, "cannot store the "+s.what, s.c.msgID, err)
			s.c.done = true
		}
	}
}

// retryLater leaves a call for redelivery: at once when shutting down
// (another worker takes it), else after a pause.
func (w *Worker) retryLater(ctx context.Context, m jetstream.Msg, what, msgID string, err error) {
	if ctx.Err() != nil {
		_ = m.Nak()
		return
	}
	w.log.Error(what, "msg_id", msgID, "err", err)
	_ = m.NakWithDelay(5 * time.Second)
}

// begin runs the Decider's Begin, turning a panic into an error (no
// decision). The call's receipt id is chosen here.
func (w *Worker) begin(subject string, raw []byte, now time.Time) (p *enforce.Pending, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return w.d.Begin(subject, raw, now, uuid.Must(uuid.NewV7()).String())
}

// resume runs the Decider's Resume, turning a panic into an error.
func (w *Worker) resume(p *enforce.Pending) (out *enforce.Decided, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	if out, err = w.d.Resume(p); err != nil || out == nil {
		return out, err
	}
	if k := out.Receipt.EventType; k != schemas.KindDecision && k != schemas.KindEffect {
		return nil, fmt.Errorf("decider returned kind %q", k)
	}
	return out, nil
}

// store seals r into ch and publishes it with msgID until JetStream has it.
// It returns the stored bytes, and the receipt id when the stored receipt is
// this call's own new link ("" when an earlier delivery's receipt won).
func (w *Worker) store(ctx context.Context, ch *receipts.Chain, m jetstream.Msg, meta receipts.Meta, r *schemas.Receipt, subject, msgID string) (stored []byte, sealedID string, err error) {
	err = w.retry(m).Run(ctx, "audit publish", func() error {
		sealed, err := ch.Seal(meta, r)
		if err != nil {
			return retry.Stop(fmt.Errorf("seal: %w", err))
		}
		msg := &nats.Msg{Subject: subject, Data: sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
		pctx, cancel := context.WithTimeout(ctx, w.o.PublishTimeout)
		ack, err := w.js.PublishMsg(pctx, msg)
		cancel()
		if err != nil {
			return err
		}
		stored, sealedID, err = w.acknowledged(ctx, ch, sealed, ack)
		return err
	}, "msg_id", msgID)
	if err != nil {
		return nil, "", err
	}
	return stored, sealedID, nil
}

// awaitAck waits for fut's acknowledgement until ctx ends; an
// acknowledgement already there counts even if ctx has ended.
func awaitAck(ctx context.Context, fut jetstream.PubAckFuture) error {
	_, err := awaitPubAck(ctx, fut)
	return err
}

// awaitPubAck is awaitAck returning the acknowledgement.
func awaitPubAck(ctx context.Context, fut jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case ack := <-fut.Ok():
		return ack, nil
	case err := <-fut.Err():
		return nil, err
	default:
	}
	select {
	case ack := <-fut.Ok():
		return ack, nil
	case err := <-fut.Err():
		return nil, err
	case <-ctx.Done():
		return nil, fmt.Errorf("no acknowledgement: %w", ctx.Err())
	}
}

// publish stores msg in its stream (TALOS_AUDIT, or TALOS_DECISIONS for a
// decision reply), waiting at most PublishTimeout.
func (w *Worker) publish(ctx context.Context, msg *nats.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, w.o.PublishTimeout)
	defer cancel()
	_, err := w.js.PublishMsg(ctx, msg)
	return err
}

// retry is the worker's retry policy for the evidence of call m.
func (w *Worker) retry(m jetstream.Msg) retry.Policy {
	return retry.Policy{First: w.o.RetryBackoff, Max: 5 * time.Second, KeepAlive: w.o.AckWait / 3, Log: w.log,
		InProgress: func() { _ = m.InProgress() }}
}

// answer prepares the call's decision reply once its receipt is stored
// and the ledger holds its final record (Decided.Stored's operations ran),
// which the decider then keeps for the call's post event.
func (w *Worker) answer(c *call) {
	w.d.Recorded(c.out)
	w.reply(c)
}

// reply answers the enforcement point c's decision names, on the call's
// own subject talos.decision.<ep_id>.<phase>.<call>: the enforcement
// point receives it as it is published, and TALOS_DECISIONS stores it for
// the enforcement point to ask again. The publish is asynchronous; settle
// awaits it before the call is acked, so an acked call's decision can
// always be asked for again. A nil decision (a stored receipt that could
// not be read back) and an invalid ep_id are not answered.
func (w *Worker) reply(c *call) {
	d := c.dec
	if d == nil || !schemas.ValidID(d.epID) || (d.Phase != schemas.PhasePre && d.Phase != schemas.PhasePost) {
		return
	}
	buf := replyBufs.Get().(*[]byte)
	*buf = appendDecision((*buf)[:0], &d.Decision)
	msg := &nats.Msg{Subject: schemas.DecisionSubject(d.epID, d.Phase, c.replyToken), Data: *buf}
	fut, err := w.js.PublishMsgAsync(msg)
	if err != nil {
		w.log.Warn("publish decision", "ep_id", d.epID, "err", err)
		fut = nil
	}
	c.reply = &inflight{c: c, msg: msg, fut: fut, what: "decision reply", buf: buf}
}

// wireDecision is a decision reply and the enforcement point it goes to.
type wireDecision struct {
	schemas.Decision
	epID string
}

// decisionFromReceipt rebuilds the decision reply from a stored receipt.
func decisionFromReceipt(raw []byte) (*wireDecision, error) {
	var ev struct {
		ID   string          `json:"id"`
		Data schemas.Receipt `json:"data"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, err
	}
	r := ev.Data
	return &wireDecision{epID: r.EPID, Decision: schemas.Decision{
		ToolCallID:     r.ToolCallID,
		Phase:          r.Phase,
		Decision:       r.Decision,
		ReasonCodes:    r.ReasonCodes,
		ReceiptID:      ev.ID,
		RegistryDigest: r.RegistryDigest,
		Receipt:        raw,
	}}, nil
}

// appendDecision appends d to b as JSON (decision.schema.json), field by
// field, with its receipt spliced in as stored: json.Marshal would
// re-validate and re-compact the receipt's bytes, and reflect over the
// rest. The receipt is JSON by construction: this worker sealed it, or read
// it back from TALOS_AUDIT, where only workers write.
func appendDecision(b []byte, d *schemas.Decision) []byte {
	b = slices.Grow(b, 256+len(d.Receipt)+64*len(d.Details))
	b = append(b, `{"tool_call_id":`...)
	b = jsonkit.AppendString(b, d.ToolCallID)
	b = append(b, `,"phase":`...)
	b = jsonkit.AppendString(b, d.Phase)
	b = append(b, `,"decision":`...)
	b = jsonkit.AppendString(b, d.Decision)
	b = append(b, `,"reason_codes":`...)
	b = appendStrings(b, d.ReasonCodes)
	b = append(b, `,"receipt_id":`...)
	b = jsonkit.AppendString(b, d.ReceiptID)
	b = append(b, `,"registry_digest":`...)
	b = jsonkit.AppendString(b, d.RegistryDigest)
	b = append(b, `,"receipt":`...)
	if len(d.Receipt) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, d.Receipt...)
	}
	if len(d.Details) > 0 {
		b = append(b, `,"details":`...)
		b = appendStrings(b, d.Details)
	}
	return append(b, '}')
}

// appendStrings appends ss as a JSON array of strings (null if nil, as
// encoding/json writes a nil slice).
func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonkit.AppendString(b, s)
	}
	return append(b, ']')
}
