package query

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/schemas"
)

// Export kinds (ExportOptions.Kind).
const (
	// ExportAll is receipts, tool calls, rejected tool calls and
	// checkpoints: every record of the audit stream the database holds,
	// once (control receipts are receipts).
	ExportAll = "all"
	// ExportReceipts is every receipt (decision, effect and control), in
	// chain order, then the checkpoints over them: what `talosctl verify
	// --file` checks link by link, the checkpoints anchoring each chain's
	// end (without them a receipt removed from the end of a chain, or a
	// whole chain, would not show).
	ExportReceipts = "receipts"
	// ExportToolCalls is every ToolCallEvent, oldest first.
	ExportToolCalls = "toolcalls"
	// ExportRejected is every ToolCallEvent the flight recorder refused
	// (tool_call_rejections), as stored, oldest first.
	ExportRejected = "rejected"
	// ExportCheckpoints is every signed checkpoint, in chain order.
	ExportCheckpoints = "checkpoints"
	// ExportControl is the control receipts alone (a subset of
	// ExportReceipts), in chain order, with their verb, target and actor.
	ExportControl = "control"
)

// ExportKinds lists the values of ExportOptions.Kind.
var ExportKinds = []string{ExportReceipts, ExportToolCalls, ExportRejected, ExportCheckpoints, ExportControl, ExportAll}

// RecordToolCallRejected is ExportRecord.Record of a ToolCallEvent the
// flight recorder refused.
const RecordToolCallRejected = "toolcall_rejected"

// Export formats (NewExportWriter).
const (
	// ExportJSONL is one signed CloudEvent per line, as stored; a
	// rejected ToolCallEvent is one ExportedRejection line instead.
	ExportJSONL = "jsonl"
	// ExportCSV is ExportColumns, the signed CloudEvent last.
	ExportCSV = "csv"
)

// ExportOptions says what Export reads; the zero value exports every signed
// record.
type ExportOptions struct {
	Kind     string    // one of ExportKinds; "" = ExportAll
	From, To time.Time // [From, To) on the record's time; zero = unbounded
}

// ExportRecord is one signed record of an export: CloudEvent is the exact
// signed JSON as stored; the other fields are its stored columns, for
// reading an export without parsing JSON (they are evidence only as far as
// they agree with CloudEvent, which `talosctl verify` checks in the
// database).
type ExportRecord struct {
	// Record is the receipt kind (decision, effect, control), "toolcall",
	// RecordToolCallRejected or "checkpoint".
	Record string
	ID     string    // CloudEvent id
	Time   time.Time // CloudEvent time, milliseconds, UTC
	// ChainID and ChainSeq place a receipt in its chain; for a checkpoint
	// ChainSeq is the last seq it covers and Target its range "from..to".
	ChainID        string
	ChainSeq       uint64
	ToolCallID     string
	SessionID      string
	AgentID        string
	ServerID       string
	ToolName       string
	Phase          string
	Decision       string
	ReasonCodes    []string
	RegistryDigest string
	// Verb, Target and Actor describe a control receipt (ExportControl).
	Verb, Target, Actor string
	SignerKID           string
	// Subject, StreamSeq, Missing and Rejection describe a rejected
	// ToolCallEvent (ExportRejected): where it arrived on TALOS_AUDIT, the
	// required fields it lacks and why the recorder refused it.
	Subject   string
	StreamSeq uint64
	Missing   []string
	Rejection string
	// CloudEvent is the signed JSON as stored (of a rejected ToolCallEvent:
	// as received, less the payloads RejectionOf withholds).
	CloudEvent string
}

// ExportColumns are the CSV columns of an export, in the order of
// ExportRecord.CSVValues; the signed JSON is the last.
var ExportColumns = []string{
	"record", "id", "time", "chain_id", "chain_seq", "tool_call_id", "session_id", "agent_id", "server_id",
	"tool_name", "phase", "decision", "reason_codes", "registry_digest", "verb", "target", "actor", "signer_kid",
	"missing", "rejection", "cloudevent",
}

// CSVValues renders r as ExportColumns: the time in RFC 3339 with
// milliseconds, reason codes joined by ";".
func (r *ExportRecord) CSVValues() []string {
	seq := ""
	if r.ChainSeq > 0 {
		seq = strconv.FormatUint(r.ChainSeq, 10)
	}
	return []string{
		r.Record, r.ID, r.Time.UTC().Format(schemas.TimeFormat), r.ChainID, seq, r.ToolCallID, r.SessionID, r.AgentID,
		r.ServerID, r.ToolName, r.Phase, r.Decision, strings.Join(r.ReasonCodes, ";"), r.RegistryDigest, r.Verb,
		r.Target, r.Actor, r.SignerKID, strings.Join(r.Missing, ";"), r.Rejection, r.CloudEvent,
	}
}

// exportSource is how one kind is read: a SELECT whose columns scan into
// an ExportRecord, ordered so that copies of one record are adjacent. Each
// SELECT has time_ms, which scan reads into ms; record is the Record of
// every row, "" where scan reads it.
type exportSource struct {
	table   string
	columns string
	order   string
	record  string
	scan    func(rows driver.Rows, r *ExportRecord, ms *uint64) error
}

var exportSources = map[string]exportSource{
	ExportReceipts: {
		table: TableReceipts,
		columns: "receipt_id, kind, time_ms, chain_id, chain_seq, tool_call_id, session_id, agent_id, server_id, tool_name, " +
			"phase, decision, reason_codes, registry_digest, signer_kid, cloudevent",
		order: "chain_id, chain_seq, receipt_id",
		scan: func(rows driver.Rows, r *ExportRecord, ms *uint64) error {
			return rows.Scan(&r.ID, &r.Record, ms, &r.ChainID, &r.ChainSeq, &r.ToolCallID, &r.SessionID, &r.AgentID,
				&r.ServerID, &r.ToolName, &r.Phase, &r.Decision, &r.ReasonCodes, &r.RegistryDigest, &r.SignerKID, &r.CloudEvent)
		},
	},
	ExportToolCalls: {
		table: TableToolCalls,
		columns: "event_id, time_ms, tool_call_id, session_id, agent_id, server_id, tool_name, phase, decision, " +
			"reason_codes, signer_kid, cloudevent",
		order:  "time_ms, event_id",
		record: "toolcall",
		scan: func(rows driver.Rows, r *ExportRecord, ms *uint64) error {
			return rows.Scan(&r.ID, ms, &r.ToolCallID, &r.SessionID, &r.AgentID, &r.ServerID, &r.ToolName, &r.Phase,
				&r.Decision, &r.ReasonCodes, &r.SignerKID, &r.CloudEvent)
		},
	},
	ExportRejected: {
		table:   TableToolCallRejections,
		columns: "event_id, time_ms, subject, stream_seq, missing, reason, cloudevent",
		order:   "time_ms, event_id",
		record:  RecordToolCallRejected,
		scan: func(rows driver.Rows, r *ExportRecord, ms *uint64) error {
			return rows.Scan(&r.ID, ms, &r.Subject, &r.StreamSeq, &r.Missing, &r.Rejection, &r.CloudEvent)
		},
	},
	ExportCheckpoints: {
		table:   TableCheckpoints,
		columns: "checkpoint_id, time_ms, chain_id, from_seq, to_seq, signer_kid, cloudevent",
		order:   "chain_id, checkpoint_seq, to_seq, checkpoint_id",
		record:  "checkpoint",
		scan: func(rows driver.Rows, r *ExportRecord, ms *uint64) error {
			var from uint64
			err := rows.Scan(&r.ID, ms, &r.ChainID, &from, &r.ChainSeq, &r.SignerKID, &r.CloudEvent)
			r.Target = fmt.Sprintf("%d..%d", from, r.ChainSeq)
			return err
		},
	},
	ExportControl: {
		table:   TableControlEvents,
		columns: "event_id, time_ms, chain_id, chain_seq, verb, target, actor, signer_kid, cloudevent",
		order:   "chain_id, chain_seq, event_id",
		record:  schemas.KindControl,
		scan: func(rows driver.Rows, r *ExportRecord, ms *uint64) error {
			return rows.Scan(&r.ID, ms, &r.ChainID, &r.ChainSeq, &r.Verb, &r.Target, &r.Actor, &r.SignerKID, &r.CloudEvent)
		},
	},
}

// Export calls fn with every signed record of opts.Kind in database whose
// time is in [opts.From, opts.To), as a stream: memory is bounded by one
// record's stored copies (the server sorts on disk beyond 256 MiB).
// Receipts, checkpoints and control receipts come in chain order (chain_id,
// seq), tool calls and rejected ones oldest first; ExportReceipts is
// receipts, then checkpoints; ExportAll is receipts, then tool calls, then
// rejected tool calls, then checkpoints.
//
// Copies of a record stored more than once with the same signed JSON (a
// sink redelivery) reach fn once. When one id is stored with different
// signed JSON, fn gets every variant (an offline verifier then reports the
// fork) and Export, after the stream ends, returns a *ConflictError naming
// those ids. An error from fn stops the export and is returned as is.
func Export(ctx context.Context, conn driver.Conn, database string, opts ExportOptions, fn func(*ExportRecord) error) error {
	kinds := []string{opts.Kind}
	switch {
	case opts.Kind == "" || opts.Kind == ExportAll:
		kinds = []string{ExportReceipts, ExportToolCalls, ExportRejected, ExportCheckpoints}
	case opts.Kind == ExportReceipts:
		kinds = []string{ExportReceipts, ExportCheckpoints}
	case !slices.Contains(ExportKinds, opts.Kind):
		return fmt.Errorf("query: export: unknown kind %q (want one of %s)", opts.Kind, strings.Join(ExportKinds, ", "))
	}
	if !opts.From.IsZero() && !opts.To.IsZero() && opts.From.After(opts.To) {
		return fmt.Errorf("query: export: from %s is after to %s", opts.From.UTC().Format(time.RFC3339), opts.To.UTC().Format(time.RFC3339))
	}
	var conflicts []string
	for _, k := range kinds {
		c, err := exportKind(ctx, conn, database, exportSources[k], opts, fn)
		if err != nil {
			return err
		}
		conflicts = append(conflicts, c...)
	}
	if len(conflicts) > 0 {
		return &ConflictError{ReceiptIDs: conflicts}
	}
	return nil
}

func exportKind(ctx context.Context, conn driver.Conn, database string, src exportSource, opts ExportOptions, fn func(*ExportRecord) error) ([]string, error) {
	tbl, err := table(database, src.table)
	if err != nil {
		return nil, err
	}
	var conds []string
	var args []any
	if !opts.From.IsZero() {
		conds, args = append(conds, "time_ms >= ?"), append(args, cannedMS(opts.From))
	}
	if !opts.To.IsZero() {
		conds, args = append(conds, "time_ms < ?"), append(args, cannedMS(opts.To))
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	rows, err := conn.Query(streamContext(ctx), "SELECT "+src.columns+" FROM "+tbl+where+" ORDER BY "+src.order, args...)
	if err != nil {
		return nil, fmt.Errorf("query: export %s: %w", src.table, err)
	}
	defer rows.Close()
	var (
		conflicts []string
		lastID    string
		seen      []string // distinct signed JSON of lastID
	)
	for rows.Next() {
		r := ExportRecord{Record: src.record}
		var ms uint64
		if err := src.scan(rows, &r, &ms); err != nil {
			return nil, fmt.Errorf("query: export %s: %w", src.table, err)
		}
		r.Time = time.UnixMilli(int64(ms)).UTC()
		if r.ID != lastID {
			lastID, seen = r.ID, seen[:0]
		}
		if slices.Contains(seen, r.CloudEvent) {
			continue
		}
		seen = append(seen, r.CloudEvent)
		if len(seen) == 2 {
			conflicts = append(conflicts, r.ID)
		}
		if r.ReasonCodes == nil {
			r.ReasonCodes = []string{}
		}
		if err := fn(&r); err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: export %s: %w", src.table, err)
	}
	return conflicts, nil
}

// ExportWriter writes ExportRecords in one format. Flush MUST be called
// after the last Write.
type ExportWriter interface {
	Write(*ExportRecord) error
	Flush() error
}

// NewExportWriter returns a writer of format (ExportJSONL or ExportCSV) to
// w. A CSV export starts with the header ExportColumns.
func NewExportWriter(w io.Writer, format string) (ExportWriter, error) {
	switch format {
	case ExportJSONL:
		return &jsonlExport{w: w}, nil
	case ExportCSV:
		c := csv.NewWriter(w)
		if err := c.Write(ExportColumns); err != nil {
			return nil, err
		}
		return &csvExport{w: c}, nil
	}
	return nil, fmt.Errorf("query: export format %q (want %s or %s)", format, ExportJSONL, ExportCSV)
}

// jsonlExport writes each record's signed JSON on a line of its own.
type jsonlExport struct {
	w   io.Writer
	buf bytes.Buffer
}

// Write writes the stored bytes unchanged, unless they span lines (JSON
// lines cannot): then insignificant whitespace is removed, which keeps the
// JSON value, hence its canonical form and signature. Stored bytes that
// are not JSON and span lines get their line breaks replaced by spaces, so
// the record stays one (bad) line that a verifier names. A rejected
// ToolCallEvent is written as its ExportedRejection.
func (e *jsonlExport) Write(r *ExportRecord) error {
	e.buf.Reset()
	if r.Record == RecordToolCallRejected {
		b, err := json.Marshal(exportedRejection(r))
		if err != nil {
			return err
		}
		e.buf.Write(b)
	} else if strings.ContainsAny(r.CloudEvent, "\r\n") {
		if err := json.Compact(&e.buf, []byte(r.CloudEvent)); err != nil {
			e.buf.Reset()
			e.buf.WriteString(strings.NewReplacer("\r", " ", "\n", " ").Replace(r.CloudEvent))
		}
	} else {
		e.buf.WriteString(r.CloudEvent)
	}
	e.buf.WriteByte('\n')
	_, err := e.w.Write(e.buf.Bytes())
	return err
}

func (e *jsonlExport) Flush() error { return nil }

type csvExport struct{ w *csv.Writer }

func (e *csvExport) Write(r *ExportRecord) error { return e.w.Write(r.CSVValues()) }

func (e *csvExport) Flush() error {
	e.w.Flush()
	return e.w.Error()
}
