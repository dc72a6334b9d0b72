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
	// ProblemConflictingCopies: one receipt_id is stored as rows that differ.
	ProblemConflictingCopies = "conflicting_copies"
)

// VerifyDatabase checks every receipt in database.receipts: each
// cloudevent's signature against keys, each chain's continuity (seq from 1
// without gaps, prev_hash links), and that every column agrees with the
// signed cloudevent it came from. It streams in chain order with memory
// bounded by the number of chains. partial accepts chains whose first
// stored receipt is not seq 1 (after retention). progress, if set, is called every 10,000
// receipts with the count so far.
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
	rep := v.Finish()
	rep.Problems = append(rep.Problems, extra...)
	return rep, nil
}
