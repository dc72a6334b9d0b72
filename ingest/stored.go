package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// A redelivered call must not yield a second receipt. Usually TALOS_AUDIT's
// duplicate check sees to that: the receipt an earlier delivery stored has
// the same Nats-Msg-Id, and the stream hands it back instead of storing
// another (store). But the stream remembers ids for its duplicate window
// only (two minutes by default). A call redelivered later than that (no
// worker ran meanwhile: a single-node talosd that crashed and came back
// slowly, every worker stopped), or stored in TALOS_CALLS a second time
// and delivered that late, would be sealed and stored again, with the
// receipt id the call ledger names: ClickHouse folds two receipts with one
// id into one, which cuts a chain. So the worker looks the earlier
// evidence up itself for a call an earlier delivery claimed in the ledger
// (enforce.Decided.ClaimedBefore) more than half the window ago. Only
// such a call can have a receipt stored already; calls nak'ed before
// their claim (a ledger outage, a worker not yet current) are not looked
// up, however often they were delivered. A call without a claim (a post
// event, no ledger) gets a new receipt id each delivery, so a late
// delivery of one stores a second receipt of its own but cuts no chain.

// storedLookBack is how long before the earliest claim (or arrival in
// TALOS_CALLS) the lookup starts: the clocks of the worker that decided
// and of the nodes that stamped TALOS_CALLS and TALOS_AUDIT may differ.
const storedLookBack = time.Minute

// findStored looks up, in TALOS_AUDIT, the receipt and the ToolCallEvent
// that an earlier delivery stored for each call of the batch that an
// earlier delivery claimed more than half the stream's duplicate window
// ago, and sets the call's prior and storedEvent. One scan serves the
// batch: the receipts and events of the calls' servers since the earliest
// claim (or arrival, if earlier), headers only. A call whose lookup fails is
// left for a retry: storing its receipt blind could store a second one.
func (w *Worker) findStored(ctx context.Context, calls []*call) {
	window := 2 * time.Minute
	if info := w.audit.CachedInfo(); info != nil && info.Config.Duplicates > 0 {
		window = info.Config.Duplicates
	}
	var (
		// By Nats-Msg-Id: a batch may hold one call twice (stored twice
		// in TALOS_CALLS).
		receiptOf, eventOf map[string][]*call
		subjects           map[string]bool
		late               []*call
		from               time.Time
	)
	for _, c := range calls {
		if c.done {
			continue
		}
		// The earlier delivery stored its receipt, if it did, after it
		// decided, and the call arrived before either.
		since, ok := c.out.ClaimedBefore()
		if !ok {
			continue
		}
		if since.IsZero() || c.arrived.Before(since) {
			since = c.arrived
		}
		if time.Since(since) < window/2 {
			continue
		}
		if receiptOf == nil {
			receiptOf, eventOf, subjects = map[string][]*call{}, map[string][]*call{}, map[string]bool{}
		}
		late = append(late, c)
		receiptOf[c.msgID] = append(receiptOf[c.msgID], c)
		eventID := schemas.ToolCallEventMsgID(c.dedupeID)
		eventOf[eventID] = append(eventOf[eventID], c)
		subjects[schemas.ReceiptSubject(c.out.Receipt.EventType, c.server)] = true
		subjects[schemas.ToolCallEventSubject(c.server)] = true
		if from.IsZero() || since.Before(from) {
			from = since
		}
	}
	if receiptOf == nil {
		return
	}
	fail := func(err error) {
		for _, c := range late {
			w.retryLater(ctx, c.m, "cannot look up the evidence an earlier delivery stored", c.msgID, err)
			c.done = true
		}
	}
	began := time.Now()
	found := map[string]uint64{} // receipt Nats-Msg-Id -> stream sequence
	events := map[string]bool{}
	scanned, err := scanAudit(ctx, w.js, subjects, from.Add(-storedLookBack), w.o.PublishTimeout, func(seq uint64, msgID string) bool {
		if _, ok := receiptOf[msgID]; ok {
			found[msgID] = seq
		}
		if _, ok := eventOf[msgID]; ok {
			events[msgID] = true
		}
		// Not every call has an event: usually the scan reads to the end.
		return len(found) < len(receiptOf) || len(events) < len(eventOf)
	})
	if err != nil {
		fail(err)
		return
	}
	for msgID, seq := range found {
		m, err := w.audit.GetMsg(ctx, seq)
		if err != nil {
			fail(fmt.Errorf("read receipt seq %d: %w", seq, err))
			return
		}
		for _, c := range receiptOf[msgID] {
			c.prior = m.Data
		}
	}
	for msgID := range events {
		for _, c := range eventOf[msgID] {
			c.storedEvent = true
		}
	}
	w.log.Info("looked up the evidence of calls redelivered after the duplicate window",
		"calls", len(late), "receipts_found", len(found), "scanned", scanned, "took", time.Since(began))
}

// scanAudit reads the headers of TALOS_AUDIT's messages on subjects from
// time from to the stream's end, calling fn with each one's sequence and
// Nats-Msg-Id until fn returns false. It returns how many it read.
func scanAudit(ctx context.Context, js jetstream.JetStream, subjects map[string]bool, from time.Time, wait time.Duration, fn func(seq uint64, msgID string) bool) (int, error) {
	filter := make([]string, 0, len(subjects))
	for s := range subjects {
		filter = append(filter, s)
	}
	cons, err := js.OrderedConsumer(ctx, schemas.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: filter, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from, HeadersOnly: true,
	})
	if err != nil {
		return 0, fmt.Errorf("scan TALOS_AUDIT: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("scan TALOS_AUDIT: %w", err)
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
			return n, fmt.Errorf("scan TALOS_AUDIT: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			n++
			md, err := m.Metadata()
			if err != nil {
				return n, fmt.Errorf("scan TALOS_AUDIT: %w", err)
			}
			if !fn(md.Sequence.Stream, m.Headers().Get(jetstream.MsgIDHeader)) || md.NumPending == 0 {
				return n, nil
			}
		}
		if err := batch.Error(); err != nil {
			return n, fmt.Errorf("scan TALOS_AUDIT: %w", err)
		}
		if got == 0 {
			return n, errors.New("scan TALOS_AUDIT: no messages within " + wait.String())
		}
	}
}
