package query

import (
	"fmt"
	"io"
	"sort"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Categories are the auditor's problem categories, in the order a report
// names them.
var Categories = []string{verify.CategoryMissing, verify.CategoryAltered, verify.CategoryReordered,
	verify.CategoryDuplicated, verify.CategoryForeign, verify.CategoryMalformed, CategoryUnwitnessed, CategoryUnlogged}

// SortProblems orders problems by chain, then seq (stable otherwise), and
// counts them per Category.
func SortProblems(probs []verify.Problem) map[string]int {
	sort.SliceStable(probs, func(i, j int) bool {
		a, b := probs[i], probs[j]
		if a.ChainID != b.ChainID {
			return a.ChainID < b.ChainID
		}
		return a.Seq < b.Seq
	})
	counts := map[string]int{}
	for _, p := range probs {
		counts[Category(p.Kind)]++
	}
	return counts
}

// ProveFromEventsFile is ProveFromEvents over the events of the file at
// path ("-": stdin).
func ProveFromEventsFile(path string, stdin io.Reader, id string, keys verify.KeySet) (*verify.Proof, *verify.ProofResult, error) {
	events, err := verify.ReadEventsFile(path, stdin)
	if err != nil {
		return nil, nil, err
	}
	return ProveFromEvents(events, id, keys)
}

// ProveFromEvents is ProveReceipt over a file of events (an export)
// instead of the database: the checkpoint covering receipt id, signed by a
// trusted key, and the receipt hashes of its range, all taken from events.
// It fails with ErrNoCheckpoint when no checkpoint in events covers it.
func ProveFromEvents(events [][]byte, id string, keys verify.KeySet) (*verify.Proof, *verify.ProofResult, error) {
	type signedCheckpoint struct {
		raw []byte
		cp  *verify.VerifiedCheckpoint
	}
	var (
		target    *verify.Event
		targetRaw []byte
		cps       []signedCheckpoint
		bySeq     = map[string]map[uint64]string{} // chain -> seq -> receipt hash
	)
	for _, raw := range events {
		ev, err := verify.VerifyEvent(raw, keys)
		if err != nil {
			continue // not trusted: not part of a proof
		}
		if ev.Type == schemas.TypeCheckpoint {
			if cp, err := verify.CheckpointOf(ev); err == nil {
				cps = append(cps, signedCheckpoint{raw, cp})
			}
			continue
		}
		if ev.Data.Chain.ChainID == "" {
			continue
		}
		m := bySeq[ev.Data.Chain.ChainID]
		if m == nil {
			m = map[uint64]string{}
			bySeq[ev.Data.Chain.ChainID] = m
		}
		m[ev.Data.Chain.Seq] = ev.Hash
		if ev.ID == id {
			target, targetRaw = ev, raw
		}
	}
	if target == nil {
		return nil, nil, fmt.Errorf("no receipt with id %s signed by a trusted key in the file", id)
	}
	c := target.Data.Chain
	for _, x := range cps {
		if x.cp.ChainID != c.ChainID || c.Seq < x.cp.FromSeq || c.Seq > x.cp.ToSeq {
			continue
		}
		hashes := make([]string, 0, x.cp.TreeSize)
		for s := x.cp.FromSeq; s <= x.cp.ToSeq; s++ {
			h, ok := bySeq[c.ChainID][s]
			if !ok {
				return nil, nil, fmt.Errorf("chain %s seq %d is not in the file: the range of checkpoint %d cannot be proven", c.ChainID, s, x.cp.CheckpointSeq)
			}
			hashes = append(hashes, h)
		}
		return verify.BuildProof(targetRaw, x.raw, hashes, keys)
	}
	return nil, nil, fmt.Errorf("receipt %s (chain %s seq %d): %w", id, c.ChainID, c.Seq, ErrNoCheckpoint)
}
