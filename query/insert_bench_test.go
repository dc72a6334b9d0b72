package query

import (
	"fmt"
	"testing"
)

// BenchmarkInsertReceiptRows10k is BenchmarkInsertReceipts10k for both
// insert paths side by side: InsertReceipts (one row at a time, one block)
// and insertReceiptRows (column by column, in insertBlockRows blocks), with
// the CPU time of this process and of the test ClickHouse per row. Each
// path writes into its own database, dropped when it ends, so that the
// merges of one do not land on the other.
func BenchmarkInsertReceiptRows10k(b *testing.B) {
	const n = 10_000
	rows := benchReceiptRows(b, n)
	for _, path := range []struct {
		name   string
		insert func(b *testing.B) func() error
	}{
		{"rows", func(b *testing.B) func() error {
			ctx, conn, db := migrated(b)
			return func() error { return InsertReceipts(ctx, conn, db, rows) }
		}},
		{"columns", func(b *testing.B) func() error {
			ctx, conn, db := migrated(b)
			return func() error { return insertReceiptRows(ctx, conn, db, rows) }
		}},
	} {
		b.Run(path.name, func(b *testing.B) {
			insert := path.insert(b)
			b.ReportAllocs()
			b.ResetTimer()
			defer reportCPU(b, n)()
			for b.Loop() {
				if err := insert(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchReceiptRows are n receipts of one chain, copies of one with their
// own ids and chain positions.
func benchReceiptRows(b *testing.B, n int) []ReceiptRow {
	b.Helper()
	_, base := chainOf(b, "bench", 1, t0)
	rows := make([]ReceiptRow, n)
	for i := range rows {
		rows[i] = base[0]
		rows[i].ReceiptID = fmt.Sprintf("0190a1b2-0000-7000-8000-%012d", i)
		rows[i].ChainSeq = uint64(i + 1)
	}
	return rows
}
