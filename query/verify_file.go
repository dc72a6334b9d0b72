package query

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"slices"
	"sort"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Categories are the auditor's problem categories, in the order a report
// names them.
var Categories = []string{verify.CategoryMissing, verify.CategoryAltered, verify.CategoryReordered,
	verify.CategoryDuplicated, verify.CategoryForeign, verify.CategoryMalformed, CategoryUnwitnessed, CategoryUnlogged}

// SortProblems orders problems by chain, seq, then record id (a record's
// own problems stay in the order found), so that a report's order does not
// depend on its input's, and counts them per Category.
func SortProblems(probs []verify.Problem) map[string]int {
	sort.SliceStable(probs, func(i, j int) bool {
		a, b := probs[i], probs[j]
		if a.ChainID != b.ChainID {
			return a.ChainID < b.ChainID
		}
		if a.Seq != b.Seq {
			return a.Seq < b.Seq
		}
		return a.ReceiptID < b.ReceiptID
	})
	counts := map[string]int{}
	for _, p := range probs {
		counts[Category(p.Kind)]++
	}
	return counts
}

// eventSource calls fn with each event of a file, in order; it can be
// called more than once, to read the file again.
type eventSource func(fn func(raw []byte) error) error

// fileEvents is the events of the file at path (exportFile.scan).
func fileEvents(path string) eventSource {
	f := &exportFile{path: path}
	return func(fn func(raw []byte) error) error {
		return f.scan(func(raw []byte, _ int64) error { return fn(raw) })
	}
}

// exportFile is a file of events read more than once. Every read fails
// with errFileChanged if the file is not the one the first read began
// with: another file at path, or another size or time of last
// modification, before or after it.
type exportFile struct {
	path  string
	first os.FileInfo
}

// span is where an event is in an exportFile.
type span struct {
	off int64
	n   int32 // an event is at most 16 MiB (verify.ScanEvents)
}

// same notes the file's identity on its first call and fails with
// errFileChanged when a later call finds another.
func (f *exportFile) same() error {
	fi, err := os.Stat(f.path)
	switch {
	case err != nil:
		return err
	case f.first == nil:
		f.first = fi
	case !os.SameFile(f.first, fi) || fi.Size() != f.first.Size() || !fi.ModTime().Equal(f.first.ModTime()):
		return fmt.Errorf("%s: %w", f.path, errFileChanged)
	}
	return nil
}

// read opens the file for use; it fails with errFileChanged unless the
// file is the one the first read began with, before use and after it.
func (f *exportFile) read(use func(r *os.File) error) error {
	if err := f.same(); err != nil {
		return err
	}
	r, err := os.Open(f.path)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := use(r); err != nil {
		return err
	}
	return f.same()
}

// scan calls fn with each event of the file, in order, and where it is
// (verify.ScanEventsAt).
func (f *exportFile) scan(fn func(raw []byte, off int64) error) error {
	return f.scanReporting(nil, fn)
}

// readingEvery is how many bytes of a read VerifyOptions.Reading is told
// of at a time (a variable for tests).
var readingEvery int64 = 64 << 20

// scanReporting is scan, telling report (nil: nobody) how far it got: at
// its start, every readingEvery bytes and at its end, if the file is at
// least that long.
func (f *exportFile) scanReporting(report func(done, total int64), fn func(raw []byte, off int64) error) error {
	return f.read(func(r *os.File) error {
		size := f.first.Size()
		if report == nil || size < readingEvery {
			return verify.ScanEventsAt(r, f.path, fn)
		}
		report(0, size)
		next := readingEvery
		err := verify.ScanEventsAt(r, f.path, func(raw []byte, off int64) error {
			if end := off + int64(len(raw)); end >= next {
				report(end, size)
				next = (end/readingEvery + 1) * readingEvery
			}
			return fn(raw, off)
		})
		if err == nil {
			report(size, size)
		}
		return err
	})
}

// readAt calls fn with the event at each of spans, in their order; each
// raw is a copy of its own.
func (f *exportFile) readAt(spans iter.Seq[span], fn func(raw []byte)) error {
	return f.read(func(r *os.File) error {
		for s := range spans {
			raw := make([]byte, s.n)
			if _, err := r.ReadAt(raw, s.off); err != nil {
				if errors.Is(err, io.EOF) {
					err = errFileChanged // shorter than when it was read
				}
				return fmt.Errorf("%s: %w", f.path, err)
			}
			fn(raw)
		}
		return nil
	})
}

// ProveFromEventsFile is ProveReceipt over the events of the file at path
// (an export) instead of the database: the checkpoint covering receipt id,
// signed by a trusted key, and the receipt hashes of its range, all taken
// from the file. It fails with ErrNoCheckpoint when no checkpoint in the
// file covers it. The file is read twice rather than held in memory: for
// the receipt and the checkpoints signed by a trusted key, then for the
// receipts of the first checkpoint's range that covers it. Only those
// events' signatures are checked; when an id or a seq occurs more than
// once, the last trusted one counts.
func ProveFromEventsFile(path, id string, keys verify.KeySet) (*verify.Proof, *verify.ProofResult, error) {
	scan := fileEvents(path)
	type signedCheckpoint struct {
		raw []byte
		cp  *verify.VerifiedCheckpoint
	}
	var (
		target    *verify.Event
		targetRaw []byte
		cps       []signedCheckpoint
	)
	err := scan(func(raw []byte) error {
		switch p := verify.PlaceOf(raw); {
		case p.Checkpoint:
			if ev, err := verify.VerifyEvent(raw, keys); err == nil && ev.Type == schemas.TypeCheckpoint {
				if cp, err := verify.CheckpointOf(ev); err == nil {
					cps = append(cps, signedCheckpoint{raw, cp})
				}
			}
		case p.ChainID != "" && p.ID == id:
			if ev, err := verify.VerifyEvent(raw, keys); err == nil && ev.ID == id && ev.Type != schemas.TypeCheckpoint && ev.Data.Chain.ChainID != "" {
				target, targetRaw = ev, raw
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if target == nil {
		return nil, nil, fmt.Errorf("no receipt with id %s signed by a trusted key in the file", id)
	}
	c := target.Data.Chain
	i := slices.IndexFunc(cps, func(x signedCheckpoint) bool {
		return x.cp.ChainID == c.ChainID && c.Seq >= x.cp.FromSeq && c.Seq <= x.cp.ToSeq
	})
	if i < 0 {
		return nil, nil, fmt.Errorf("receipt %s (chain %s seq %d): %w", id, c.ChainID, c.Seq, ErrNoCheckpoint)
	}
	cp := cps[i]
	bySeq := make(map[uint64]string, cp.cp.TreeSize) // seq -> receipt hash
	err = scan(func(raw []byte) error {
		p := verify.PlaceOf(raw)
		if p.ChainID != c.ChainID || p.Seq < cp.cp.FromSeq || p.Seq > cp.cp.ToSeq {
			return nil
		}
		if ev, err := verify.VerifyEvent(raw, keys); err == nil && ev.Type != schemas.TypeCheckpoint && ev.Data.Chain.ChainID == c.ChainID {
			bySeq[ev.Data.Chain.Seq] = ev.Hash
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	hashes := make([]string, 0, cp.cp.TreeSize)
	for s := cp.cp.FromSeq; s <= cp.cp.ToSeq; s++ {
		h, ok := bySeq[s]
		if !ok {
			return nil, nil, fmt.Errorf("chain %s seq %d is not in the file: the range of checkpoint %d cannot be proven", c.ChainID, s, cp.cp.CheckpointSeq)
		}
		hashes = append(hashes, h)
	}
	return verify.BuildProof(targetRaw, cp.raw, hashes, keys)
}
