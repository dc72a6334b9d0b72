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
}

// VerifyDatabaseWith is VerifyDatabase with options.
func VerifyDatabaseWith(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet, opts VerifyOptions) (verify.Report, error) {
	v := verify.NewVerifier(keys)
	v.AllowPartial = opts.Partial
	extra, err := verifyCheckpoints(ctx, conn, database, v)
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	feed := &receiptFeeder{v: v, held: map[string][]heldRow{}, progress: opts.Progress, extra: extra}
	if feed.progress != nil {
		feed.total = countReceipts(ctx, conn, database)
	}
	verifyEvents := verify.VerifyEvents
	if opts.BatchSignatures {
		verifyEvents = verify.VerifyEventsBatch
	}
	err = streamVerified(ctx, conn, database, keys, verifyEvents, feed.process)
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
	calls, err := verifyToolCalls(ctx, conn, database, keys)
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	missing, err := missingReceipts(ctx, conn, database)
	if err != nil {
		return verify.Report{}, fmt.Errorf("verify: %w", err)
	}
	rep := v.Finish()
	rep.Problems = append(append(append(rep.Problems, feed.extra...), calls...), missing...)
	return rep, nil
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
	n        int                   // rows processed
	total    int                   // stored receipt rows, 0 if not counted
	progress func(done, total int) // nil for none
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
	f.n++
	if f.progress != nil && f.n%10000 == 0 {
		f.progress(f.n, max(f.total, f.n))
	}
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
	if f.progress != nil && f.n >= 10000 {
		f.progress(f.n, max(f.total, f.n))
	}
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

type verifyBatch struct {
	items []verifyItem
	done  chan struct{} // closed once every item is checked
}

// verifyBatchRows is how many rows travel together between goroutines.
const verifyBatchRows = 256

// streamVerified streams database.receipts (StreamReceipts) and calls
// process for every row, in stream order, after its signature check (by
// verifyEvents, a batch at a time) and derivation ran on one of
// GOMAXPROCS goroutines. Memory: a few batches in flight.
func streamVerified(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet,
	verifyEvents func([][]byte, verify.KeySet) ([]*verify.Event, []error), process func(*verifyItem)) error {
	workers := runtime.GOMAXPROCS(0)
	work := make(chan *verifyBatch, 2*workers)
	ordered := make(chan *verifyBatch, 4*workers)
	var streamErr error
	go func() {
		defer close(ordered)
		defer close(work)
		var cur *verifyBatch
		send := func() {
			work <- cur
			ordered <- cur
			cur = nil
		}
		streamErr = StreamReceipts(ctx, conn, database, func(row ReceiptRow) error {
			if cur == nil {
				cur = &verifyBatch{items: make([]verifyItem, 0, verifyBatchRows), done: make(chan struct{})}
			}
			cur.items = append(cur.items, verifyItem{row: row})
			if len(cur.items) == verifyBatchRows {
				send()
			}
			return nil
		})
		if cur != nil {
			send()
		}
	}()
	for range workers {
		go func() {
			raws := make([][]byte, 0, verifyBatchRows)
			for b := range work {
				raws = raws[:0]
				for i := range b.items {
					raws = append(raws, []byte(b.items[i].row.CloudEvent))
				}
				evs, errs := verifyEvents(raws, keys)
				for i := range b.items {
					it := &b.items[i]
					it.raw = raws[i]
					it.ev, it.verr = evs[i], errs[i]
					it.derived, it.derr = derivedRow(it.row.CloudEvent, raws[i], it.ev)
				}
				close(b.done)
			}
		}()
	}
	for b := range ordered {
		<-b.done
		for i := range b.items {
			process(&b.items[i])
		}
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
// signature against keys, that it is an acceptable ToolCallEvent, and that
// its columns agree with it.
func verifyToolCalls(ctx context.Context, conn driver.Conn, database string, keys verify.KeySet) ([]verify.Problem, error) {
	var problems []verify.Problem
	conflicts, err := streamToolCalls(ctx, conn, database, func(row ToolCallRow) error {
		if _, err := verify.VerifyEvent([]byte(row.CloudEvent), keys); err != nil {
			kind := verify.ProblemMalformed
			var ve *verify.VerifyError
			if errors.As(err, &ve) {
				kind = ve.Kind
			}
			problems = append(problems, verify.Problem{Kind: kind, ReceiptID: row.EventID, Record: RecordToolCall,
				Detail: "tool call event: " + err.Error()})
			return nil
		}
		derived, _, err := ToolCallRowFromEvent([]byte(row.CloudEvent))
		if err != nil {
			problems = append(problems, verify.Problem{Kind: ProblemInvalidToolCall, ReceiptID: row.EventID, Record: RecordToolCall,
				Detail: "signed tool call event is not acceptable: " + err.Error()})
			return nil
		}
		if cols := CompareToolCallColumns(row, derived); len(cols) > 0 {
			problems = append(problems, verify.Problem{Kind: ProblemAlteredColumn, ReceiptID: derived.EventID, Record: RecordToolCall,
				Detail: "tool call event " + derived.ToolCallID + ": stored columns differ from the signed cloudevent: " + strings.Join(cols, ", ")})
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
