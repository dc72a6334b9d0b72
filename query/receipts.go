package query

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// InsertReceipts writes rows to database.receipts in one batch (one INSERT).
// Inserting a row twice is harmless: readers dedupe by receipt_id. The caller
// bounds len(rows) (the sink's batch size).
func InsertReceipts(ctx context.Context, conn driver.Conn, database string, rows []ReceiptRow) error {
	return insertReceiptRows(ctx, conn, database, rows)
}

// ErrConflictingReceipt marks a receipt_id stored as two rows that differ.
var ErrConflictingReceipt = errors.New("receipt stored twice with different content")

// ConflictError lists the receipt_ids StreamReceipts found stored as more
// than one distinct row. It matches ErrConflictingReceipt with errors.Is.
type ConflictError struct {
	ReceiptIDs []string
}

func (e *ConflictError) Error() string {
	const show = 10
	ids := e.ReceiptIDs
	more := ""
	if len(ids) > show {
		ids, more = ids[:show], fmt.Sprintf(" and %d more", len(e.ReceiptIDs)-show)
	}
	return fmt.Sprintf("query: %d receipt(s) stored twice with different content: %s%s",
		len(e.ReceiptIDs), strings.Join(ids, ", "), more)
}

func (e *ConflictError) Is(target error) bool { return target == ErrConflictingReceipt }

// StreamReceipts calls fn for every row of database.receipts in chain order
// (chain_id, chain_seq, receipt_id), reading the result as a stream: memory
// is bounded by one receipt_id's copies, not by the table.
//
// Rows that are identical except inserted_at (a sink redelivery before a
// merge) are passed to fn once. When one receipt_id is stored as rows that
// differ in any column (e.g. two different cloudevent), fn gets every
// variant and, after the stream ends, StreamReceipts returns a *ConflictError
// naming those receipt_ids. Copies of a receipt_id whose chain_id or
// chain_seq columns differ are not adjacent in this order; they reach fn as
// separate rows and the chain check (a repeated receipt or seq) must catch
// them. An error from fn stops the stream and is returned as is.
func StreamReceipts(ctx context.Context, conn driver.Conn, database string, fn func(ReceiptRow) error) error {
	var (
		group     []ReceiptRow // distinct variants of the current receipt_id
		conflicts []string
	)
	err := scanReceipts(streamContext(ctx), conn, database, " ORDER BY chain_id, chain_seq, receipt_id", func(r ReceiptRow) error {
		if len(group) > 0 && group[0].ReceiptID != r.ReceiptID {
			group = group[:0]
		}
		for i := range group {
			if sameStored(&group[i], &r) {
				return nil
			}
		}
		group = append(group, r)
		if len(group) == 2 {
			conflicts = append(conflicts, r.ReceiptID)
		}
		return fn(r)
	})
	if err != nil {
		return err
	}
	if len(conflicts) > 0 {
		return &ConflictError{ReceiptIDs: conflicts}
	}
	return nil
}

// streamReceiptsStored calls fn for every row of database.receipts in the
// order ClickHouse stores them, read by one thread: part after part, in
// the order parts were inserted, each part in receipt_id order. Receipt
// ids are UUIDv7 (time-ordered) and a chain's receipts are sealed in seq
// order, so this is each chain's seq order unless rows were inserted late
// or copies were stored twice; nothing here relies on it (see
// verifyStoredOrder). ClickHouse sorts nothing, so the first row comes at
// once. Rows are not deduplicated. An error from fn stops the stream and is
// returned as is.
func streamReceiptsStored(ctx context.Context, conn driver.Conn, database string, fn func(ReceiptRow) error) error {
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"max_block_size": streamBlockRows,
		"max_threads":    1,
	}))
	return scanReceipts(ctx, conn, database, "", fn)
}

// scanReceipts streams `SELECT <every column> FROM database.receipts<tail>`
// (ctx carries the query's settings) and calls fn for every row, its times
// in UTC. An error from fn stops the stream and is returned as is.
func scanReceipts(ctx context.Context, conn driver.Conn, database, tail string, fn func(ReceiptRow) error) error {
	tbl, err := table(database, TableReceipts)
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, "SELECT "+strings.Join(receiptInsertColumns, ", ")+", inserted_at FROM "+tbl+tail)
	if err != nil {
		return fmt.Errorf("query: stream receipts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r ReceiptRow
		if err := rows.Scan(r.scanTargets()...); err != nil {
			return fmt.Errorf("query: stream receipts: %w", err)
		}
		r.Time = r.Time.UTC()
		r.InsertedAt = r.InsertedAt.UTC()
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("query: stream receipts: %w", err)
	}
	return nil
}

// MutateAndWait runs `ALTER TABLE database.table <sqlTail>` (an UPDATE or
// DELETE mutation) and waits until ClickHouse reports every mutation of the
// table done. Mutations are asynchronous (18.16 has no mutations_sync), so
// this polls system.mutations. It exists for tamper tests: it rewrites
// stored rows the way an attacker with write access would.
func MutateAndWait(ctx context.Context, conn driver.Conn, database, tableName, sqlTail string) error {
	tbl, err := table(database, tableName)
	if err != nil {
		return err
	}
	if err := conn.Exec(ctx, "ALTER TABLE "+tbl+" "+sqlTail); err != nil {
		return fmt.Errorf("query: mutate %s: %w", tbl, err)
	}
	// Names are validated, so inlining them is safe.
	q := "SELECT count() FROM system.mutations WHERE database = '" + database + "' AND table = '" + tableName + "' AND is_done = 0"
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var pending uint64
		if err := conn.QueryRow(ctx, q).Scan(&pending); err != nil {
			return fmt.Errorf("query: wait for mutation of %s: %w", tbl, err)
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("query: wait for mutation of %s: %w", tbl, ctx.Err())
		case <-tick.C:
		}
	}
}
