package query

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts"
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
)

// VerifyDatabase checks every receipt in database.receipts: each
// cloudevent's signature against keys, each chain's continuity (seq from 1
// without gaps, prev_hash links), and that every column agrees with the
// signed cloudevent it came from. It then checks every ToolCallEvent in
// database.tool_calls the same way (signature, columns against the signed
// JSON, conflicting copies); those are not chained, and are named by their
// event id in the problems' ReceiptID. It streams receipts in chain order
// with memory bounded by the number of chains. partial accepts chains
// whose first stored receipt is not seq 1 (after retention). progress, if
// set, is called every 10,000 receipts with the count so far.
func VerifyDatabase(ctx context.Context, conn driver.Conn, database string, keys receipts.KeySet, partial bool, progress func(checked int)) (receipts.Report, error) {
	v := receipts.NewVerifier(keys)
	v.AllowPartial = partial
	var extra []receipts.Problem
	n := 0
	err := StreamReceipts(ctx, conn, database, func(row ReceiptRow) error {
		v.Add([]byte(row.CloudEvent))
		if derived, err := ReceiptRowFromEvent([]byte(row.CloudEvent)); err == nil {
			if cols := CompareColumns(row, derived); len(cols) > 0 {
				// Named by the chain position in the cloudevent, not by
				// the (possibly altered) columns.
				extra = append(extra, receipts.Problem{Kind: ProblemAlteredColumn, ReceiptID: row.ReceiptID,
					ChainID: derived.ChainID, Seq: derived.ChainSeq,
					Detail: "stored columns differ from the signed cloudevent: " + strings.Join(cols, ", ")})
			}
		}
		n++
		if progress != nil && n%10000 == 0 {
			progress(n)
		}
		return nil
	})
	var conflict *ConflictError
	if errors.As(err, &conflict) {
		for _, id := range conflict.ReceiptIDs {
			extra = append(extra, receipts.Problem{Kind: ProblemConflictingCopies, ReceiptID: id,
				Detail: "the same receipt_id is stored as rows that differ"})
		}
		err = nil
	}
	if err != nil {
		return receipts.Report{}, fmt.Errorf("verify: %w", err)
	}
	calls, err := verifyToolCalls(ctx, conn, database, keys)
	if err != nil {
		return receipts.Report{}, fmt.Errorf("verify: %w", err)
	}
	rep := v.Finish()
	rep.Problems = append(append(rep.Problems, extra...), calls...)
	return rep, nil
}

// verifyToolCalls checks each stored tool_calls row: its cloudevent's
// signature against keys, that it is an acceptable ToolCallEvent, and that
// its columns agree with it.
func verifyToolCalls(ctx context.Context, conn driver.Conn, database string, keys receipts.KeySet) ([]receipts.Problem, error) {
	var problems []receipts.Problem
	conflicts, err := streamToolCalls(ctx, conn, database, func(row ToolCallRow) error {
		if _, err := receipts.VerifyEvent([]byte(row.CloudEvent), keys); err != nil {
			kind := receipts.ProblemMalformed
			var ve *receipts.VerifyError
			if errors.As(err, &ve) {
				kind = ve.Kind
			}
			problems = append(problems, receipts.Problem{Kind: kind, ReceiptID: row.EventID,
				Detail: "tool call event: " + err.Error()})
			return nil
		}
		derived, _, err := ToolCallRowFromEvent([]byte(row.CloudEvent))
		if err != nil {
			problems = append(problems, receipts.Problem{Kind: ProblemInvalidToolCall, ReceiptID: row.EventID,
				Detail: "signed tool call event is not acceptable: " + err.Error()})
			return nil
		}
		if cols := CompareToolCallColumns(row, derived); len(cols) > 0 {
			problems = append(problems, receipts.Problem{Kind: ProblemAlteredColumn, ReceiptID: derived.EventID,
				Detail: "tool call event " + derived.ToolCallID + ": stored columns differ from the signed cloudevent: " + strings.Join(cols, ", ")})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range conflicts {
		problems = append(problems, receipts.Problem{Kind: ProblemConflictingCopies, ReceiptID: id,
			Detail: "the same tool call event_id is stored as rows that differ"})
	}
	return problems, nil
}
