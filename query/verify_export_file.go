package query

import (
	"errors"
	"fmt"

	"github.com/talos-audit/talos/receipts/verify"
)

// errOutOfChainOrder stops VerifyExportFile's first pass: the file must
// be sorted in memory.
var errOutOfChainOrder = errors.New("the file's receipts are not in chain order")

// errFileChanged: a file read more than once (VerifyExportFile,
// ProveFromEventsFile) changed between the reads.
var errFileChanged = errors.New("the file changed while it was verified")

// VerifyExportFile is VerifyExport over the file at path, without holding
// the file in memory when its receipts come in chain order (each chain's
// by seq, then id; chains may interleave), as talosctl export writes
// them. Such a file is read twice: first for the order, the rejected
// ToolCallEvents and the checkpoints (a Verifier takes the checkpoints
// before the receipts they cover, and events it cannot read first, as
// SortForVerify places them), then for everything else, a window at a
// time. Memory then holds the chains' last links, the checkpoints, the
// lines it cannot read, the rejections' positions and the problems. A
// file in any other order is read into memory and sorted (VerifyExport).
// The report is the same either way, problems in the same order.
//
// Of o it takes Partial, BatchSignatures and Progress, which the second
// read calls as the database's passes do (progressCounter), against the
// number of records the first found to verify (a file sorted in memory
// shows no progress).
func VerifyExportFile(path string, keys verify.KeySet, o VerifyOptions) (*VerifyOutcome, error) {
	out, _, err := verifyExportFile(path, keys, o)
	return out, err
}

// verifyExportFile is VerifyExportFile; streamed is whether it read the
// file twice rather than into memory.
func verifyExportFile(path string, keys verify.KeySet, o VerifyOptions) (out *VerifyOutcome, streamed bool, err error) {
	partial, batch := o.Partial, o.BatchSignatures
	scan := fileEvents(path)
	var (
		sum   RejectedSummary
		probs []verify.Problem
		first [][]byte
		skip  []int // positions the second pass leaves out: first's and the rejections'
		last  = map[string]verify.Place{}
		n     int // events read
	)
	err = scan(func(raw []byte) error {
		n++
		if x, ok := ReadExportedRejection(raw); ok {
			skip = append(skip, n-1)
			sum.Total++
			if p := checkRejection(&x, keys, &sum); p != nil {
				probs = append(probs, *p)
			}
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
	if errors.Is(err, errOutOfChainOrder) {
		events, err := verify.ReadEventsFile(path)
		if err != nil {
			return nil, false, err
		}
		return VerifyExport(path, events, keys, partial, batch), false, nil
	}
	if err != nil {
		return nil, false, err
	}
	v := verify.NewVerifier(keys)
	v.AllowPartial = partial
	v.AddAll(first, batch)
	window := make([][]byte, 0, verify.FileWindow())
	progress := progressCounter{report: o.Progress, total: n - len(skip)}
	i := 0 // the event's position
	err = scan(func(raw []byte) error {
		if i++; len(skip) > 0 && skip[0] == i-1 {
			skip = skip[1:]
			return nil
		}
		if window = append(window, raw); len(window) == cap(window) {
			v.AddAll(window, batch)
			window = window[:0]
		}
		progress.add()
		return nil
	})
	if err == nil && i != n {
		err = fmt.Errorf("%s: %w", path, errFileChanged)
	}
	if err != nil {
		return nil, false, err
	}
	v.AddAll(window, batch)
	progress.done()
	return exportOutcome(path, v.Finish(), probs, sum), true, nil
}
