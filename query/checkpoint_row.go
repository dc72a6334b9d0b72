package query

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// CheckpointRow is one row of the checkpoints table. Every column but
// InsertedAt is derived from CloudEvent, the exact signed JSON.
type CheckpointRow struct {
	CheckpointID       string // CloudEvent id
	Time               time.Time
	TimeMS             uint64
	ChainID            string
	FromSeq, ToSeq     uint64
	RootHash           string
	LastReceiptHash    string
	SignerKID          string
	CloudEvent         string
	CheckpointSeq      uint64
	TreeSize           uint64
	FirstPrevHash      string
	PrevCheckpointHash string
	Final              uint8
	InsertedAt         time.Time
}

var checkpointInsertColumns = []string{
	"checkpoint_id", "time", "time_ms", "chain_id", "from_seq", "to_seq", "root_hash", "last_receipt_hash",
	"signer_kid", "cloudevent", "checkpoint_seq", "tree_size", "first_prev_hash", "prev_checkpoint_hash", "final",
}

func (r *CheckpointRow) insertValues() []any {
	return []any{r.CheckpointID, r.Time.UTC(), r.TimeMS, r.ChainID, r.FromSeq, r.ToSeq, r.RootHash, r.LastReceiptHash,
		r.SignerKID, r.CloudEvent, r.CheckpointSeq, r.TreeSize, r.FirstPrevHash, r.PrevCheckpointHash, r.Final}
}

func (r *CheckpointRow) scanTargets() []any {
	return []any{&r.CheckpointID, &r.Time, &r.TimeMS, &r.ChainID, &r.FromSeq, &r.ToSeq, &r.RootHash, &r.LastReceiptHash,
		&r.SignerKID, &r.CloudEvent, &r.CheckpointSeq, &r.TreeSize, &r.FirstPrevHash, &r.PrevCheckpointHash, &r.Final, &r.InsertedAt}
}

// CheckpointRowFromEvent derives a checkpoints row from a signed checkpoint
// CloudEvent. It checks the data against its schema, not the signature.
func CheckpointRowFromEvent(raw []byte) (CheckpointRow, error) {
	var ev struct {
		ID   string          `json:"id"`
		Type string          `json:"type"`
		Time string          `json:"time"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil {
		return CheckpointRow{}, fmt.Errorf("query: checkpoint: %w", err)
	}
	if ev.Type != schemas.TypeCheckpoint || ev.ID == "" {
		return CheckpointRow{}, fmt.Errorf("query: type %q id %q is not a checkpoint", ev.Type, ev.ID)
	}
	t, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil || t.Before(time.Unix(0, 0)) {
		return CheckpointRow{}, fmt.Errorf("query: checkpoint %s time %q", ev.ID, ev.Time)
	}
	if err := schemas.ValidateCheckpoint(ev.Data); err != nil {
		return CheckpointRow{}, fmt.Errorf("query: checkpoint %s: %w", ev.ID, err)
	}
	var c schemas.Checkpoint
	if err := json.Unmarshal(ev.Data, &c); err != nil {
		return CheckpointRow{}, fmt.Errorf("query: checkpoint %s: %w", ev.ID, err)
	}
	row := CheckpointRow{CheckpointID: ev.ID, Time: t.UTC().Truncate(time.Second), TimeMS: uint64(t.UnixMilli()),
		ChainID: c.ChainID, FromSeq: c.FromSeq, ToSeq: c.ToSeq, RootHash: c.RootHash, LastReceiptHash: c.LastReceiptHash,
		CloudEvent: string(raw), CheckpointSeq: c.CheckpointSeq, TreeSize: c.TreeSize, FirstPrevHash: c.FirstPrevHash,
		PrevCheckpointHash: c.PrevCheckpointHash, Final: boolByte(c.Final)}
	if c.Signature != nil {
		row.SignerKID = c.Signature.KID
	}
	return row, nil
}

// CompareCheckpointColumns names the columns of row that differ from
// fromEvent (CheckpointRowFromEvent of row.CloudEvent).
func CompareCheckpointColumns(row, fromEvent CheckpointRow) []string {
	return diffColumns(checkpointInsertColumns, row.insertValues(), fromEvent.insertValues())
}

// InsertCheckpoints stores rows in database.checkpoints.
func InsertCheckpoints(ctx context.Context, conn driver.Conn, database string, rows []CheckpointRow) error {
	if len(rows) == 0 {
		return nil
	}
	tbl, err := table(database, TableCheckpoints)
	if err != nil {
		return err
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" ("+strings.Join(checkpointInsertColumns, ", ")+")")
	if err != nil {
		return fmt.Errorf("query: checkpoints: %w", err)
	}
	defer batch.Abort()
	for i := range rows {
		if err := batch.Append(rows[i].insertValues()...); err != nil {
			return fmt.Errorf("query: checkpoints: %w", err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("query: checkpoints: %w", err)
	}
	return nil
}

// StreamCheckpoints calls fn for every distinct row of database.checkpoints
// in (chain_id, checkpoint_seq) order; identical copies (a sink
// redelivery) are passed once.
func StreamCheckpoints(ctx context.Context, conn driver.Conn, database string, fn func(CheckpointRow) error) error {
	return scanCheckpoints(ctx, conn, database, "", nil, fn)
}

func scanCheckpoints(ctx context.Context, conn driver.Conn, database, where string, args []any, fn func(CheckpointRow) error) error {
	tbl, err := table(database, TableCheckpoints)
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, "SELECT "+strings.Join(checkpointInsertColumns, ", ")+", inserted_at FROM "+tbl+where+
		" ORDER BY chain_id, checkpoint_seq, checkpoint_id, cloudevent", args...)
	if err != nil {
		return fmt.Errorf("query: checkpoints: %w", err)
	}
	defer rows.Close()
	var prev *CheckpointRow
	for rows.Next() {
		var r CheckpointRow
		if err := rows.Scan(r.scanTargets()...); err != nil {
			return fmt.Errorf("query: checkpoints: %w", err)
		}
		r.Time, r.InsertedAt = r.Time.UTC(), r.InsertedAt.UTC()
		if prev != nil && len(diffColumns(checkpointInsertColumns, prev.insertValues(), r.insertValues())) == 0 {
			continue
		}
		if err := fn(r); err != nil {
			return err
		}
		prev = &r
	}
	return rows.Err()
}

// ErrNoCheckpoint is returned by ProveReceipt when no stored checkpoint
// covers the receipt yet.
var ErrNoCheckpoint = errors.New("query: no checkpoint covers this receipt yet")

// ErrNoReceipt is returned by ProveReceipt when no stored receipt has
// the id.
var ErrNoReceipt = errors.New("query: no receipt has this id")

// ProveReceipt builds the inclusion proof of one stored receipt: the
// checkpoint of its chain whose range holds its seq, and the audit path
// over the receipt hashes of that range (recomputed from the stored signed
// JSON, not taken from the receipt_hash column). The proof is checked
// with keys before it is returned.
func ProveReceipt(ctx context.Context, conn driver.Conn, database, receiptID string, keys verify.KeySet) (*verify.Proof, *verify.ProofResult, error) {
	tbl, err := table(database, TableReceipts)
	if err != nil {
		return nil, nil, err
	}
	var ce string
	err = conn.QueryRow(ctx, "SELECT cloudevent FROM "+tbl+" WHERE receipt_id = ? ORDER BY inserted_at LIMIT 1", receiptID).Scan(&ce)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil, fmt.Errorf("receipt %s: %w", receiptID, ErrNoReceipt)
	case err != nil:
		return nil, nil, fmt.Errorf("query: receipt %s: %w", receiptID, err)
	}
	row, err := ReceiptRowFromEvent([]byte(ce))
	if err != nil {
		return nil, nil, err
	}
	var cp *CheckpointRow
	err = scanCheckpoints(ctx, conn, database, " WHERE chain_id = ? AND from_seq <= ? AND to_seq >= ?",
		[]any{row.ChainID, row.ChainSeq, row.ChainSeq}, func(r CheckpointRow) error {
			if cp == nil {
				cp = &r
			}
			return nil
		})
	if err != nil {
		return nil, nil, err
	}
	if cp == nil {
		return nil, nil, fmt.Errorf("receipt %s (chain %s seq %d): %w", receiptID, row.ChainID, row.ChainSeq, ErrNoCheckpoint)
	}
	hashes := make([]string, 0, cp.TreeSize)
	next := cp.FromSeq
	err = scanReceiptRange(ctx, conn, database, row.ChainID, cp.FromSeq, cp.ToSeq, func(seq uint64, ce string) error {
		if seq < next {
			return nil // an identical copy
		}
		if seq != next {
			return fmt.Errorf("query: chain %s seq %d is not stored: the range of checkpoint %d cannot be proven", row.ChainID, next, cp.CheckpointSeq)
		}
		h, err := verify.ReceiptHash([]byte(ce))
		if err != nil {
			return err
		}
		hashes = append(hashes, h)
		next++
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return verify.BuildProof([]byte(ce), []byte(cp.CloudEvent), hashes, keys)
}

func scanReceiptRange(ctx context.Context, conn driver.Conn, database, chainID string, from, to uint64, fn func(seq uint64, ce string) error) error {
	tbl, err := table(database, TableReceipts)
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, "SELECT chain_seq, cloudevent FROM "+tbl+
		" WHERE chain_id = ? AND chain_seq >= ? AND chain_seq <= ? ORDER BY chain_seq, inserted_at", chainID, from, to)
	if err != nil {
		return fmt.Errorf("query: receipts of chain %s: %w", chainID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq uint64
		var ce string
		if err := rows.Scan(&seq, &ce); err != nil {
			return err
		}
		if err := fn(seq, ce); err != nil {
			return err
		}
	}
	return rows.Err()
}
