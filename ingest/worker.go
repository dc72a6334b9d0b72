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
type Decider interface {
	Decide(subject string, raw []byte, now time.Time) (schemas.Receipt, []string, error)
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
	Logger       *slog.Logger
	Now          func() time.Time
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
	return &Worker{nc: nc, js: js, d: d, o: o, log: o.Logger}, nil
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
			for m := range work {
				if ctx.Err() != nil {
					_ = m.Nak()
					continue
				}
				w.handle(ctx, ch, m)
			}
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

// handle processes one call message end to end. It returns only after the
// call is acked, nak'ed for redelivery, or the worker is stopping.
func (w *Worker) handle(ctx context.Context, ch *receipts.Chain, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		w.log.Error("call without metadata", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	now := w.o.Now().UTC()
	receipt, details, err := w.decide(m.Subject(), m.Data(), now)
	if err != nil {
		// No decision means no answer: the call stays un-decided and is
		// retried; the enforcement point times out and denies (fail closed).
		w.log.Error("decider failed", "stream_seq", md.Sequence.Stream, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	r := &receipt
	kind := r.EventType
	// Deduplicate on the call's identity only when the envelope is valid.
	// A malformed envelope's ids are untrusted: keyed by them, garbage sent
	// first with a victim's tool_call_id would make the victim's real
	// receipt look like a duplicate. It is keyed by its TALOS_CALLS stream
	// sequence instead, which every redelivery of it shares.
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
	// Meta is fixed before the first attempt so every retry seals the same
	// bytes (Ed25519 is deterministic): a retry after an uncertain publish
	// recognises its own stored receipt.
	meta := receipts.Meta{
		ID:      uuid.Must(uuid.NewV7()).String(),
		Type:    schemas.ReceiptType(kind),
		Source:  w.o.Source,
		Subject: subjectID,
		Time:    now,
	}
	stored, sealedID, err := w.store(ctx, ch, m, meta, r, schemas.ReceiptSubject(kind, server), msgID)
	if err != nil {
		if ctx.Err() != nil {
			_ = m.Nak() // shutting down: another worker takes the call at once
			return
		}
		// Signing failed: no receipt, so no answer; retry later (the
		// enforcement point times out and denies meanwhile).
		w.log.Error("cannot sign receipt", "msg_id", msgID, "err", err)
		_ = m.NakWithDelay(5 * time.Second)
		return
	}
	if sealedID == "" {
		// Another delivery of this call already stored its receipt: answer
		// with that one, so the enforcement point sees the same decision.
		if dec, err := decisionFromReceipt(stored); err == nil {
			w.reply(dec)
		} else {
			w.log.Error("stored receipt unreadable", "msg_id", msgID, "err", err)
		}
	} else {
		w.reply(&wireDecision{epID: r.EPID, Decision: schemas.Decision{
			ToolCallID:     r.ToolCallID,
			Phase:          r.Phase,
			Decision:       r.Decision,
			ReasonCodes:    r.ReasonCodes,
			ReceiptID:      sealedID,
			RegistryDigest: r.RegistryDigest,
			Receipt:        stored,
			Details:        details,
		}})
	}
	if err := m.Ack(); err != nil {
		w.log.Warn("ack call", "msg_id", msgID, "err", err)
	}
	w.handled.Add(1)
}

// decide runs the decider, turning a panic or a receipt of no known kind
// into an error (no decision: the call is retried, never answered).
func (w *Worker) decide(subject string, raw []byte, now time.Time) (r schemas.Receipt, details []string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	r, details, err = w.d.Decide(subject, raw, now)
	if err != nil {
		return r, nil, err
	}
	if r.EventType != schemas.KindDecision && r.EventType != schemas.KindEffect {
		return r, nil, fmt.Errorf("decider returned kind %q", r.EventType)
	}
	return r, details, nil
}

// store seals r into ch and publishes it with msgID until JetStream has it.
// It returns the stored bytes, and the receipt id when the stored receipt is
// this call's own new link ("" when an earlier delivery's receipt won).
func (w *Worker) store(ctx context.Context, ch *receipts.Chain, m jetstream.Msg, meta receipts.Meta, r *schemas.Receipt, subject, msgID string) ([]byte, string, error) {
	backoff := w.o.RetryBackoff
	lastProgress := time.Now()
	for {
		sealed, err := ch.Seal(meta, r)
		if err != nil {
			return nil, "", fmt.Errorf("seal: %w", err)
		}
		msg := &nats.Msg{Subject: subject, Data: sealed.JSON, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
		ack, err := w.js.PublishMsg(ctx, msg)
		if err == nil && !ack.Duplicate {
			return sealed.JSON, sealed.ID, ch.Commit(sealed)
		}
		if err == nil {
			orig, gerr := w.audit.GetMsg(ctx, ack.Sequence)
			if gerr == nil {
				if bytes.Equal(orig.Data, sealed.JSON) {
					// Our own earlier attempt was stored after all.
					return sealed.JSON, sealed.ID, ch.Commit(sealed)
				}
				// Another delivery's receipt was stored; our chain does
				// not advance, so the dropped duplicate leaves no gap.
				return orig.Data, "", nil
			}
			err = fmt.Errorf("read duplicate seq %d: %w", ack.Sequence, gerr)
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		w.log.Warn("audit publish failed; retrying", "msg_id", msgID, "err", err, "backoff", backoff)
		if time.Since(lastProgress) > w.o.AckWait/3 {
			_ = m.InProgress()
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
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
