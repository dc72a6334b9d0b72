package query

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/schemas"
)

// SinkWriter projects TALOS_AUDIT records into ClickHouse. It implements
// the ingest sink's Writer: Write returns nil only when every record of
// the batch is stored. Receipts go to receipts (control receipts also to
// control_events); checkpoints to checkpoints; ToolCallEvents to tool_calls with their redacted
// payloads in artifacts, or, when the flight recorder refuses one (seed
// 001), to tool_call_rejections. Records it cannot turn into rows at all are
// not dropped: they are stored as they are in dead_letters with the reason,
// so an auditor sees them and `talosctl rebuild` can retry them.
type SinkWriter struct {
	conn     driver.Conn
	database string
	rows     atomic.Uint64
}

// NewSinkWriter returns a writer into database.
func NewSinkWriter(conn driver.Conn, database string) *SinkWriter {
	return &SinkWriter{conn: conn, database: database}
}

// toolCallSubjectPrefix is the TALOS_AUDIT subject prefix of ToolCallEvents
// (schemas.ToolCallEventSubject).
const toolCallSubjectPrefix = "talos.audit.toolcall."

// checkpointSubjectPrefix is the TALOS_AUDIT subject prefix of chain
// checkpoints (schemas.CheckpointSubject).
const checkpointSubjectPrefix = "talos.audit.checkpoint."

// Rows is how many records this writer has stored.
func (w *SinkWriter) Rows() uint64 { return w.rows.Load() }

// Write stores one batch. Inserts are idempotent by id (ReplacingMergeTree),
// so a batch retried after a partial failure is safe.
func (w *SinkWriter) Write(ctx context.Context, recs []schemas.AuditRecord) error {
	var (
		rows      []ReceiptRow
		control   []ControlEventRow
		calls     []ToolCallRow
		artifacts []Artifact
		rejected  []ToolCallRejection
		cps       []CheckpointRow
		dead      []DeadLetter
	)
	for _, rec := range recs {
		switch {
		case strings.HasPrefix(rec.Subject, "talos.audit.receipt."):
			row, data, err := receiptRowFromEvent(rec.Data)
			if err == nil && row.Kind == schemas.KindControl {
				var c ControlEventRow
				if c, err = controlRowFromReceipt(&row, data); err == nil {
					control = append(control, c)
				}
			}
			if err != nil {
				dead = append(dead, DeadLetter{Subject: rec.Subject, StreamSeq: rec.StreamSeq, Reason: err.Error(), Data: string(rec.Data)})
				continue
			}
			rows = append(rows, row)
		case strings.HasPrefix(rec.Subject, toolCallSubjectPrefix):
			row, arts, err := ToolCallRowFromEvent(rec.Data)
			var rej *RejectedToolCall
			switch {
			case err == nil:
				calls, artifacts = append(calls, row), append(artifacts, arts...)
			case errors.As(err, &rej):
				rejected = append(rejected, RejectionOf(rec, rej))
			default:
				dead = append(dead, DeadLetter{Subject: rec.Subject, StreamSeq: rec.StreamSeq, Reason: err.Error(), Data: string(rec.Data)})
			}
		case strings.HasPrefix(rec.Subject, checkpointSubjectPrefix):
			row, err := CheckpointRowFromEvent(rec.Data)
			if err != nil {
				dead = append(dead, DeadLetter{Subject: rec.Subject, StreamSeq: rec.StreamSeq, Reason: err.Error(), Data: string(rec.Data)})
				continue
			}
			cps = append(cps, row)
		default:
			dead = append(dead, DeadLetter{Subject: rec.Subject, StreamSeq: rec.StreamSeq,
				Reason: "no projection for this subject in this version", Data: string(rec.Data)})
		}
	}
	if len(rows) > 0 {
		if err := InsertReceipts(ctx, w.conn, w.database, rows); err != nil {
			return err
		}
	}
	// A control receipt is in both tables; both inserts are idempotent, so
	// a retry after the first succeeded is harmless.
	if err := InsertControlEvents(ctx, w.conn, w.database, control); err != nil {
		return err
	}
	// Artifacts before the rows that reference them, so that a reader
	// never sees an args_ref with nothing behind it.
	if err := InsertArtifacts(ctx, w.conn, w.database, artifacts); err != nil {
		return err
	}
	if err := InsertToolCalls(ctx, w.conn, w.database, calls); err != nil {
		return err
	}
	if err := InsertToolCallRejections(ctx, w.conn, w.database, rejected); err != nil {
		return err
	}
	if err := InsertCheckpoints(ctx, w.conn, w.database, cps); err != nil {
		return err
	}
	if len(dead) > 0 {
		if err := InsertDeadLetters(ctx, w.conn, w.database, dead); err != nil {
			return err
		}
	}
	w.rows.Add(uint64(len(recs)))
	return nil
}

// DeadLetter is an audit record the projection could not turn into a row.
type DeadLetter struct {
	Subject   string
	StreamSeq uint64
	Reason    string
	Data      string
}

// InsertDeadLetters stores records in database.dead_letters.
func InsertDeadLetters(ctx context.Context, conn driver.Conn, database string, recs []DeadLetter) error {
	tbl, err := table(database, TableDeadLetters)
	if err != nil {
		return err
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" (subject, stream_seq, reason, data)")
	if err != nil {
		return fmt.Errorf("query: dead letters: %w", err)
	}
	defer batch.Abort()
	for _, r := range recs {
		if err := batch.Append(r.Subject, r.StreamSeq, r.Reason, r.Data); err != nil {
			return fmt.Errorf("query: dead letters: %w", err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("query: dead letters: %w", err)
	}
	return nil
}

// CountSessionReceipts counts distinct receipts of one session (used by
// `talosctl bench` to see when a run has fully reached ClickHouse).
func CountSessionReceipts(ctx context.Context, conn driver.Conn, database, sessionID string) (uint64, error) {
	tbl, err := table(database, TableReceipts)
	if err != nil {
		return 0, err
	}
	var n uint64
	err = conn.QueryRow(ctx, "SELECT uniqExact(receipt_id) FROM "+tbl+" WHERE session_id = ?", sessionID).Scan(&n)
	return n, err
}

// CountSessionToolCalls is how many distinct ToolCallEvents of a session
// are stored (for benchmarks and tests).
func CountSessionToolCalls(ctx context.Context, conn driver.Conn, database, sessionID string) (uint64, error) {
	tbl, err := table(database, TableToolCalls)
	if err != nil {
		return 0, err
	}
	var n uint64
	err = conn.QueryRow(ctx, "SELECT uniqExact(event_id) FROM "+tbl+" WHERE session_id = ?", sessionID).Scan(&n)
	return n, err
}
