package query

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/receipts/verify"
)

// errOutOfChainOrder stops VerifyExportFile's first read: the file must
// be verified through an index instead.
var errOutOfChainOrder = errors.New("the file's receipts are not in chain order")

// errFileChanged: a file read more than once (VerifyExportFile,
// ProveFromEventsFile) changed between the reads.
var errFileChanged = errors.New("the file changed while it was verified")

// ErrEmptyExport: the file VerifyExportFile was given holds no record.
var ErrEmptyExport = errors.New("nothing to verify: the file holds no record")

// ErrNotExport: no record of the file VerifyExportFile was given reads
// as JSON: it is not an export of signed records (a CSV export, or any
// other file).
var ErrNotExport = errors.New("not a JSON-lines (or JSON array) export of signed records")

// errHasRecord stops checkContent's read at the file's first record that
// reads as JSON.
var errHasRecord = errors.New("the file holds a record")

// checkContent fails with ErrEmptyExport when the file holds no record
// (it is empty, or white space): verifying it would find nothing wrong
// with nothing; and with ErrNotExport when none of its records reads as
// JSON, rather than naming every line of it malformed. A file with at
// least one record that reads is verified, its other lines named
// malformed. It reads up to that record, an export's first.
func (f *exportFile) checkContent() error {
	var (
		n     int
		first []byte
	)
	err := f.scan(func(raw []byte, _ int64) error {
		if n++; n == 1 {
			first = raw
		}
		if _, ok := ReadExportedRejection(raw); ok || verify.PlaceOf(raw).Read {
			return errHasRecord
		}
		return nil
	})
	switch {
	case errors.Is(err, errHasRecord):
		return nil
	case err != nil:
		return err
	case n == 0:
		return fmt.Errorf("%s: %w", f.path, ErrEmptyExport)
	case bytes.HasPrefix(first, []byte(strings.Join(ExportColumns[:3], ",")+",")):
		return fmt.Errorf("%s: %w: it is a CSV export (talosctl export --format csv); verify reads the JSON lines of "+
			"talosctl export --format jsonl (the default)", f.path, ErrNotExport)
	}
	return fmt.Errorf("%s: %w: none of its %d lines is a JSON event; talosctl export writes one (--format jsonl, the default)",
		f.path, ErrNotExport, n)
}

// VerifyExportFile is VerifyExport over the file at path, without holding
// the file in memory. A file whose receipts come in chain order (each
// chain's by seq, then id; chains may interleave), as talosctl export
// writes them, is read twice: first for the order, the rejected
// ToolCallEvents and the checkpoints (a Verifier takes the checkpoints
// before the receipts they cover, and events it cannot read first, as
// SortForVerify places them), then for everything else, a window at a
// time. Memory then holds the chains' last links, the checkpoints, the
// lines it cannot read, the rejections' positions and the problems. A
// file in any other order is read once for where each event is, then
// each event where it is, in chain order (memory holds that index too,
// 48 bytes a receipt). The report is the same either way,
// problems in the same order.
//
// A file that holds no record fails with ErrEmptyExport, one none of
// whose records reads as JSON with ErrNotExport.
//
// Of o it takes Partial, BatchSignatures, Reading, which the reads
// before the last follow, and Progress, which the last read calls as the
// database's passes do (progressCounter), against the number of records
// the reads before it found to verify.
func VerifyExportFile(path string, keys verify.KeySet, o VerifyOptions) (*VerifyOutcome, error) {
	out, _, err := verifyExportFile(path, keys, o)
	return out, err
}

// fileRead is how VerifyExportFile read a file.
type fileRead int

const (
	readInOrder fileRead = iota // twice, in the file's order
	readIndexed                 // once for an index, then event by event in chain order
)

// verifyExportFile is VerifyExportFile, and how it read the file.
func verifyExportFile(path string, keys verify.KeySet, o VerifyOptions) (*VerifyOutcome, fileRead, error) {
	f := &exportFile{path: path}
	if err := f.checkContent(); err != nil {
		return nil, readInOrder, err
	}
	out, err := verifyInOrder(f, keys, o)
	if errors.Is(err, errOutOfChainOrder) {
		out, err = verifyIndexed(f, keys, o)
		return out, readIndexed, err
	}
	return out, readInOrder, err
}

// verifyInOrder reads f twice (VerifyExportFile); it fails with
// errOutOfChainOrder as soon as a receipt comes before one of its chain
// that it follows.
func verifyInOrder(f *exportFile, keys verify.KeySet, o VerifyOptions) (*VerifyOutcome, error) {
	rej := rejections{keys: keys}
	var (
		first [][]byte
		skip  []int // positions the second read leaves out: first's and the rejections'
		last  = map[string]verify.Place{}
		n     int // events read
	)
	err := f.scanReporting(o.reading(false), func(raw []byte, _ int64) error {
		n++
		if rej.take(raw) {
			skip = append(skip, n-1)
			return nil
		}
		p := verify.PlaceOf(raw)
		if !p.Read || p.Checkpoint {
			skip = append(skip, n-1)
			first = append(first, raw)
			return nil
		}
		if p.ChainID != "" {
			if prev, ok := last[p.ChainID]; ok && !p.Follows(prev) {
				return errOutOfChainOrder
			}
			last[p.ChainID] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	feed := newWindowFeed(keys, o, n-len(skip))
	feed.v.AddAll(first, o.BatchSignatures)
	i := 0 // the event's position
	err = f.scan(func(raw []byte, _ int64) error {
		if i++; len(skip) > 0 && skip[0] == i-1 {
			skip = skip[1:]
			return nil
		}
		feed.add(raw)
		return nil
	})
	if err == nil && i != n {
		err = fmt.Errorf("%s: %w", f.path, errFileChanged)
	}
	if err != nil {
		return nil, err
	}
	return exportOutcome(f.path, feed.finish(), rej.probs, rej.sum), nil
}

// verifyIndexed verifies f, whose receipts are not in chain order,
// without holding it in memory either: one read notes where each event
// is and, of each receipt, its chain, seq and id; then every event is read
// again where it is, in the order SortForVerify gives them (the events of
// no chain in the file's order, then the receipts by chain, seq and id),
// and verified as VerifyExport would.
func verifyIndexed(f *exportFile, keys verify.KeySet, o VerifyOptions) (*VerifyOutcome, error) {
	rej := rejections{keys: keys}
	var (
		loose   []span // the events of no chain
		chained []indexed
		ix      = newReceiptIndex()
	)
	err := f.scanReporting(o.reading(true), func(raw []byte, off int64) error {
		if rej.take(raw) {
			return nil
		}
		at := span{off: off, n: int32(len(raw))}
		if p := verify.PlaceOf(raw); p.ChainID != "" {
			chained = append(chained, ix.entry(p, at))
		} else {
			loose = append(loose, at)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ix.sort(chained)
	feed := newWindowFeed(keys, o, len(loose)+len(chained))
	inOrder := func(yield func(span) bool) {
		for _, s := range loose {
			if !yield(s) {
				return
			}
		}
		for _, e := range chained {
			if !yield(e.at) {
				return
			}
		}
	}
	if err := f.readAt(inOrder, feed.add); err != nil {
		return nil, err
	}
	return exportOutcome(f.path, feed.finish(), rej.probs, rej.sum), nil
}

// indexed is one receipt of a file verifyIndexed reads: where it is, its
// seq, its chain (an index into receiptIndex.chains) and its id, held as
// 16 bytes when it is a UUID as uuid.UUID.String writes it (a Talos
// receipt's always is), which order as the text does. 48 bytes.
type indexed struct {
	at    span
	seq   uint64
	id    uuid.UUID
	chain uint32
	text  bool // the id is not such a UUID: receiptIndex.ids has it
}

// receiptIndex holds what indexed entries share: the chain ids, and the
// ids that are not UUIDs, by where their receipt is.
type receiptIndex struct {
	chains  []string
	chainOf map[string]uint32
	ids     map[int64]string
}

func newReceiptIndex() *receiptIndex {
	return &receiptIndex{chainOf: map[string]uint32{}, ids: map[int64]string{}}
}

// entry is the indexed entry of the receipt p at at.
func (x *receiptIndex) entry(p verify.Place, at span) indexed {
	c, ok := x.chainOf[p.ChainID]
	if !ok {
		c = uint32(len(x.chains))
		x.chains = append(x.chains, p.ChainID)
		x.chainOf[p.ChainID] = c
	}
	e := indexed{at: at, seq: p.Seq, chain: c}
	// Of 36 characters, Parse takes only the hyphenated form, in either
	// case: lower case is how String writes it.
	if u, err := uuid.Parse(p.ID); err == nil && len(p.ID) == 36 && !strings.ContainsAny(p.ID, "ABCDEF") {
		e.id = u
	} else {
		e.text = true
		x.ids[at.off] = p.ID
	}
	return e
}

// idText is e's id as the file writes it.
func (x *receiptIndex) idText(e *indexed) string {
	if e.text {
		return x.ids[e.at.off]
	}
	return e.id.String()
}

// sort orders entries as SortForVerify orders their receipts: by chain id,
// seq, then id, the file's order among equals.
func (x *receiptIndex) sort(entries []indexed) {
	rank := make([]uint32, len(x.chains)) // chain index → place in chain id order
	for r, id := range slices.Sorted(slices.Values(x.chains)) {
		rank[x.chainOf[id]] = uint32(r)
	}
	slices.SortStableFunc(entries, func(a, b indexed) int {
		if c := cmp.Or(cmp.Compare(rank[a.chain], rank[b.chain]), cmp.Compare(a.seq, b.seq)); c != 0 {
			return c
		}
		if !a.text && !b.text {
			return bytes.Compare(a.id[:], b.id[:])
		}
		return strings.Compare(x.idText(&a), x.idText(&b))
	})
}

// reading is o.Reading for the read that indexes a file (index) or the
// one before it; nil without it.
func (o VerifyOptions) reading(index bool) func(done, total int64) {
	if o.Reading == nil {
		return nil
	}
	return func(done, total int64) { o.Reading(index, done, total) }
}

// rejections checks and counts the rejected ToolCallEvents of an export.
type rejections struct {
	keys  verify.KeySet
	sum   RejectedSummary
	probs []verify.Problem
}

// take checks raw if it is a rejected ToolCallEvent (an
// ExportedRejection line) and reports whether it was.
func (r *rejections) take(raw []byte) bool {
	x, ok := ReadExportedRejection(raw)
	if !ok {
		return false
	}
	r.sum.Total++
	if p := checkRejection(&x, r.keys, &r.sum); p != nil {
		r.probs = append(r.probs, *p)
	}
	return true
}

// windowFeed adds events to a Verifier a window at a time
// (verify.FileWindow), counting them for progress.
type windowFeed struct {
	v        *verify.Verifier
	batch    bool
	window   [][]byte
	progress progressCounter
}

// newWindowFeed feeds a Verifier of keys (o.Partial, o.BatchSignatures)
// and reports to o.Progress against total.
func newWindowFeed(keys verify.KeySet, o VerifyOptions, total int) *windowFeed {
	v := verify.NewVerifier(keys)
	v.AllowPartial = o.Partial
	return &windowFeed{v: v, batch: o.BatchSignatures, window: make([][]byte, 0, verify.FileWindow()),
		progress: progressCounter{report: o.Progress, total: total}}
}

func (w *windowFeed) add(raw []byte) {
	if w.window = append(w.window, raw); len(w.window) == cap(w.window) {
		w.v.AddAll(w.window, w.batch)
		w.window = w.window[:0]
	}
	w.progress.add()
}

// finish adds what the last window holds and returns the report.
func (w *windowFeed) finish() verify.Report {
	w.v.AddAll(w.window, w.batch)
	w.progress.done()
	return w.v.Finish()
}
