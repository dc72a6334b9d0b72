package query

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/rfc6962"
	"github.com/transparency-dev/tessera/api"
	"github.com/transparency-dev/tessera/client"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts/logproof"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Problem kinds of the transparency-log check (VerifyLog).
const (
	// ProblemLogCheckpoint: the served checkpoint is not a tlog-checkpoint
	// signed by the log's key for its origin.
	ProblemLogCheckpoint = "log_checkpoint"
	// ProblemWitnessQuorum: the checkpoint lacks the cosignatures of the
	// witness policy's quorum.
	ProblemWitnessQuorum = "witness_quorum"
	// ProblemLogRewritten: the log served now does not extend the
	// checkpoint the auditor kept (no consistency proof, or it is smaller).
	ProblemLogRewritten = "log_rewritten"
	// ProblemLogEntries: the served entries do not hash to the
	// checkpoint's root.
	ProblemLogEntries = "log_entries_mismatch"
	// ProblemNotInLog: a stored record the log does not hold at its index
	// (another record is there) nor anywhere under the checkpoint.
	ProblemNotInLog = "not_in_log"
	// ProblemMissingRow: a log entry whose record no stored row holds.
	ProblemMissingRow = "missing_row"
)

// Categories of the transparency-log check beside Categories' first six.
const (
	// CategoryUnwitnessed: the log's checkpoint lacks its witnesses.
	CategoryUnwitnessed = "unwitnessed"
	// CategoryUnlogged: a stored record the log lacks.
	CategoryUnlogged = "unlogged"
)

// RecordLogCheckpoint is verify.Problem.Record for the log's checkpoint.
const RecordLogCheckpoint = "log checkpoint"

// LogOptions is what VerifyLog checks the database against.
type LogOptions struct {
	// URL serves the log as C2SP tlog-tiles (talosd's --http-addr with the
	// log role, or any static copy).
	URL string
	// Key is the log's verifier key; its name is the log's origin.
	Key note.Verifier
	// Policy, if set, is the witness quorum the checkpoint must carry.
	Policy *logproof.Policy
	// Since, if set, is a checkpoint of this log the auditor kept (a
	// signed note): the log served now must extend it.
	Since []byte
	// Grace: a stored record the log lacks is pending, not a problem,
	// while it was signed no earlier than Grace before the newest record
	// the checkpoint covers; a log entry whose row is missing, while it
	// was signed within Grace of Now.
	Grace time.Duration
	// Now is the clock (default time.Now); Client the HTTP client
	// (default http.DefaultClient).
	Now    func() time.Time
	Client *http.Client

	partial bool // VerifyLogFile: the records are a range of the log's
}

// LogReport is the outcome of VerifyLog.
type LogReport struct {
	URL    string `json:"url"`
	Origin string `json:"origin"`
	Size   int64  `json:"size"`
	Root   string `json:"root"` // base64, as in the checkpoint
	// Quorum and Cosigned: the policy's quorum, and which of its Witnesses
	// cosigned the checkpoint (empty without a policy).
	Quorum    string   `json:"quorum,omitempty"`
	Witnesses int      `json:"witnesses,omitempty"`
	Cosigned  []string `json:"cosigned,omitempty"`
	// SinceSize is the size of the checkpoint the log was proved to extend
	// (-1 without LogOptions.Since).
	SinceSize int64 `json:"since_size"`
	// Entries were read and hashed to the checkpoint's root; Logged stored
	// records were found among them; Pending records are newer than the
	// checkpoint; UnstoredPending entries are newer than the sink.
	Entries         int64 `json:"entries"`
	Logged          int64 `json:"logged"`
	Pending         int64 `json:"pending"`
	UnstoredPending int64 `json:"unstored_pending"`
	// Withheld of the Logged records are rejected ToolCallEvents found as
	// the sink stores them: their entries less the payloads it withheld.
	Withheld int64 `json:"withheld"`
	// Checkpoint is the signed note checked (nil if it did not verify).
	Checkpoint []byte           `json:"-"`
	Problems   []verify.Problem `json:"-"`
}

// Trusted reports whether the checkpoint itself passed: signed by the
// log's key, cosigned by the quorum, extending the one kept, and the
// served entries are its tree. Only such a checkpoint is worth keeping for
// the next LogOptions.Since.
func (r *LogReport) Trusted() bool {
	for _, p := range r.Problems {
		switch p.Kind {
		case ProblemLogCheckpoint, ProblemWitnessQuorum, ProblemLogRewritten, ProblemLogEntries:
			return false
		}
	}
	return r.Checkpoint != nil
}

// Summary is the report in one phrase, for the "OK: ..." line.
func (r *LogReport) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "log %s at size %d", r.Origin, r.Size)
	if r.Quorum != "" {
		fmt.Fprintf(&b, " cosigned by %d of %d witnesses (quorum %s)", len(r.Cosigned), r.Witnesses, r.Quorum)
	}
	if r.SinceSize >= 0 {
		fmt.Fprintf(&b, ", consistent with its checkpoint at size %d", r.SinceSize)
	}
	fmt.Fprintf(&b, ": %d entries match its root, %d stored records found in it", r.Entries, r.Logged)
	if r.Withheld > 0 {
		fmt.Fprintf(&b, " (%d of them rejected ToolCallEvents, stored without the payloads the sink withheld)", r.Withheld)
	}
	if r.Pending > 0 {
		fmt.Fprintf(&b, ", %d newer than the checkpoint", r.Pending)
	}
	if r.UnstoredPending > 0 {
		fmt.Fprintf(&b, ", %d entries not yet stored", r.UnstoredPending)
	}
	return b.String()
}

func (r *LogReport) problem(kind, record, id, format string, a ...any) {
	r.Problems = append(r.Problems, verify.Problem{Kind: kind, Record: record, ReceiptID: id, Detail: fmt.Sprintf(format, a...)})
}

// VerifyLog holds database to the transparency log served at o.URL: the
// checkpoint's note verifies with the log's key and, with a policy,
// carries its quorum's cosignatures; with o.Since, a consistency proof
// from that checkpoint to this one verifies (golang.org/x/mod's tlog over
// the served hash tiles); the entries up to the checkpoint's size hash to
// its root; every stored receipt and ToolCallEvent (receipts, tool_calls,
// tool_call_rejections) at a log index under the checkpoint is that entry,
// byte for byte (an oversize record: its stand-in's SHA-256 and size; a
// rejected ToolCallEvent stored without its payloads: an entry the
// recorder refuses, which RejectionOf stores as that row);
// every such entry has its stored row. Each failure is a problem of the
// report; the error is for what could not be read.
//
// It holds the log's leaf hashes and record ids in memory (about 100 bytes
// an entry).
func VerifyLog(ctx context.Context, conn driver.Conn, database string, o LogOptions) (*LogReport, error) {
	return verifyLog(ctx, o, func(fn func(*storedRecord)) error { return streamStoredRecords(ctx, conn, database, fn) })
}

// VerifyLogFile is VerifyLog over the records of the file at path (an
// export, as talosctl export wrote it: each record's exact bytes) instead
// of the database, read as they come instead of held in memory: what it
// keeps of each is its id and hashes. Records carry no log index there:
// each is found in the log by its id. With partial (the file holds a range
// of the records, e.g. one export of a time window), log entries without a
// record in the file are not reported.
func VerifyLogFile(ctx context.Context, path string, partial bool, o LogOptions) (*LogReport, error) {
	o.partial = partial
	return verifyLog(ctx, o, func(fn func(*storedRecord)) error {
		return verify.ScanEventsFile(path, func(raw []byte) error {
			if r, ok := eventRecord(raw); ok {
				fn(r)
			}
			return nil
		})
	})
}

// verifyLog is VerifyLog with the stored records read by records.
func verifyLog(ctx context.Context, o LogOptions, records func(func(*storedRecord)) error) (*LogReport, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	f, raw, err := readCheckpoint(ctx, o)
	if err != nil {
		return nil, err
	}
	rep := &LogReport{URL: o.URL, Origin: o.Key.Name(), SinceSize: -1}
	cp, err := logproof.OpenCheckpoint(raw, o.Key)
	if err != nil {
		rep.problem(ProblemLogCheckpoint, RecordLogCheckpoint, o.URL+"/checkpoint", "%v", err)
		return rep, nil
	}
	rep.Size, rep.Root, rep.Checkpoint = cp.Size, cp.Root.String(), raw
	if o.Policy != nil {
		rep.Quorum, rep.Witnesses = o.Policy.Quorum, len(o.Policy.Witnesses)
		if rep.Cosigned, err = o.Policy.Check(raw); err != nil {
			rep.problem(ProblemWitnessQuorum, RecordLogCheckpoint, cp.String(), "%v", err)
		}
	}
	tiles := &tileReader{ctx: ctx, f: f}
	if o.Since != nil {
		if err := checkSince(rep, cp, o.Since, o.Key, tiles); err != nil {
			return nil, err
		}
	}
	entries, err := readLogEntries(ctx, f, cp)
	if err != nil {
		return nil, err
	}
	if got := entries.root; got != cp.Root {
		rep.problem(ProblemLogEntries, RecordLogCheckpoint, cp.String(),
			"the entries served up to size %d hash to %s, not to the checkpoint's root %s: they are not the log's", cp.Size, got, cp.Root)
		return rep, nil
	}
	rep.Entries = cp.Size
	if err := matchRows(entries, rep, o, records); err != nil {
		return nil, err
	}
	return rep, nil
}

// readCheckpoint fetches the checkpoint the log at o.URL serves now, as
// read (not yet opened with o.Key), and the fetcher its tiles come from.
func readCheckpoint(ctx context.Context, o LogOptions) (*client.HTTPFetcher, []byte, error) {
	f, err := logFetcher(o.URL, o.Client)
	if err != nil {
		return nil, nil, err
	}
	raw, err := f.ReadCheckpoint(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("log checkpoint: %w", err)
	}
	return f, raw, nil
}

func logFetcher(rawURL string, c *http.Client) (*client.HTTPFetcher, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("log URL %q: not an http(s) URL", rawURL)
	}
	return client.NewHTTPFetcher(u, c)
}

// checkSince proves that the log at cp extends the kept checkpoint
// since: x/mod's tlog.ProveTree over the served hash tiles (authenticated
// against cp's root), checked by tlog.CheckTree against since's root.
func checkSince(rep *LogReport, cp *logproof.Checkpoint, since []byte, key note.Verifier, tiles tlog.TileReader) error {
	old, err := logproof.OpenCheckpoint(since, key)
	if err != nil {
		return fmt.Errorf("the kept checkpoint: %w", err)
	}
	rep.SinceSize = old.Size
	if old.Size > cp.Size {
		rep.problem(ProblemLogRewritten, RecordLogCheckpoint, cp.String(),
			"the log is smaller than the checkpoint kept at size %d: rolled back", old.Size)
		return nil
	}
	proof, err := tlog.ProveTree(cp.Size, old.Size, tlog.TileHashReader(cp.Tree(), tiles))
	if err == nil {
		err = tlog.CheckTree(proof, cp.Size, cp.Root, old.Size, old.Root)
	}
	if err != nil {
		rep.problem(ProblemLogRewritten, RecordLogCheckpoint, cp.String(),
			"does not extend the checkpoint kept at size %d (root %s): the log's history was rewritten (%v)", old.Size, old.Root, err)
	}
	return nil
}

// tileReader is x/mod's tlog.TileReader over tessera's fetcher: C2SP
// tlog-tiles are x/mod's tiles of height 8.
type tileReader struct {
	ctx context.Context
	f   *client.HTTPFetcher
}

func (r *tileReader) Height() int { return 8 }

func (r *tileReader) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, t := range tiles {
		var partial uint8
		if t.W < 1<<8 {
			partial = uint8(t.W)
		}
		b, err := r.f.ReadTile(r.ctx, uint64(t.L), uint64(t.N), partial)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func (r *tileReader) SaveTiles([]tlog.Tile, [][]byte) {}

// logEntries is what VerifyLog keeps of each entry under the checkpoint.
type logEntries struct {
	leaves  []tlog.Hash
	ids     []string
	types   []string
	standIn map[int64]logproof.Entry // the oversize records' stand-ins
	newest  int64                    // the newest record's signed time, Unix ms
	times   []int64                  // each record's signed time (0: unknown)
	root    tlog.Hash                // the root the entries hash to
	// entry reads entry i again (its bundle fetched anew, the last one
	// kept): only rejected ToolCallEvents need an entry's bytes.
	entry func(i int64) ([]byte, error)
}

// readLogEntries reads the entry bundles up to cp's size (tessera's
// client) and hashes them into a tree (transparency-dev/merkle's compact
// range, RFC 6962).
func readLogEntries(ctx context.Context, f *client.HTTPFetcher, cp *logproof.Checkpoint) (*logEntries, error) {
	n := cp.Size
	l := &logEntries{leaves: make([]tlog.Hash, 0, n), ids: make([]string, 0, n), types: make([]string, 0, n),
		times: make([]int64, 0, n), standIn: map[int64]logproof.Entry{}}
	rng := (&compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}).NewEmptyRange(0)
	for b := uint64(0); int64(b)*256 < n; b++ {
		bundle, err := client.GetEntryBundle(ctx, f.ReadEntryBundle, b, uint64(n))
		if err != nil {
			return nil, fmt.Errorf("log entries: %w", err)
		}
		want := min(256, n-int64(b)*256)
		if int64(len(bundle.Entries)) < want {
			return nil, fmt.Errorf("log entries: bundle %d holds %d entries, the checkpoint needs %d", b, len(bundle.Entries), want)
		}
		for _, e := range bundle.Entries[:want] {
			leaf := tlog.RecordHash(e)
			if err := rng.Append(leaf[:], nil); err != nil {
				return nil, err
			}
			l.add(int64(len(l.leaves)), leaf, logproof.ReadEntry(e))
		}
	}
	l.entry = entryReader(ctx, f, n)
	l.root = tlog.Hash(rfc6962.DefaultHasher.EmptyRoot())
	if n > 0 {
		root, err := rng.GetRootHash(nil)
		if err != nil {
			return nil, err
		}
		l.root = tlog.Hash(root)
	}
	return l, nil
}

// entryReader reads single entries of a log of size n, one bundle at a
// time (the last one kept).
func entryReader(ctx context.Context, f *client.HTTPFetcher, n int64) func(int64) ([]byte, error) {
	var (
		at     = int64(-1)
		bundle *api.EntryBundle
	)
	return func(i int64) ([]byte, error) {
		if b := i / 256; b != at {
			got, err := client.GetEntryBundle(ctx, f.ReadEntryBundle, uint64(b), uint64(n))
			if err != nil {
				return nil, fmt.Errorf("log entry %d: %w", i, err)
			}
			at, bundle = b, &got
		}
		if int(i%256) >= len(bundle.Entries) {
			return nil, fmt.Errorf("log entry %d: not in its bundle", i)
		}
		return bundle.Entries[i%256], nil
	}
}

func (l *logEntries) add(i int64, leaf tlog.Hash, e logproof.Entry) {
	l.leaves = append(l.leaves, leaf)
	l.ids = append(l.ids, e.EventID)
	l.types = append(l.types, recordName(e))
	l.times = append(l.times, e.TimeMS)
	l.newest = max(l.newest, e.TimeMS)
	if e.Type == logproof.StandInType {
		l.standIn[i] = e
	}
}

// recordName is how a problem names the record of an entry.
func recordName(e logproof.Entry) string {
	switch {
	case strings.HasPrefix(e.Type, "dev.talos.receipt."), strings.HasPrefix(e.Subject, schemas.SubjectReceipt):
		return "receipt"
	case strings.HasPrefix(e.Type, "dev.talos.toolcall."), strings.HasPrefix(e.Subject, schemas.SubjectToolCall):
		return RecordToolCall
	}
	return "log entry"
}

// storedRecord is one stored row as the log check reads it: its id, and
// hashes of its exact cloudevent.
type storedRecord struct {
	id      string
	record  string // "receipt", RecordToolCall
	timeMS  int64
	leaf    tlog.Hash // RFC 6962 leaf hash of the cloudevent
	sha256  string    // lowercase hex SHA-256 of the cloudevent
	size    int64
	indexes []uint64 // its log indexes in v_log_entries
	found   bool     // found in the log by its id, not at an index announced
	// rejected: a ToolCallEvent the recorder refused, maybe stored
	// without its payloads (RejectionOf); withheld: found so.
	rejected, withheld bool
}

// holds reports whether entry i is r's: its bytes, or its stand-in.
func (l *logEntries) holds(i int64, r *storedRecord) bool {
	if s, ok := l.standIn[i]; ok {
		return s.EventID == r.id && s.SHA256 == r.sha256 && s.Size == r.size
	}
	return l.leaves[i] == r.leaf
}

// holdsRejected reports whether entry i is the event the rejected record
// r was stored from although their bytes differ: the flight recorder
// refuses the entry, and RejectionOf stores it as r's bytes. An oversize
// record's entry is its stand-in: its bytes are not in the log.
func (l *logEntries) holdsRejected(i int64, r *storedRecord) (bool, error) {
	if _, ok := l.standIn[i]; ok || !r.rejected {
		return false, nil
	}
	raw, err := l.entry(i)
	if err != nil {
		return false, err
	}
	var rej *RejectedToolCall
	if _, _, err := ToolCallRowFromEvent(raw); !errors.As(err, &rej) {
		return false, nil
	}
	stored := RejectionOf(schemas.AuditRecord{Data: raw}, rej).CloudEvent
	return tlog.RecordHash([]byte(stored)) == r.leaf, nil
}

func hexHash(s string) (tlog.Hash, error) {
	var h tlog.Hash
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("not a hex SHA-256: %q", s)
	}
	return tlog.Hash(b), nil
}
