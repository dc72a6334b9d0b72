package query

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/schemas"
)

// ControlEventRow is one row of control_events: a control receipt (a
// responder's command, accepted or refused) flattened for auditors. The
// same receipt is also a row of receipts, where the verifier covers it.
type ControlEventRow struct {
	EventID      string // CloudEvent id (= receipt_id)
	Type         string // CloudEvent type
	Verb         string
	Time         time.Time
	TimeMS       uint64
	StreamSeq    uint64 // TALOS_CONTROL seq of an accepted mutation; 0 otherwise
	Actor        string
	Target       string
	Reason       string
	SignerKID    string // the talosd key that signed the receipt
	CommandID    string
	Accepted     bool
	Code         string // refusal code; "" when accepted
	CommandHash  string
	ResponderKID string // the responder key that signed the command
	ChainID      string
	ChainSeq     uint64
	CloudEvent   string
}

// controlRowFromReceipt derives the control_events row of a control receipt
// already turned into row (its receipts row) and c (its data.control).
func controlRowFromReceipt(row *ReceiptRow, c *schemas.ControlRecord) (ControlEventRow, error) {
	if c == nil {
		return ControlEventRow{}, fmt.Errorf("query: control receipt %s has no data.control", row.ReceiptID)
	}
	return ControlEventRow{
		EventID: row.ReceiptID, Type: schemas.ReceiptType(schemas.KindControl), Verb: c.Verb,
		Time: row.Time, TimeMS: row.TimeMS, StreamSeq: c.Seq, Actor: c.Actor, Target: c.Target, Reason: c.Reason,
		SignerKID: row.SignerKID, CommandID: c.CommandID, Accepted: c.Accepted, Code: c.Code,
		CommandHash: c.CommandHash, ResponderKID: c.ResponderKID, ChainID: row.ChainID, ChainSeq: row.ChainSeq,
		CloudEvent: row.CloudEvent,
	}, nil
}

// InsertControlEvents writes rows to database.control_events in one batch.
func InsertControlEvents(ctx context.Context, conn driver.Conn, database string, rows []ControlEventRow) error {
	return insertEach(ctx, conn, database, TableControlEvents, controlColumnsSQL, rows, "control event",
		func(r *ControlEventRow) string { return r.EventID },
		func(r *ControlEventRow) []any {
			return []any{r.EventID, r.Type, r.Verb, r.Time.UTC(), r.TimeMS, r.StreamSeq, r.Actor, r.Target, r.Reason,
				r.SignerKID, r.CommandID, boolByte(r.Accepted), r.Code, r.CommandHash, r.ResponderKID, r.ChainID, r.ChainSeq, r.CloudEvent}
		})
}

// ControlEvents returns the control receipts of database, oldest first
// (deduplicated), at most limit rows (0 = all).
func ControlEvents(ctx context.Context, conn driver.Conn, database string, limit int) ([]ControlEventRow, error) {
	v, err := table(database, ViewControlEvents)
	if err != nil {
		return nil, err
	}
	q := limited("SELECT "+controlColumnsSQL+" FROM "+v+" ORDER BY time_ms, event_id", limit)
	return selectAll(ctx, conn, "control events", q, func(rows driver.Rows, r *ControlEventRow) error {
		var accepted uint8
		err := rows.Scan(&r.EventID, &r.Type, &r.Verb, &r.Time, &r.TimeMS, &r.StreamSeq, &r.Actor, &r.Target, &r.Reason,
			&r.SignerKID, &r.CommandID, &accepted, &r.Code, &r.CommandHash, &r.ResponderKID, &r.ChainID, &r.ChainSeq, &r.CloudEvent)
		r.Accepted = accepted == 1
		return err
	})
}
