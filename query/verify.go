package query

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Problem kinds VerifyDatabase adds to the receipts verifier's.
const (
	// ProblemAlteredColumn: a stored column disagrees with the signed
	// cloudevent of its own row.
	ProblemAlteredColumn = "altered_column"
	// ProblemConflictingCopies: one receipt_id (or tool call event_id) is
	// stored as rows that differ.
	ProblemConflictingCopies = "conflicting_copies"
	// ProblemInvalidToolCall: a stored tool_calls cloudevent is not a
	// ToolCallEvent the flight recorder accepts (wrong type, fails its
	// schema, or a payload that does not match its hash).
	ProblemInvalidToolCall = "invalid_tool_call"
	// ProblemReordered: a row's stored position (chain_id, chain_seq
	// columns) is not the position its signed cloudevent holds.
	ProblemReordered = "reordered"
	// ProblemMissingReceipt: a ToolCallEvent names a receipt that is not
	// stored.
	ProblemMissingReceipt = "missing_receipt"
)

// Category is the auditor's category of a problem kind (this package's or
// the receipts verifier's): missing, altered, reordered, duplicated,
// foreign, malformed, and for the transparency log's check unwitnessed or
// unlogged.
func Category(kind string) string {
	switch kind {
	case ProblemAlteredColumn:
		return verify.CategoryAltered
	case ProblemConflictingCopies:
		return verify.CategoryDuplicated
	case ProblemInvalidToolCall:
		return verify.CategoryMalformed
	case ProblemReordered:
		return verify.CategoryReordered
	case ProblemMissingReceipt, ProblemMissingRow:
		return verify.CategoryMissing
	case ProblemLogRewritten, ProblemLogEntries:
		return verify.CategoryAltered
	case ProblemLogCheckpoint:
		return verify.CategoryForeign
	case ProblemWitnessQuorum:
		return CategoryUnwitnessed
	case ProblemNotInLog:
		return CategoryUnlogged
	}
	return verify.Category(kind)
}

// RecordToolCall is verify.Problem.Record for a ToolCallEvent.
const RecordToolCall = "tool call event"

// maxDisplaced bounds the rows VerifyDatabase holds back to feed them in
// their signed order; beyond it they are fed where they are stored (and
// reported as gaps and out-of-order links as well).
const maxDisplaced = 100_000

// AwaitAndVerify waits (at most timeout) until want receipts of q are in
// the database, then verifies all of it (VerifyDatabase); a report with
// problems is an error listing them.
func AwaitAndVerify(ctx context.Context, conn driver.Conn, database string, q ReceiptQuery, want uint64, timeout time.Duration, keys verify.KeySet) (verify.Report, error) {
	if err := AwaitReceipts(ctx, conn, database, q, want, timeout); err != nil {
		return verify.Report{}, fmt.Errorf("receipts: %w", err)
	}
	rep, err := VerifyDatabase(ctx, conn, database, keys, false, nil)
	if err == nil && !rep.OK() {
		var b strings.Builder
		for _, p := range rep.Problems {
			b.WriteString("\n" + p.String())
		}
		err = fmt.Errorf("verify: %d problems:%s", len(rep.Problems), b.String())
	}
	return rep, err
}

// VerifyDatabase checks everything in database: each checkpoint's and each
// receipt's signature against keys; each chain's continuity (seq from 1
// without gaps, prev_hash links); each checkpoint's Merkle root over its
// range and the checkpoints' own chain; that every column of receipts,
// checkpoints and tool_calls agrees with the signed cloudevent it came
// from (a row whose chain_id/chain_seq columns differ from its signed
// position is reported as reordered, and verified at its signed
// position); and that every receipt a ToolCallEvent names is stored.
//
// It streams, with memory bounded by the number of chains and
// checkpoints (plus reordered rows, at most maxDisplaced). partial accepts
// chains whose first stored receipt is not seq 1 (after retention).
// progress, if set, is called every 10,000 receipts with the count so far
// and the number of stored receipt rows.
func VerifyDatabase(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet, partial bool, progress func(done, total int)) (verify.Report, error) {
	return VerifyDatabaseWith(ctx, conn, database, keys, VerifyOptions{Partial: partial, Progress: progress})
}

// VerifyOptions tunes VerifyDatabaseWith; the zero value is
// VerifyDatabase's behaviour with partial false and no progress.
type VerifyOptions struct {
	// Partial accepts chains whose first stored receipt is not seq 1.
	Partial bool
	// Progress, if set, is called every 10,000 receipts with the count so
	// far and the number of stored receipt rows.
	Progress func(done, total int)
	// BatchSignatures checks receipt signatures with batch verification
	// (verify.VerifyEventsBatch): several times cheaper, and it accepts,
	// besides every signature crypto/ed25519 accepts, one that satisfies
	// only the cofactored Ed25519 equation (which only the signer can
	// make). By default every signature is held to crypto/ed25519's rules.
	BatchSignatures bool
	// ChainOrder skips the pass in stored order: the receipts are read
	// sorted into chain order by ClickHouse from the start.
	ChainOrder bool
	// Again, if set, is called when the pass in stored order gives way,
	// before the receipts are read again in chain order (Progress starts
	// over).
	Again func()
	// Reading, if set, follows VerifyExportFile's reads of a file before
	// the last one (which Progress follows), if the file is at least
	// readingEvery long: the bytes read so far of the file's size, at the
	// start of a read, every readingEvery and at its end. index is false
	// for the read for the order and the checkpoints, true for the one
	// that indexes a file out of chain order.
	Reading func(index bool, done, total int64)
}

// VerifyDatabaseWith is VerifyDatabase with options.
//
// It reads the receipts twice at most. The first pass reads them in the
// order ClickHouse stores them, which needs no sort and is each chain's
// seq order in a database the sink filled (verifyStoredOrder); it stands
// only if every row verifies and links without a problem. Otherwise, and
// with Partial or ChainOrder, the receipts are read sorted into chain
// order, and that pass's report is returned, whatever the first found.
// A database both passes would find clean gets the same report from each.
func VerifyDatabaseWith(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet, opts VerifyOptions) (verify.Report, error) {
	if !opts.Partial && !opts.ChainOrder {
		rep, ok, err := verifyStoredOrder(ctx, conn, database, keys, opts, storedOrderHold)
		if err != nil || ok {
			return rep, err
		}
		if opts.Again != nil {
			opts.Again()
		}
	}
	return verifyChainOrder(ctx, conn, database, keys, opts)
}

// verifyEventsFunc is the signature check opts asks for.
func verifyEventsFunc(opts VerifyOptions) func([][]byte, verify.KeySet) ([]*verify.Event, []error) {
	if opts.BatchSignatures {
		return verify.VerifyEventsBatch
	}
	return verify.VerifyEvents
}

// verifyChainOrder is VerifyDatabaseWith reading the receipts in chain
// order (chain_id, chain_seq, receipt_id), as ClickHouse sorts them.
func verifyChainOrder(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet, opts VerifyOptions) (verify.Report, error) {
	v := verify.NewVerifier(keys)
	v.AllowPartial = opts.Partial
	extra, err := verifyCheckpoints(ctx, conn, database, v)
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	feed := &receiptFeeder{v: v, held: map[string][]heldRow{}, count: newProgressCounter(ctx, conn, database, opts.Progress), extra: extra}
	err = streamVerified(ctx, func(ctx context.Context, fn func(ReceiptRow) error) error {
		return StreamReceipts(ctx, conn, database, fn)
	}, keys, verifyEventsFunc(opts), func(it *verifyItem) error {
		feed.process(it)
		return nil
	})
	var conflict *ConflictError
	if errors.As(err, &conflict) {
		for _, id := range conflict.ReceiptIDs {
			feed.extra = append(feed.extra, verify.Problem{Kind: ProblemConflictingCopies, ReceiptID: id,
				Detail: "the same receipt_id is stored as rows that differ"})
		}
		err = nil
	}
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	feed.finish()
	return finishReport(ctx, conn, database, keys, opts, v.Finish(), feed.extra)
}

// finishReport adds to rep, the receipts verifier's report, the problems
// found beside it (extra), and those of the tool calls and the receipts
// they name.
func finishReport(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet, opts VerifyOptions, rep verify.Report, extra []verify.Problem) (verify.Report, error) {
	calls, err := verifyToolCalls(ctx, conn, database, keys, verifyEventsFunc(opts))
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	missing, err := missingReceipts(ctx, conn, database)
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	rep.Problems = append(append(append(rep.Problems, extra...), calls...), missing...)
	return rep, nil
}

// errNotChainOrder stops the stored-order pass: a row could not be
// verified there as the chain-order pass would (see verifyStoredOrder).
var errNotChainOrder = errors.New("stored order is not chain order")

// storedOrderHold bounds the rows the stored-order pass holds back until
// the rows before them in their chains come: more, and it gives up.
const storedOrderHold = 4096

// verifyStoredOrder verifies the receipts in the order ClickHouse stores
// them, which it streams without sorting (streamReceiptsStored), feeding
// each chain to the verifier in seq order: a row that comes before the
// rows ahead of it in its chain is held back (at most storedOrderHold).
// ok is false, and the report empty, when this pass cannot stand for the
// chain-order one: a row that does not verify, whose columns are not its
// signed cloudevent's, that repeats a seq of its chain (a second copy
// stored before a merge) or leaves a gap; too many rows held back; or a
// problem the verifier or the checkpoints report. Then the chain-order
// pass, which names every such problem, has the last word. Rows are fed
// to the same verifier, each chain in the same order, with the same
// checks, so a clean database gets the report that pass would give.
func verifyStoredOrder(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet, opts VerifyOptions, maxHeld int) (rep verify.Report, ok bool, err error) {
	v := verify.NewVerifier(keys)
	extra, err := verifyCheckpoints(ctx, conn, database, v)
	if err != nil {
		return verify.Report{}, false, fmt.Errorf("verify: %w", err)
	}
	if len(extra) > 0 {
		return verify.Report{}, false, nil
	}
	feed := &seqFeeder{v: v, next: map[string]uint64{}, held: map[string]map[uint64]verifyItem{}, maxHeld: maxHeld,
		count: newProgressCounter(ctx, conn, database, opts.Progress)}
	err = streamVerified(ctx, func(ctx context.Context, fn func(ReceiptRow) error) error {
		return streamReceiptsStored(ctx, conn, database, fn)
	}, keys, verifyEventsFunc(opts), feed.process)
	if errors.Is(err, errNotChainOrder) {
		return verify.Report{}, false, nil
	}
	if err != nil {
		return verify.Report{}, false, fmt.Errorf("verify: %w", err)
	}
	if rep = v.Finish(); feed.nHeld > 0 || !rep.OK() {
		return verify.Report{}, false, nil
	}
	feed.count.done()
	rep, err = finishReport(ctx, conn, database, keys, opts, rep, nil)
	return rep, err == nil, err
}

// seqFeeder feeds rows streamed in stored order (streamVerified's
// process) to the receipts verifier, each chain in seq order from 1; it
// stops the stream with errNotChainOrder at the first row the chain-order
// pass could report a problem at.
type seqFeeder struct {
	v       *verify.Verifier
	next    map[string]uint64                // by chain: the seq to feed next
	held    map[string]map[uint64]verifyItem // by chain and seq: rows ahead of their turn
	nHeld   int
	maxHeld int             // more held, and the pass gives up
	count   progressCounter // rows fed
}

func (f *seqFeeder) process(it *verifyItem) error {
	row, d := &it.row, &it.derived
	if it.derr != nil || it.verr != nil || !sameColumns(row, d) { // sameColumns compares chain_id and chain_seq too
		return errNotChainOrder
	}
	chain, seq := row.ChainID, row.ChainSeq
	next := f.next[chain]
	if next == 0 {
		next = 1
	}
	if seq != next {
		held := f.held[chain]
		if held == nil {
			held = map[uint64]verifyItem{}
			f.held[chain] = held
		}
		if _, twice := held[seq]; twice || seq < next || f.nHeld >= f.maxHeld {
			return errNotChainOrder
		}
		held[seq] = *it
		f.nHeld++
		return nil
	}
	if err := f.feed(it); err != nil {
		return err
	}
	for next++; len(f.held[chain]) > 0; next++ {
		h, ok := f.held[chain][next]
		if !ok {
			break
		}
		delete(f.held[chain], next)
		f.nHeld--
		if err := f.feed(&h); err != nil {
			return err
		}
	}
	if len(f.held[chain]) == 0 {
		delete(f.held, chain)
	}
	f.next[chain] = next
	return nil
}

// feed links one row, verified and in its turn, in the verifier.
func (f *seqFeeder) feed(it *verifyItem) error {
	if _, probs := f.v.AddVerified(it.raw, it.ev, it.verr); len(probs) > 0 {
		return errNotChainOrder
	}
	f.count.add()
	return nil
}

// progressCounter counts the records a pass has verified for
// VerifyOptions.Progress: it reports every progressEvery, and at the end
// if there were that many.
type progressCounter struct {
	n      int                   // records counted
	total  int                   // records to count (stored receipt rows), 0 if not counted
	report func(done, total int) // nil for none
}

// newProgressCounter reports to report (nil: nowhere), counting the stored
// receipt rows first if it does.
func newProgressCounter(ctx context.Context, conn driver.Conn, database string, report func(done, total int)) progressCounter {
	p := progressCounter{report: report}
	if report != nil {
		p.total = countReceipts(ctx, conn, database)
	}
	return p
}

// progressEvery is how many records a verification reports progress
// after; one shorter than that reports none.
const progressEvery = 10000

func (p *progressCounter) add() {
	p.n++
	if p.report != nil && p.n%progressEvery == 0 {
		p.report(p.n, max(p.total, p.n))
	}
}

// done reports the final count (if the pass was long enough to report).
func (p *progressCounter) done() {
	if p.report != nil && p.n >= progressEvery {
		p.report(p.n, max(p.total, p.n))
	}
}

// verifyCheckpoints feeds every stored checkpoint to v and returns an
// altered_column problem for each whose columns disagree with its signed
// cloudevent (compared only when the verifier found that cloudevent itself
// sound).
func verifyCheckpoints(ctx context.Context, conn driver.Conn, database string, v *verify.Verifier) ([]verify.Problem, error) {
	var extra []verify.Problem
	err := StreamCheckpoints(ctx, conn, database, func(row CheckpointRow) error {
		if _, probs := v.Add([]byte(row.CloudEvent)); untrusted(probs) {
			return nil
		}
		if derived, err := CheckpointRowFromEvent([]byte(row.CloudEvent)); err == nil {
			if cols := CompareCheckpointColumns(row, derived); len(cols) > 0 {
				extra = append(extra, verify.Problem{Kind: ProblemAlteredColumn, ReceiptID: row.CheckpointID,
					ChainID: derived.ChainID, Seq: derived.CheckpointSeq, Record: verify.RecordCheckpoint,
					Detail: "stored columns differ from the signed cloudevent: " + strings.Join(cols, ", ")})
			}
		}
		return nil
	})
	return extra, err
}

// countReceipts is the number of stored receipt rows, for progress; 0 if
// it cannot be counted.
func countReceipts(ctx context.Context, conn driver.Conn, database string) int {
	var n uint64
	if tbl, err := table(database, TableReceipts); err == nil && conn.QueryRow(ctx, "SELECT count() FROM "+tbl).Scan(&n) == nil {
		return int(n)
	}
	return 0
}

// heldRow is a displaced receipt row held back until its signed position.
type heldRow struct {
	seq uint64
	raw []byte
}

// everySeq, as flush's below, releases every held row of a chain.
const everySeq = ^uint64(0)

// receiptFeeder feeds streamed receipt rows (streamVerified's process, on
// the linking goroutine) to the receipts verifier in their signed order,
// and collects the problems of their stored columns. A row stored away
// from its signed position is held back (at most maxDisplaced rows) and
// fed before the next row of its signed chain that comes after it, when
// the stream leaves the chain it is stored in, or at finish.
type receiptFeeder struct {
	v        *verify.Verifier
	held     map[string][]heldRow // displaced rows by signed chain
	nHeld    int
	curChain string
	count    progressCounter // rows processed
	extra    []verify.Problem
}

// flush feeds the rows held for chainID whose seq is below below, in seq
// order.
func (f *receiptFeeder) flush(chainID string, below uint64) {
	rows := f.held[chainID]
	if len(rows) == 0 {
		return
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].seq < rows[j].seq })
	k := 0
	for k < len(rows) && rows[k].seq < below {
		f.v.Add(rows[k].raw)
		k++
	}
	f.nHeld -= k
	if k == len(rows) {
		delete(f.held, chainID)
	} else {
		f.held[chainID] = rows[k:]
	}
}

// process feeds one row (or holds it back, if it is stored away from its
// signed position) and compares its columns with its signed cloudevent.
func (f *receiptFeeder) process(it *verifyItem) {
	row, derived, derr, raw := it.row, it.derived, it.derr, it.raw
	if row.ChainID != f.curChain {
		f.flush(f.curChain, everySeq)
		f.curChain = row.ChainID
	}
	signedOK := true // whether the signed JSON is trustworthy enough to compare columns with
	switch {
	case derr != nil:
		f.v.AddVerified(raw, it.ev, it.verr)
		signedOK = false
	case derived.ChainID != row.ChainID || derived.ChainSeq != row.ChainSeq:
		f.extra = append(f.extra, verify.Problem{Kind: ProblemReordered, ReceiptID: row.ReceiptID,
			ChainID: derived.ChainID, Seq: derived.ChainSeq,
			Detail: fmt.Sprintf("stored at chain %s seq %d, but signed as chain %s seq %d", row.ChainID, row.ChainSeq, derived.ChainID, derived.ChainSeq)})
		if it.verr != nil {
			signedOK = false
		}
		if f.nHeld < maxDisplaced {
			f.held[derived.ChainID] = append(f.held[derived.ChainID], heldRow{derived.ChainSeq, raw})
			f.nHeld++
		} else {
			f.v.AddVerified(raw, it.ev, it.verr)
		}
	default:
		f.flush(derived.ChainID, derived.ChainSeq)
		if _, probs := f.v.AddVerified(raw, it.ev, it.verr); untrusted(probs) {
			signedOK = false
		}
	}
	// Columns are compared with a signed JSON that verified: an edited
	// JSON is one problem (its signature), not also every column the
	// edit made disagree.
	if signedOK && !sameColumns(&row, &derived) {
		var cols []string
		for _, c := range CompareColumns(row, derived) {
			if c != "chain_id" && c != "chain_seq" {
				cols = append(cols, c)
			}
		}
		if len(cols) > 0 {
			// Named by the chain position in the cloudevent, not by
			// the (possibly altered) columns.
			f.extra = append(f.extra, verify.Problem{Kind: ProblemAlteredColumn, ReceiptID: row.ReceiptID,
				ChainID: derived.ChainID, Seq: derived.ChainSeq,
				Detail: "stored columns differ from the signed cloudevent: " + strings.Join(cols, ", ")})
		}
	}
	f.count.add()
}

// finish feeds every row still held, chain by chain in chain_id order,
// once the stream has ended, and reports the final progress.
func (f *receiptFeeder) finish() {
	chains := make([]string, 0, len(f.held))
	for c := range f.held {
		chains = append(chains, c)
	}
	sort.Strings(chains)
	for _, c := range chains {
		f.flush(c, everySeq)
	}
	f.count.done()
}

// verifyItem is one streamed receipt row with the work done on it off the
// linking goroutine, from one parse of its signed JSON: the signature
// check and the row that JSON yields.
type verifyItem struct {
	row     ReceiptRow
	raw     []byte // row.CloudEvent's bytes, copied once for both checks
	derived ReceiptRow
	derr    error
	ev      *verify.Event
	verr    error
}

// streamVerified streams receipt rows (stream) and calls process for
// every row, in stream order, after its signature check (by verifyEvents,
// a batch at a time) and derivation ran on one of GOMAXPROCS goroutines
// (inOrder). An error from process stops the stream and is returned.
func streamVerified(ctx context.Context, stream func(context.Context, func(ReceiptRow) error) error, keys verify.KeySet,
	verifyEvents func([][]byte, verify.KeySet) ([]*verify.Event, []error), process func(*verifyItem) error) error {
	return inOrder(ctx, func(ctx context.Context, add func(verifyItem)) error {
		return stream(ctx, func(row ReceiptRow) error {
			add(verifyItem{row: row})
			return nil
		})
	}, func(items []verifyItem) {
		raws := make([][]byte, len(items))
		for i := range items {
			raws[i] = []byte(items[i].row.CloudEvent)
		}
		evs, errs := verifyEvents(raws, keys)
		for i := range items {
			it := &items[i]
			it.raw = raws[i]
			it.ev, it.verr = evs[i], errs[i]
			it.derived, it.derr = derivedRow(it.row.CloudEvent, raws[i], it.ev)
		}
	}, process)
}

// inOrderBatch is how many items travel together between inOrder's
// goroutines.
const inOrderBatch = 256

// batchOf is a batch of inOrder's items.
type batchOf[T any] struct {
	items []T
	done  chan struct{} // closed once work has run on items
}

// inOrder runs stream, which adds items one by one, runs work on batches
// of them on GOMAXPROCS goroutines, and calls process for every item in
// the order stream added it, once its batch's work is done. Memory: a few
// batches in flight. An error from process cancels stream's context (the
// batches in flight are drained) and is returned; otherwise stream's
// error is. When inOrder returns, stream has returned.
func inOrder[T any](ctx context.Context, stream func(context.Context, func(T)) error, work func([]T), process func(*T) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	workers := runtime.GOMAXPROCS(0)
	pending := make(chan *batchOf[T], 2*workers)
	ordered := make(chan *batchOf[T], 4*workers)
	var streamErr error
	go func() {
		defer close(ordered)
		defer close(pending)
		var cur *batchOf[T]
		send := func() {
			pending <- cur
			ordered <- cur
			cur = nil
		}
		streamErr = stream(ctx, func(item T) {
			if cur == nil {
				cur = &batchOf[T]{items: make([]T, 0, inOrderBatch), done: make(chan struct{})}
			}
			cur.items = append(cur.items, item)
			if len(cur.items) == inOrderBatch {
				send()
			}
		})
		if cur != nil {
			send()
		}
	}()
	for range workers {
		go func() {
			for b := range pending {
				work(b.items)
				close(b.done)
			}
		}()
	}
	var processErr error
	for b := range ordered {
		<-b.done
		for i := 0; i < len(b.items) && processErr == nil; i++ {
			if processErr = process(&b.items[i]); processErr != nil {
				cancel()
			}
		}
	}
	if processErr != nil {
		return processErr
	}
	return streamErr // written before ordered was closed
}

// derivedRow is ReceiptRowFromEvent(raw) for the stored cloudevent (raw
// holds its bytes), which VerifyEvent read as ev (nil if it could not). An
// event read as published (ev.Canonical) is not parsed again: its row is
// built from ev, which holds exactly what ReceiptRowFromEvent would read
// from the same bytes.
func derivedRow(cloudEvent string, raw []byte, ev *verify.Event) (ReceiptRow, error) {
	if ev == nil || !ev.Canonical {
		return ReceiptRowFromEvent(raw)
	}
	rest, okPrefix := strings.CutPrefix(ev.Type, receiptTypePrefix)
	kind, okSuffix := strings.CutSuffix(rest, receiptTypeSuffix)
	if !okPrefix || !okSuffix || kind == "" || strings.Contains(kind, ".") || ev.ID == "" {
		return ReceiptRowFromEvent(raw)
	}
	switch ev.Type {
	case schemas.TypeReceiptDecision, schemas.TypeReceiptEffect, schemas.TypeReceiptControl:
	default:
		// Data is read only for the receipt types the verifier knows.
		return ReceiptRowFromEvent(raw)
	}
	t, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil || t.Before(time.Unix(0, 0)) {
		return ReceiptRowFromEvent(raw) // its error
	}
	return rowOfReceipt(ev.ID, kind, t, &ev.Data, ev.Hash, cloudEvent), nil
}

// sameColumns reports whether every column of a equals b's, as
// CompareColumns compares them (times to the second, nil and empty arrays
// equal; inserted_at not at all), without its allocations. When it
// reports false, CompareColumns names the columns.
func sameColumns(a, b *ReceiptRow) bool {
	return a.ReceiptID == b.ReceiptID && a.Kind == b.Kind && a.Phase == b.Phase && a.Time.Unix() == b.Time.Unix() &&
		a.TimeMS == b.TimeMS && a.ToolCallID == b.ToolCallID && a.TraceID == b.TraceID && a.SessionID == b.SessionID &&
		a.EPID == b.EPID && a.ServerID == b.ServerID && a.ToolName == b.ToolName && a.ToolClass == b.ToolClass &&
		a.Decision == b.Decision && slices.Equal(a.ReasonCodes, b.ReasonCodes) && a.AgentID == b.AgentID &&
		a.RequestHash == b.RequestHash && a.EnvelopeHash == b.EnvelopeHash && a.RegistryDigest == b.RegistryDigest &&
		a.ChainID == b.ChainID && a.ChainSeq == b.ChainSeq && a.PrevHash == b.PrevHash && a.ReceiptHash == b.ReceiptHash &&
		a.SignerKID == b.SignerKID && a.CloudEvent == b.CloudEvent && a.CapabilityHash == b.CapabilityHash &&
		slices.Equal(a.CapabilityIDs, b.CapabilityIDs) && a.MCPMethod == b.MCPMethod && a.ParentToolCallID == b.ParentToolCallID
}

// untrusted reports whether the verifier found the event itself bad
// (rather than only its place in the chain).
func untrusted(probs []verify.Problem) bool {
	for _, p := range probs {
		switch p.Kind {
		case verify.ProblemBadSignature, verify.ProblemMalformed, verify.ProblemUnknownKey:
			return true
		}
	}
	return false
}

// missingReceipts names the receipts that stored ToolCallEvents say were
// made but that are not in the receipts table (a deleted row is then
// named by its id, not only by the gap it leaves in its chain).
func missingReceipts(ctx context.Context, conn driver.Conn, database string) ([]verify.Problem, error) {
	calls, err := table(database, TableToolCalls)
	if err != nil {
		return nil, err
	}
	recs, _ := table(database, TableReceipts)
	rows, err := conn.Query(ctx, "SELECT DISTINCT receipt_id, event_id, tool_call_id FROM "+calls+
		" WHERE receipt_id != '' AND receipt_id NOT IN (SELECT receipt_id FROM "+recs+") ORDER BY receipt_id, event_id")
	if err != nil {
		return nil, fmt.Errorf("query: missing receipts: %w", err)
	}
	defer rows.Close()
	var out []verify.Problem
	for rows.Next() {
		var rid, eid, tcid string
		if err := rows.Scan(&rid, &eid, &tcid); err != nil {
			return nil, err
		}
		out = append(out, verify.Problem{Kind: ProblemMissingReceipt, ReceiptID: rid,
			Detail: fmt.Sprintf("not stored, but tool call event %s (tool_call_id %s) names it as the receipt that completed its record", eid, tcid)})
	}
	return out, rows.Err()
}

// verifyToolCalls checks each stored tool_calls row: its cloudevent's
// signature against keys (by verifyEvents, a batch at a time on every
// core), that it is an acceptable ToolCallEvent, and that its columns
// agree with it. Problems are in stream order (event_id).
func verifyToolCalls(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet,
	verifyEvents func([][]byte, verify.KeySet) ([]*verify.Event, []error)) ([]verify.Problem, error) {
	type item struct {
		row     ToolCallRow
		problem *verify.Problem
	}
	var (
		problems  []verify.Problem
		conflicts []string
	)
	err := inOrder(ctx, func(ctx context.Context, add func(item)) error {
		var err error
		conflicts, err = streamToolCalls(ctx, conn, database, func(row ToolCallRow) error {
			add(item{row: row})
			return nil
		})
		return err
	}, func(items []item) {
		raws := make([][]byte, len(items))
		for i := range items {
			raws[i] = []byte(items[i].row.CloudEvent)
		}
		_, errs := verifyEvents(raws, keys)
		for i := range items {
			items[i].problem = toolCallProblem(items[i].row, raws[i], errs[i])
		}
	}, func(it *item) error {
		if it.problem != nil {
			problems = append(problems, *it.problem)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range conflicts {
		problems = append(problems, verify.Problem{Kind: ProblemConflictingCopies, ReceiptID: id, Record: RecordToolCall,
			Detail: "the same tool call event_id is stored as rows that differ"})
	}
	return problems, nil
}

// toolCallProblem is what is wrong with a stored tool_calls row whose
// cloudevent (raw) verified with verr (nil: good), if anything.
func toolCallProblem(row ToolCallRow, raw []byte, verr error) *verify.Problem {
	if verr != nil {
		kind := verify.ProblemMalformed
		var ve *verify.VerifyError
		if errors.As(verr, &ve) {
			kind = ve.Kind
		}
		return &verify.Problem{Kind: kind, ReceiptID: row.EventID, Record: RecordToolCall,
			Detail: "tool call event: " + verr.Error()}
	}
	derived, _, err := ToolCallRowFromEvent(raw)
	if err != nil {
		return &verify.Problem{Kind: ProblemInvalidToolCall, ReceiptID: row.EventID, Record: RecordToolCall,
			Detail: "signed tool call event is not acceptable: " + err.Error()}
	}
	if cols := CompareToolCallColumns(row, derived); len(cols) > 0 {
		return &verify.Problem{Kind: ProblemAlteredColumn, ReceiptID: derived.EventID, Record: RecordToolCall,
			Detail: "tool call event " + derived.ToolCallID + ": stored columns differ from the signed cloudevent: " + strings.Join(cols, ", ")}
	}
	return nil
}
