package query

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/schemas"
)

// LogEntryRow is one row of log_entries: where one record of TALOS_AUDIT
// is in the deployment's transparency log.
type LogEntryRow struct {
	EventID   string
	LogIndex  uint64
	LeafHash  string
	Origin    string
	Subject   string
	StreamSeq uint64
	Oversize  uint8
	Time      time.Time
	TimeMS    uint64
}

const logEntryColumnsSQL = "event_id, log_index, leaf_hash, origin, subject, stream_seq, oversize, time, time_ms"

var logEntryColumns = []insertColumn[LogEntryRow]{
	{name: "event_id", str: func(r *LogEntryRow) string { return r.EventID }},
	{name: "log_index", u64: func(r *LogEntryRow) uint64 { return r.LogIndex }},
	{name: "leaf_hash", str: func(r *LogEntryRow) string { return r.LeafHash }},
	{name: "origin", str: func(r *LogEntryRow) string { return r.Origin }},
	{name: "subject", str: func(r *LogEntryRow) string { return r.Subject }},
	{name: "stream_seq", u64: func(r *LogEntryRow) uint64 { return r.StreamSeq }},
	{name: "oversize", u8: func(r *LogEntryRow) uint8 { return r.Oversize }},
	{name: "time", at: func(r *LogEntryRow) time.Time { return r.Time }},
	{name: "time_ms", u64: func(r *LogEntryRow) uint64 { return r.TimeMS }},
}

// LogEntryRowsOf reads a log index record (schemas.LogIndexBatch) into
// rows appended to dst.
func LogEntryRowsOf(dst []LogEntryRow, data []byte) ([]LogEntryRow, error) {
	var b schemas.LogIndexBatch
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return dst, fmt.Errorf("query: log index record: %w", err)
	}
	t, err := time.Parse(time.RFC3339Nano, b.Time)
	if err != nil || b.Origin == "" {
		return dst, fmt.Errorf("query: log index record: origin %q, time %q", b.Origin, b.Time)
	}
	for _, e := range b.Entries {
		var over uint8
		if e.Oversize {
			over = 1
		}
		dst = append(dst, LogEntryRow{EventID: e.EventID, LogIndex: e.LogIndex, LeafHash: e.LeafHash, Origin: b.Origin,
			Subject: e.Subject, StreamSeq: e.StreamSeq, Oversize: over, Time: t.UTC().Truncate(time.Second), TimeMS: uint64(t.UnixMilli())})
	}
	return dst, nil
}

// InsertLogEntries stores rows in database.log_entries.
func InsertLogEntries(ctx context.Context, conn driver.Conn, database string, rows []LogEntryRow) error {
	return insertTable(ctx, conn, database, TableLogEntries, logEntryColumns, rows, func(err error) error {
		return fmt.Errorf("query: log entries: %w", err)
	})
}

// LogEntriesOf is where the record eventID is in the transparency log
// (one row per copy appended; none while the log role has not announced
// it), found by log_entries' primary key.
func LogEntriesOf(ctx context.Context, conn driver.Conn, database, eventID string) ([]LogEntryRow, error) {
	tbl, err := table(database, ViewLogEntries)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, "SELECT "+logEntryColumnsSQL+" FROM "+tbl+" WHERE event_id = ? ORDER BY log_index", eventID)
	if err != nil {
		return nil, fmt.Errorf("query: log entries of %s: %w", eventID, err)
	}
	defer rows.Close()
	var out []LogEntryRow
	for rows.Next() {
		var r LogEntryRow
		if err := rows.Scan(&r.EventID, &r.LogIndex, &r.LeafHash, &r.Origin, &r.Subject, &r.StreamSeq, &r.Oversize, &r.Time, &r.TimeMS); err != nil {
			return nil, fmt.Errorf("query: log entries of %s: %w", eventID, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
