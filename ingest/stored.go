package ingest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ordered"
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
	window := DefaultDuplicateWindow
	if info := w.audit.CachedInfo(); info != nil && info.Config.Duplicates > 0 {
		window = info.Config.Duplicates
	}
	var (
		// By Nats-Msg-Id: a batch may hold one call twice (stored twice
		// in TALOS_CALLS).
		receiptOf, eventOf map[string][]*call
		subjects           []string // to scan: the calls' servers' receipts and events
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
			receiptOf, eventOf = map[string][]*call{}, map[string][]*call{}
		}
		late = append(late, c)
		receiptOf[c.msgID] = append(receiptOf[c.msgID], c)
		eventID := schemas.ToolCallEventMsgID(c.dedupeID)
		eventOf[eventID] = append(eventOf[eventID], c)
		subjects = append(subjects, schemas.ReceiptSubject(c.out.Receipt.EventType, c.server), schemas.ToolCallEventSubject(c.server))
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
	slices.Sort(subjects)
	start := from.Add(-storedLookBack)
	scanned, err := ordered.Scan(ctx, w.js, schemas.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: slices.Compact(subjects), DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start, HeadersOnly: true,
	}, w.o.PublishTimeout, func(m jetstream.Msg, md *jetstream.MsgMetadata) bool {
		msgID := m.Headers().Get(jetstream.MsgIDHeader)
		if _, ok := receiptOf[msgID]; ok {
			found[msgID] = md.Sequence.Stream
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
