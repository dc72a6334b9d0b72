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

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Decider turns one raw call message into unsigned receipt data (Chain and
// Signature are filled when it is sealed) and, for humans, details that
// never contain argument values. It must be safe for concurrent use, and
// it must answer every input: a malformed envelope is a deny with
// VAL-HTC-001, never an error. An error means no decision could be made
// (a shared store it consults is unreachable): the call is retried later
// and the enforcement point, meanwhile, fails closed. The receipt's
// EventType is its kind.
//
// The decision may carry the call's ToolCallEvent (published, signed by
// the chain's key, once the receipt is stored) and a Commit hook the
// worker runs with the receipt id before it answers.
type Decider interface {
	DecideCall(subject string, raw []byte, now time.Time) (*enforce.Decided, error)
}

// WorkerOptions configures a Worker. The zero value of every field but
// Chains and Source means its default.
type WorkerOptions struct {
	// Consumer is the durable pull consumer on TALOS_CALLS shared by all
	// workers (default "talos-enforce").
	Consumer string
	// Chains are the hash chains this worker signs into, one goroutine
	// each; a chain is written by exactly one goroutine.
	Chains []*receipts.Chain
	// Source is the CloudEvent source, talos://enforce/<instance>.
	Source string
	// MaxAckPending bounds calls in flight across all workers (default 4096).
	MaxAckPending int
	// AckWait is how long a fetched call may stay un-acked before JetStream
	// redelivers it (default 30 s).
	AckWait time.Duration
	// RetryBackoff is the first wait after a failed audit publish; it
	// doubles up to 5 s (default 50 ms). Publishing is retried until it
	// succeeds or the worker stops: an audit record is never dropped.
	RetryBackoff time.Duration
	// Checkpoints says when each chain cuts a signed checkpoint.
	Checkpoints CheckpointOptions
	Logger      *slog.Logger
	Now         func() time.Time
}

// Worker consumes TALOS_CALLS, decides each call, stores one signed receipt
// per call and phase in TALOS_AUDIT, answers on talos.decision.<ep_id>, and
// only then acks the call.
type Worker struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	d     Decider
	o     WorkerOptions
	audit jetstream.Stream
	log   *slog.Logger
	cp    *checkpointer

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
	if o.MaxAckPending <= 0 {
		o.MaxAckPending = 4096
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 50 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Checkpoints = o.Checkpoints.withDefaults()
	w := &Worker{nc: nc, js: js, d: d, o: o, log: o.Logger}
	w.cp = newCheckpointer(js, o.Source, o.Now, o.Logger, o.RetryBackoff)
	return w, nil
}

// Handled is how many calls this worker has acked.
func (w *Worker) Handled() uint64 { return w.handled.Load() }

// Run consumes until ctx is cancelled. Messages fetched but not finished
// are nak'ed so another worker takes them at once.
func (w *Worker) Run(ctx context.Context) error {
	audit, err := w.js.Stream(ctx, schemas.StreamAudit)
	if err != nil {
		return fmt.Errorf("ingest: audit stream: %w", err)
	}
	w.audit = audit
	cons, err := w.js.CreateOrUpdateConsumer(ctx, schemas.StreamCalls, jetstream.ConsumerConfig{
		Durable:       w.o.Consumer,
		Description:   "Talos enforce workers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.o.AckWait,
		MaxAckPending: w.o.MaxAckPending,
		FilterSubject: schemas.SubjectCallsAll,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("ingest: enforce consumer: %w", err)
	}
	buffer := 64 * len(w.o.Chains)
	if buffer > w.o.MaxAckPending {
		buffer = w.o.MaxAckPending
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(buffer))
	if err != nil {
		return fmt.Errorf("ingest: enforce fetch: %w", err)
	}
	// work holds as many messages as the iterator's own buffer, so the
	// fetch loop never blocks on busy chains: around a reconnect the client
	// library may pull a fresh batch while its buffer is still full, and
	// what does not fit is dropped client-side (redelivered only after
	// AckWait).
	work := make(chan jetstream.Msg, buffer)
	var wg sync.WaitGroup
	for _, ch := range w.o.Chains {
		wg.Add(1)
		go func(ch *receipts.Chain) {
			defer wg.Done()
			w.runChain(ctx, ch, work)
		}(ch)
	}
	// Owner of `work`: this loop; it closes the channel, then waits for the
	// chain goroutines, so no goroutine outlives Run.
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				break
			}
			// NATS unreachable or the consumer is being recreated: back off
			// rather than spin; undecided calls wait in the stream.
			w.log.Warn("enforce fetch", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		work <- m
	}
	close(work)
	wg.Wait()
	return nil
}

// runChain handles calls from work with one chain until work is closed,
// cutting a checkpoint every Checkpoints.Every receipts or Interval, and a
// final one when it stops.
func (w *Worker) runChain(ctx context.Context, ch *receipts.Chain, work <-chan jetstream.Msg) {
	cpo := w.o.Checkpoints
	tick := time.NewTicker(cpo.tick())
	defer tick.Stop()
	for {
		select {
		case m, ok := <-work:
			if !ok {
				w.cp.final(ch)
				return
			}
			if ctx.Err() != nil {
				_ = m.Nak()
				continue
			}
			w.handle(ctx, ch, m)
			if n, _ := ch.Pending(); n >= uint64(cpo.Every) {
				_ = w.cp.cut(ctx, ch, false)
			}
		case <-tick.C:
			if cpo.due(ch, time.Now()) {
				_ = w.cp.cut(ctx, ch, false)
			}
		}
	}
}

// handle decides one call, stores its receipt (and ToolCallEvent), answers
// the enforcement point and acks. A call is acked only after its receipt
// and event are in TALOS_AUDIT; anything that fails before is retried.
func (w *Worker) handle(ctx context.Context, ch *receipts.Chain, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		w.log.Error("call without metadata", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	now := w.o.Now().UTC()
	out, err := w.decide(m.Subject(), m.Data(), now)
	if err != nil {
		w.log.Error("decider failed", "stream_seq", md.Sequence.Stream, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	r := &out.Receipt
	kind := r.EventType
	seqID := "calls-seq-" + strconv.FormatUint(md.Sequence.Stream, 10)
	dedupeID := r.ToolCallID
	if dedupeID == "" || slices.Contains(r.ReasonCodes, schemas.CodeEnvelopeInvalid) {
		dedupeID = seqID
	}
	subjectID := r.ToolCallID
	if subjectID == "" {
		subjectID = seqID
	}
	server := r.ServerID
	if !schemas.ValidID(server) {
		server = "unknown"
	}
	msgID := schemas.AuditMsgID(dedupeID, r.Phase, kind)
	meta := receipts.Meta{
		ID:      uuid.Must(uuid.NewV7()).String(),
		Type:    schemas.ReceiptType(kind),
		Source:  w.o.Source,
		Subject: subjectID,
		Time:    now,
	}
	stored, sealedID, err := w.store(ctx, ch, m, meta, r, schemas.ReceiptSubject(kind, server), msgID)
	if err != nil {
		w.retryLater(ctx, m, "cannot sign receipt", msgID, err)
		return
	}
	dec := &wireDecision{epID: r.EPID, Decision: schemas.Decision{
		ToolCallID:     r.ToolCallID,
		Phase:          r.Phase,
		Decision:       r.Decision,
		ReasonCodes:    r.ReasonCodes,
		ReceiptID:      sealedID,
		RegistryDigest: r.RegistryDigest,
		Receipt:        stored,
		Details:        out.Details,
	}}
	if sealedID == "" {
		// A redelivery: answer with the receipt the stream already holds.
		if dec, err = decisionFromReceipt(stored); err != nil {
			w.log.Error("stored receipt unreadable", "msg_id", msgID, "err", err)
			dec = nil
		}
	}
	receiptID := ""
	if dec != nil {
		receiptID = dec.ReceiptID
	}
	if out.Commit != nil {
		if err := out.Commit(receiptID); err != nil {
			w.retryLater(ctx, m, "cannot record the decision in the call ledger", msgID, err)
			return
		}
	}
	if dec != nil {
		w.reply(dec)
	}
	if ev := out.ToolCall; ev != nil {
		ev.ReceiptID = receiptID
		evID := dedupeID
		if err := w.storeEvent(ctx, ch, m, ev, evID, server, now); err != nil {
			w.retryLater(ctx, m, "cannot store the ToolCallEvent", msgID, err)
			return
		}
	}
	if err := m.Ack(); err != nil {
		w.log.Warn("ack call", "msg_id", msgID, "err", err)
	}
	w.handled.Add(1)
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

// storeEvent signs a ToolCallEvent with the chain's key and publishes it
// (one per call: Nats-Msg-Id <id>:toolcall), retrying until TALOS_AUDIT
// takes it or ctx ends.
func (w *Worker) storeEvent(ctx context.Context, ch *receipts.Chain, m jetstream.Msg, ev *schemas.ToolCallEvent, id, server string, now time.Time) error {
	subject := ev.ToolCallID
	if subject == "" {
		subject = id
	}
	sealed, err := ch.SignEvent(receipts.Meta{Type: schemas.TypeToolCall, Source: w.o.Source, Subject: subject, Time: now}, ev)
	if err != nil {
		return fmt.Errorf("sign toolcall event: %w", err)
	}
	msg := &nats.Msg{Subject: schemas.ToolCallEventSubject(server), Data: sealed.JSON, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, schemas.ToolCallEventMsgID(id))
	return w.retry(m).run(ctx, "toolcall event publish", func() error {
		_, err := w.js.PublishMsg(ctx, msg)
		return err
	}, "tool_call_id", ev.ToolCallID)
}

// decide runs the Decider, turning a panic into an error (no decision).
func (w *Worker) decide(subject string, raw []byte, now time.Time) (out *enforce.Decided, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	out, err = w.d.DecideCall(subject, raw, now)
	if err != nil {
		return nil, err
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
	err = w.retry(m).run(ctx, "audit publish", func() error {
		sealed, err := ch.Seal(meta, r)
		if err != nil {
			return errStop{fmt.Errorf("seal: %w", err)}
		}
		msg := &nats.Msg{Subject: subject, Data: sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
		ack, err := w.js.PublishMsg(ctx, msg)
		if err != nil {
			return err
		}
		if !ack.Duplicate {
			stored, sealedID = sealed.JSON, sealed.ID
			return errStop{ch.Commit(sealed)}
		}
		orig, err := w.audit.GetMsg(ctx, ack.Sequence)
		if err != nil {
			return fmt.Errorf("read duplicate seq %d: %w", ack.Sequence, err)
		}
		if bytes.Equal(orig.Data, sealed.JSON) {
			// Our own earlier attempt was stored after all.
			stored, sealedID = sealed.JSON, sealed.ID
			return errStop{ch.Commit(sealed)}
		}
		// Another delivery's receipt was stored; our chain does not
		// advance, so the dropped duplicate leaves no gap.
		stored = orig.Data
		return nil
	}, "msg_id", msgID)
	if err != nil {
		return nil, "", err
	}
	return stored, sealedID, nil
}

// retry is the worker's retry policy for the evidence of call m.
func (w *Worker) retry(m jetstream.Msg) retryPolicy {
	return retryPolicy{First: w.o.RetryBackoff, Max: 5 * time.Second, KeepAlive: w.o.AckWait / 3, Log: w.log,
		InProgress: func() { _ = m.InProgress() }}
}

func (w *Worker) reply(d *wireDecision) {
	if !schemas.ValidID(d.epID) {
		return
	}
	b, err := encodeDecision(&d.Decision)
	if err != nil {
		w.log.Error("marshal decision", "err", err)
		return
	}
	if err := w.nc.Publish(schemas.DecisionSubject(d.epID), b); err != nil {
		w.log.Warn("publish decision", "ep_id", d.epID, "err", err)
	}
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

// encodeDecision marshals d with its receipt spliced in as stored:
// json.Marshal would re-validate and re-compact the receipt's bytes.
func encodeDecision(d *schemas.Decision) ([]byte, error) {
	receipt := d.Receipt
	cp := *d
	cp.Receipt = nil
	b, err := json.Marshal(&cp)
	if err != nil {
		return nil, err
	}
	if len(receipt) == 0 {
		return b, nil
	}
	const hole = `"receipt":null`
	i := bytes.Index(b, []byte(hole))
	if i < 0 {
		return nil, errors.New("decision: no receipt member")
	}
	out := make([]byte, 0, len(b)+len(receipt))
	out = append(out, b[:i+len(hole)-len("null")]...)
	out = append(out, receipt...)
	return append(out, b[i+len(hole):]...), nil
}
