package query

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// SinkWriter projects TALOS_AUDIT records into ClickHouse. It implements
// the ingest sink's Writer: Write returns nil only when every record of
// the batch is stored. Receipts go to receipts (control receipts also to
// control_events); checkpoints to checkpoints; the transparency log's
// index records to log_entries; ToolCallEvents to tool_calls
// with their redacted payloads in artifacts, or, when the flight recorder
// refuses one (UTS FR-EVT-007), to tool_call_rejections. Records it cannot
// turn into rows at all are not dropped: they are stored as they are in
// dead_letters with the reason, so an auditor sees them and `talosctl
// rebuild` can retry them.
type SinkWriter struct {
	conn     driver.Conn
	database string
	rows     atomic.Uint64
}

// NewSinkWriter returns a writer into database.
func NewSinkWriter(conn driver.Conn, database string) *SinkWriter {
	return &SinkWriter{conn: conn, database: database}
}

// Rows is how many records this writer has stored.
func (w *SinkWriter) Rows() uint64 { return w.rows.Load() }

// Write stores one batch. Inserts are idempotent by id (ReplacingMergeTree),
// so a batch retried after a partial failure is safe.
//
// The rows of a batch are read from the records' Data in place (the
// driver copies what it sends), so the caller MUST NOT modify any
// record's Data until Write returns; Write keeps nothing of recs after it
// returns.
func (w *SinkWriter) Write(ctx context.Context, recs []schemas.AuditRecord) error {
	p := newProjection(recs)
	for _, rec := range recs {
		p.add(rec)
	}
	if err := insertReceiptRows(ctx, w.conn, w.database, p.receipts); err != nil {
		return err
	}
	// A control receipt is in both tables; both inserts are idempotent, so
	// a retry after the first succeeded is harmless.
	if err := InsertControlEvents(ctx, w.conn, w.database, p.control); err != nil {
		return err
	}
	// Artifacts before the rows that reference them, so that a reader
	// never sees an args_ref with nothing behind it.
	if err := InsertArtifacts(ctx, w.conn, w.database, p.artifacts); err != nil {
		return err
	}
	if err := InsertToolCalls(ctx, w.conn, w.database, p.calls); err != nil {
		return err
	}
	if err := InsertToolCallRejections(ctx, w.conn, w.database, p.rejected); err != nil {
		return err
	}
	if err := InsertCheckpoints(ctx, w.conn, w.database, p.cps); err != nil {
		return err
	}
	if err := InsertLogEntries(ctx, w.conn, w.database, p.logEntries); err != nil {
		return err
	}
	if len(p.dead) > 0 {
		if err := InsertDeadLetters(ctx, w.conn, w.database, p.dead); err != nil {
			return err
		}
	}
	w.rows.Add(uint64(len(recs)))
	return nil
}

// inPlace is b as a string, without a copy: valid while b is not modified.
// Write's rows use it for the records of the batch being written (see
// Write), and nothing derived from it outlives Write.
func inPlace(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// projection is the rows of one batch, table by table.
type projection struct {
	receipts  []ReceiptRow
	control   []ControlEventRow
	calls     []ToolCallRow
	artifacts []Artifact
	rejected  []ToolCallRejection
	cps       []CheckpointRow
	dead      []DeadLetter
	// logEntries: the transparency log's index records.
	logEntries []LogEntryRow
}

// newProjection sizes the hot path's tables for recs.
func newProjection(recs []schemas.AuditRecord) *projection {
	var nr, nt int
	for i := range recs {
		switch {
		case strings.HasPrefix(recs[i].Subject, schemas.SubjectReceipt):
			nr++
		case strings.HasPrefix(recs[i].Subject, schemas.SubjectToolCall):
			nt++
		}
	}
	return &projection{receipts: make([]ReceiptRow, 0, nr), calls: make([]ToolCallRow, 0, nt),
		artifacts: make([]Artifact, 0, 2*nt)}
}

// add turns one record into its rows: receipts (control receipts also into
// control_events), ToolCallEvents (refused ones into rejections),
// checkpoints; the log's index records; anything that cannot be projected
// into a dead letter.
func (p *projection) add(rec schemas.AuditRecord) {
	deadLetter := func(reason string) {
		p.dead = append(p.dead, DeadLetter{Subject: rec.Subject, StreamSeq: rec.StreamSeq, Reason: reason, Data: string(rec.Data)})
	}
	switch {
	case strings.HasPrefix(rec.Subject, schemas.SubjectReceipt):
		row, ctl, err := receiptRowOf(rec.Data, inPlace(rec.Data))
		if err == nil && row.Kind == schemas.KindControl {
			var c ControlEventRow
			if c, err = controlRowFromReceipt(&row, ctl); err == nil {
				p.control = append(p.control, c)
			}
		}
		if err != nil {
			deadLetter(err.Error())
			return
		}
		p.receipts = append(p.receipts, row)
	case strings.HasPrefix(rec.Subject, schemas.SubjectToolCall):
		row, arts, err := toolCallRowOf(rec.Data, inPlace(rec.Data), p.artifacts)
		var rej *RejectedToolCall
		switch {
		case err == nil:
			p.calls, p.artifacts = append(p.calls, row), arts
		case errors.As(err, &rej):
			p.rejected = append(p.rejected, RejectionOf(rec, rej))
		default:
			deadLetter(err.Error())
		}
	case strings.HasPrefix(rec.Subject, schemas.SubjectCheckpoint):
		row, err := CheckpointRowFromEvent(rec.Data)
		if err != nil {
			deadLetter(err.Error())
			return
		}
		p.cps = append(p.cps, row)
	case rec.Subject == schemas.SubjectLogIndex:
		rows, err := LogEntryRowsOf(p.logEntries, rec.Data)
		if err != nil {
			deadLetter(err.Error())
			return
		}
		p.logEntries = rows
	default:
		deadLetter("no projection for this subject in this version")
	}
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

// SessionCounter returns a counter of what of one session ClickHouse
// holds: its distinct receipts and, with events, its distinct
// ToolCallEvents (else 0), for loadgen.WaitEndToEnd.
func SessionCounter(conn driver.Conn, database, sessionID string, events bool) func(context.Context) (receipts, toolCalls uint64, err error) {
	return func(ctx context.Context) (n, m uint64, err error) {
		n, err = CountSessionReceipts(ctx, conn, database, sessionID)
		if err == nil && events {
			m, err = CountSessionToolCalls(ctx, conn, database, sessionID)
		}
		return n, m, err
	}
}

// jsonReader reads a published CloudEvent in one pass, for the row
// builders' fast paths. It accepts only what those fast paths are sure
// about: exactly one JSON value with no insignificant whitespace, object
// keys without escapes in strictly increasing byte order at every depth
// (so no key repeats), strings that are valid UTF-8 with no escaped
// surrogate, nesting at most jsonReaderMaxDepth. Published events are RFC
// 8785 output, which passes (its key order is byte order except between
// some keys with characters above U+FFFF); anything else sets bad, after
// which every read returns a zero value, and the caller falls back to its
// general decoder, which decides (and words) the outcome. A reader never
// accepts a document that is not valid JSON.
//
// Strings without escapes are substrings of the document, so a caller that
// reads from the string it stores as the row's cloudevent allocates
// nothing per field.
type jsonReader struct {
	s     string
	i     int
	depth int
	bad   bool
}

// jsonReaderMaxDepth bounds nesting (schemas validate ToolCallEvents with a
// limit of 128).
const jsonReaderMaxDepth = 64

// objectIter walks the members of one object; its zero value is ready.
type objectIter struct {
	n        int
	prev     string
	keyStart int // offset of the current member's key
}

func (r *jsonReader) fail() { r.bad = true }

func (r *jsonReader) peek() byte {
	if r.bad || r.i >= len(r.s) {
		return 0
	}
	return r.s[r.i]
}

// done reports whether the whole document was read without a problem.
func (r *jsonReader) done() bool { return !r.bad && r.i == len(r.s) && r.depth == 0 }

func (r *jsonReader) open(c byte) bool {
	if r.peek() != c || r.depth >= jsonReaderMaxDepth {
		r.fail()
		return false
	}
	r.i++
	r.depth++
	return true
}

// object consumes '{'; members follow with next.
func (r *jsonReader) object() bool { return r.open('{') }

// next moves to the next member of the object being read and returns its
// key, positioned at its value, which the caller MUST read or skip; false
// at the closing brace (consumed) or on a problem.
func (r *jsonReader) next(it *objectIter) (string, bool) {
	c := r.peek()
	if it.n > 0 && c == ',' {
		r.i++
		c = r.peek()
	} else if c == '}' {
		r.i++
		r.depth--
		return "", false
	} else if it.n > 0 {
		r.fail()
		return "", false
	}
	if c != '"' {
		r.fail()
		return "", false
	}
	start := r.i
	key, escaped := r.rawString()
	if r.bad || escaped || (it.n > 0 && key <= it.prev) || r.peek() != ':' {
		r.fail()
		return "", false
	}
	r.i++
	it.n, it.prev, it.keyStart = it.n+1, key, start
	return key, true
}

// array consumes '['; elements follow with elem.
func (r *jsonReader) array() bool { return r.open('[') }

// elem reports whether another element follows in the array being read
// (n counts the elements seen); false at the closing bracket (consumed) or
// on a problem.
func (r *jsonReader) elem(n *int) bool {
	c := r.peek()
	if c == ']' {
		r.i++
		r.depth--
		return false
	}
	if *n > 0 {
		if c != ',' {
			r.fail()
			return false
		}
		r.i++
	}
	*n++
	return !r.bad
}

// rawString reads a string token and returns its content as it is in the
// document, and whether it holds escapes (which it checks: no escaped
// UTF-16 surrogate, paired or not, is taken).
func (r *jsonReader) rawString() (string, bool) {
	if r.peek() != '"' {
		r.fail()
		return "", false
	}
	end, escaped, ok := jsonkit.ScanString(r.s, r.i)
	if !ok || escaped && escapesSurrogate(r.s[r.i:end]) {
		r.fail()
		return "", false
	}
	start := r.i + 1
	r.i = end
	return r.s[start : end-1], escaped
}

// escapesSurrogate reports whether the JSON string tok (checked by
// jsonkit.ScanString) holds an escape that decodes to a character
// beyond U+FFFF (written as a surrogate pair).
func escapesSurrogate(tok string) bool {
	for i := 0; i < len(tok); i++ {
		if tok[i] == '\\' {
			_, n := jsonkit.DecodeEscape(tok, i)
			if n == 12 {
				return true
			}
			i += n - 1
		}
	}
	return false
}

// str reads a string value, unescaped.
func (r *jsonReader) str() string {
	s, escaped := r.rawString()
	if !escaped || r.bad {
		return s
	}
	return jsonkit.Unescape(s)
}

// null consumes a null literal if one is next.
func (r *jsonReader) null() bool {
	if r.peek() == 'n' {
		r.literal("null")
		return !r.bad
	}
	return false
}

func (r *jsonReader) literal(lit string) {
	if !strings.HasPrefix(r.s[r.i:], lit) {
		r.fail()
		return
	}
	r.i += len(lit)
}

// boolean reads true or false.
func (r *jsonReader) boolean() bool {
	switch r.peek() {
	case 't':
		r.literal("true")
		return !r.bad
	case 'f':
		r.literal("false")
	default:
		r.fail()
	}
	return false
}

// number reads a JSON number token and returns it as written.
func (r *jsonReader) number() string {
	start := r.i
	end := jsonkit.NumberEnd(r.s, start)
	if end < 0 {
		r.fail()
		return ""
	}
	r.i = end
	return r.s[start:end]
}

// readUint reads a number that is a plain non-negative integer within
// uint64 (what encoding/json decodes into a uint64 without error).
func (r *jsonReader) readUint() uint64 {
	if r.peek() == '-' {
		r.fail()
		return 0
	}
	v, err := strconv.ParseUint(r.number(), 10, 64)
	if err != nil {
		r.fail()
	}
	return v
}

// readInt reads a number that is a plain integer within int64.
func (r *jsonReader) readInt() int64 {
	v, err := strconv.ParseInt(r.number(), 10, 64)
	if err != nil {
		r.fail()
	}
	return v
}

// skip reads past one value of any kind, checking it.
func (r *jsonReader) skip() {
	switch r.peek() {
	case '"':
		r.rawString()
	case '{':
		r.object()
		var it objectIter
		for _, ok := r.next(&it); ok; _, ok = r.next(&it) {
			r.skip()
		}
	case '[':
		r.array()
		for n := 0; r.elem(&n); {
			r.skip()
		}
	case 't':
		r.literal("true")
	case 'f':
		r.literal("false")
	case 'n':
		r.literal("null")
	default:
		r.number()
	}
}

// readStrings reads an array of strings (null elements are not taken) onto
// buf, and returns the new buf and the array's bounds in it.
func (r *jsonReader) readStrings(buf []string) ([]string, [2]int) {
	if buf == nil {
		buf = make([]string, 0, 8) // a row's arrays are short
	}
	from := len(buf)
	if !r.array() {
		return buf, [2]int{from, from}
	}
	for n := 0; r.elem(&n); {
		buf = append(buf, r.str())
	}
	return buf, [2]int{from, len(buf)}
}

// part is buf[b[0]:b[1]], never nil (the rows store [] for an empty array).
func part(buf []string, b [2]int) []string {
	if b[0] == b[1] {
		return []string{}
	}
	return buf[b[0]:b[1]:b[1]]
}

// foldsToAny reports whether key matches one of names case-insensitively
// (as encoding/json matches a key to a field when no name is equal).
func foldsToAny(key string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(key, n) {
			return true
		}
	}
	return false
}

// insertBlockRows is how many rows an INSERT from the sink sends per data
// block. The server squashes the blocks of one INSERT into one part
// (min_insert_block_size_rows), so blocks add no parts; they bound the
// client's column buffers, which otherwise grow by copying until they hold
// the whole INSERT. Column by column in blocks of this size an INSERT takes
// about a third of the client CPU of row by row in one block, with no
// measurable change on the server (BenchmarkInsertReceiptRows10k); blocks
// of 256 rows or fewer cost the server more per row.
const insertBlockRows = 1024

// insertColumn is one column of a table the sink inserts into: its name
// and how to read it from a row of type R. Exactly one accessor is set.
// A row type's column list is its insert list, the values its diff
// compares (diffColumns), and the order of its INSERT.
type insertColumn[R any] struct {
	name string
	str  func(*R) string
	u64  func(*R) uint64
	u8   func(*R) uint8
	at   func(*R) time.Time
	strs func(*R) []string
	raw  func(*R) []byte // a String column given as bytes
}

// value is the column's value in r as the INSERT sends it.
func (c *insertColumn[R]) value(r *R) any {
	switch {
	case c.str != nil:
		return c.str(r)
	case c.u64 != nil:
		return c.u64(r)
	case c.u8 != nil:
		return c.u8(r)
	case c.at != nil:
		return c.at(r).UTC()
	case c.raw != nil:
		return string(c.raw(r))
	default:
		return nonNil(c.strs(r))
	}
}

func columnNames[R any](cols []insertColumn[R]) []string {
	names := make([]string, len(cols))
	for i := range cols {
		names[i] = cols[i].name
	}
	return names
}

func rowValues[R any](cols []insertColumn[R], r *R) []any {
	vals := make([]any, len(cols))
	for i := range cols {
		vals[i] = cols[i].value(r)
	}
	return vals
}

// insertRows writes rows to tbl in one INSERT, column by column, in blocks
// of insertBlockRows rows. Like a single-block INSERT it stores every row
// or none: the server writes the part when the INSERT ends.
func insertRows[R any](ctx context.Context, conn driver.Conn, tbl string, cols []insertColumn[R], rows []R) error {
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" ("+strings.Join(columnNames(cols), ", ")+")")
	if err != nil {
		return err
	}
	var sc blockScratch
	for from := 0; from < len(rows); from += insertBlockRows {
		to := min(from+insertBlockRows, len(rows))
		if err := appendBlock(b, cols, rows[from:to], &sc); err != nil {
			b.Abort()
			return err
		}
		if to < len(rows) {
			if err := b.Flush(); err != nil {
				b.Abort()
				return err
			}
		}
	}
	return b.Send()
}

// insertTable writes rows to database.name by insertRows, and nothing when
// there are none. An error of the INSERT is returned wrapped by wrap; one
// naming the table is returned as it is.
func insertTable[R any](ctx context.Context, conn driver.Conn, database, name string, cols []insertColumn[R], rows []R, wrap func(error) error) error {
	if len(rows) == 0 {
		return nil
	}
	tbl, err := table(database, name)
	if err != nil {
		return err
	}
	if err := insertRows(ctx, conn, tbl, cols, rows); err != nil {
		return wrap(err)
	}
	return nil
}

// insertEach writes rows to database.name in one INSERT of columnsSQL, row
// by row (values gives a row's), and nothing when there are none. Its
// errors say "query: insert" and what: the rows ("<noun>s", with their
// number when the INSERT fails at the end), or the row the driver refused
// ("<noun> <id>").
func insertEach[R any](ctx context.Context, conn driver.Conn, database, name, columnsSQL string, rows []R, noun string,
	id func(*R) string, values func(*R) []any) error {
	if len(rows) == 0 {
		return nil
	}
	tbl, err := table(database, name)
	if err != nil {
		return err
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" ("+columnsSQL+")")
	if err != nil {
		return fmt.Errorf("query: insert %ss: %w", noun, err)
	}
	for i := range rows {
		if err := b.Append(values(&rows[i])...); err != nil {
			b.Abort()
			return fmt.Errorf("query: insert %s %s: %w", noun, id(&rows[i]), err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("query: insert %d %ss: %w", len(rows), noun, err)
	}
	return nil
}

// blockScratch holds one column's values while they are appended; the
// driver copies them, so one scratch serves every column of an INSERT.
type blockScratch struct {
	strs  []string
	u64s  []uint64
	u8s   []uint8
	times []time.Time
	raws  [][]byte
}

// appendBlock appends rows to b column by column.
func appendBlock[R any](b driver.Batch, cols []insertColumn[R], rows []R, sc *blockScratch) error {
	for i := range cols {
		c, col := &cols[i], b.Column(i)
		var err error
		switch {
		case c.str != nil:
			sc.strs = sc.strs[:0]
			for j := range rows {
				sc.strs = append(sc.strs, c.str(&rows[j]))
			}
			err = col.Append(sc.strs)
		case c.u64 != nil:
			sc.u64s = sc.u64s[:0]
			for j := range rows {
				sc.u64s = append(sc.u64s, c.u64(&rows[j]))
			}
			err = col.Append(sc.u64s)
		case c.u8 != nil:
			sc.u8s = sc.u8s[:0]
			for j := range rows {
				sc.u8s = append(sc.u8s, c.u8(&rows[j]))
			}
			err = col.Append(sc.u8s)
		case c.at != nil:
			sc.times = sc.times[:0]
			for j := range rows {
				sc.times = append(sc.times, c.at(&rows[j]).UTC())
			}
			err = col.Append(sc.times)
		case c.raw != nil:
			sc.raws = sc.raws[:0]
			for j := range rows {
				sc.raws = append(sc.raws, c.raw(&rows[j]))
			}
			err = col.Append(sc.raws)
		default:
			for j := range rows {
				if err = col.AppendRow(nonNil(c.strs(&rows[j]))); err != nil {
					break
				}
			}
		}
		if err != nil {
			return fmt.Errorf("column %s: %w", c.name, err)
		}
	}
	return nil
}
