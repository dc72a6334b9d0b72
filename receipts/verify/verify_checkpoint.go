package verify

import (
	"fmt"
	"sort"

	"github.com/talos-audit/talos/schemas"
)

// The Verifier's checkpoint checks. Checkpoints must be added before the
// receipts of their range (SortForVerify puts them first; VerifyDatabase
// streams them first). While a chain's receipts stream by in seq order,
// the receipts of each checkpoint's range are folded into a Merkle tree
// (O(log n) memory) and its root compared with the signed one when the
// range ends. Finish checks the checkpoints' own chain and that no
// receipt a checkpoint signs is missing from the end.

type cpEntry struct {
	*VerifiedCheckpoint
	reached  bool // the range's last receipt went by
	verified bool
	late     bool // added after receipts of its range
}

type chainCheckpoints struct {
	bySeq  map[uint64]*cpEntry // by checkpoint_seq
	ranges []*cpEntry          // by from_seq, built at the first receipt
	dirty  bool                // ranges needs rebuilding

	cur  *cpEntry // range being folded
	tree Tree
	ok   bool   // every receipt of cur's range so far was good and in order
	next uint64 // the seq that continues cur's range without a gap
}

func (v *Verifier) addCheckpoint(ev *Event) []Problem {
	vc, err := CheckpointOf(ev)
	if err != nil {
		return []Problem{{Kind: ProblemMalformed, ReceiptID: ev.ID, Record: RecordCheckpoint, Detail: err.(*VerifyError).Detail}}
	}
	at := func(kind, format string, a ...any) []Problem {
		return []Problem{{Kind: kind, ReceiptID: vc.ID, ChainID: vc.ChainID, Seq: vc.CheckpointSeq, Record: RecordCheckpoint,
			Detail: fmt.Sprintf(format, a...)}}
	}
	cc := v.cps[vc.ChainID]
	if cc == nil {
		cc = &chainCheckpoints{bySeq: map[uint64]*cpEntry{}}
		v.cps[vc.ChainID] = cc
	}
	if old := cc.bySeq[vc.CheckpointSeq]; old != nil {
		if old.Hash == vc.Hash {
			return at(ProblemDuplicateSeq, "duplicate of checkpoint %s (same content)", old.ID)
		}
		return at(ProblemDuplicateSeq, "conflicts with checkpoint %s, already seen as checkpoint %d of this chain (fork)",
			old.ID, vc.CheckpointSeq)
	}
	e := &cpEntry{VerifiedCheckpoint: vc}
	if cs := v.chains[vc.ChainID]; cs != nil && cs.last >= vc.FromSeq {
		e.late = true
	}
	cc.bySeq[vc.CheckpointSeq] = e
	cc.dirty = true
	return nil
}

// find is the checkpoint whose range holds seq, or nil.
func (cc *chainCheckpoints) find(seq uint64) *cpEntry {
	if cc.dirty {
		cc.ranges = cc.ranges[:0]
		for _, e := range cc.bySeq {
			cc.ranges = append(cc.ranges, e)
		}
		sort.Slice(cc.ranges, func(i, j int) bool { return cc.ranges[i].FromSeq < cc.ranges[j].FromSeq })
		cc.dirty = false
	}
	i := sort.Search(len(cc.ranges), func(i int) bool { return cc.ranges[i].ToSeq >= seq })
	if i < len(cc.ranges) && cc.ranges[i].FromSeq <= seq && !cc.ranges[i].late {
		return cc.ranges[i]
	}
	return nil
}

// feed folds the receipt at seq (hash "" when it is a bad link) into the
// checkpoint range that holds it. Links come in seq order, gaps allowed.
func (v *Verifier) feed(chainID string, seq uint64, hash, prevHash string) []Problem {
	cc := v.cps[chainID]
	if cc == nil {
		return nil
	}
	if cc.cur == nil || seq < cc.cur.FromSeq || seq > cc.cur.ToSeq {
		cc.cur = cc.find(seq)
		cc.tree.Reset()
		if cc.cur == nil {
			return nil
		}
		cc.ok = seq == cc.cur.FromSeq
		cc.next = seq
	}
	if seq != cc.next {
		cc.ok = false // a gap, already reported as such
	}
	cc.next = seq + 1
	e := cc.cur
	at := func(format string, a ...any) []Problem {
		return []Problem{{Kind: ProblemCheckpointMismatch, ReceiptID: e.ID, ChainID: chainID, Seq: e.CheckpointSeq,
			Record: RecordCheckpoint, Detail: fmt.Sprintf(format, a...)}}
	}
	var probs []Problem
	switch {
	case hash == "":
		cc.ok = false
	case cc.ok:
		if seq == e.FromSeq && prevHash != e.FirstPrevHash {
			probs = at("signs first_prev_hash %s for seq %d, whose stored receipt has prev_hash %s", e.FirstPrevHash, seq, prevHash)
			cc.ok = false
			break
		}
		leaf, err := ReceiptLeaf(hash)
		if err != nil {
			cc.ok = false
			break
		}
		cc.tree.Add(leaf)
	}
	if seq != e.ToSeq {
		return probs
	}
	e.reached = true
	if cc.ok && len(probs) == 0 {
		switch root := cc.tree.Root().String(); {
		case cc.tree.Size() != e.TreeSize || root != e.RootHash:
			probs = at("Merkle root over the stored receipts seq %d..%d is %s; the checkpoint signed %s",
				e.FromSeq, e.ToSeq, root, e.RootHash)
		case hash != e.LastReceiptHash:
			probs = at("signs last_receipt_hash %s for seq %d, whose stored receipt hashes to %s", e.LastReceiptHash, seq, hash)
		default:
			e.verified = true
		}
	}
	cc.cur = nil
	return probs
}

// finishCheckpoints checks each chain's checkpoints as a chain of their
// own, and that the receipts they sign reach the end of their ranges.
func (v *Verifier) finishCheckpoints(r *Report) {
	ids := make([]string, 0, len(v.cps))
	for id := range v.cps {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	covered := map[string]uint64{}
	for _, chainID := range ids {
		cc := v.cps[chainID]
		list := make([]*cpEntry, 0, len(cc.bySeq))
		for _, e := range cc.bySeq {
			list = append(list, e)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].CheckpointSeq < list[j].CheckpointSeq })
		add := func(e *cpEntry, kind, format string, a ...any) {
			r.Problems = append(r.Problems, Problem{Kind: kind, ReceiptID: e.ID, ChainID: chainID, Seq: e.CheckpointSeq,
				Record: RecordCheckpoint, Detail: fmt.Sprintf(format, a...)})
		}
		for i, e := range list {
			switch {
			case e.verified:
				r.Checkpoints++
			case e.reached || e.late:
				r.CheckpointsUnchecked++
			}
			if i == 0 {
				switch {
				case e.CheckpointSeq > 1 && !v.AllowPartial:
					add(e, ProblemCheckpointGap, "checkpoint %s of this chain missing before it (receipts seq 1..%d are not checkpointed)",
						seqRange(1, e.CheckpointSeq-1), e.FromSeq-1)
				case e.CheckpointSeq == 1 && (e.FromSeq != 1 || e.PrevCheckpointHash != schemas.GenesisHash):
					add(e, ProblemCheckpointMismatch, "checkpoint 1 must start at seq 1 after the genesis hash; it covers %d..%d after %s",
						e.FromSeq, e.ToSeq, e.PrevCheckpointHash)
				}
				continue
			}
			prev := list[i-1]
			switch {
			case e.CheckpointSeq > prev.CheckpointSeq+1:
				add(e, ProblemCheckpointGap, "checkpoint %s missing between checkpoint %s (to seq %d) and this one (from seq %d)",
					seqRange(prev.CheckpointSeq+1, e.CheckpointSeq-1), prev.ID, prev.ToSeq, e.FromSeq)
			case e.FromSeq != prev.ToSeq+1:
				add(e, ProblemCheckpointMismatch, "covers seq %d..%d, but checkpoint %s ended at seq %d", e.FromSeq, e.ToSeq, prev.ID, prev.ToSeq)
			case e.PrevCheckpointHash != prev.Hash:
				add(e, ProblemCheckpointMismatch, "prev_checkpoint_hash %s, but checkpoint %s has hash %s", e.PrevCheckpointHash, prev.ID, prev.Hash)
			}
		}
		if len(list) == 0 {
			continue
		}
		last := list[len(list)-1]
		maxTo := last.ToSeq
		for _, e := range list {
			maxTo = max(maxTo, e.ToSeq)
		}
		covered[chainID] = maxTo
		cs := v.chains[chainID]
		switch {
		case cs == nil:
			add(last, ProblemChainGap, "signs receipts up to seq %d of chain %s, and none of its receipts is stored", maxTo, chainID)
		case cs.last < maxTo:
			add(last, ProblemChainGap, "seq %s missing after receipt %s (seq %d): checkpoints sign the chain up to seq %d",
				seqRange(cs.last+1, maxTo), cs.lastID, cs.last, maxTo)
		case last.Final && cs.last > last.ToSeq:
			add(last, ProblemCheckpointMismatch, "is the chain's final checkpoint (seq %d), but receipts up to seq %d follow it", last.ToSeq, cs.last)
		}
	}
	for id, sum := range r.Chains {
		to := covered[id]
		sum.CheckpointedTo = to
		r.Chains[id] = sum
		if sum.Last > to {
			r.Uncovered += sum.Last - to
		}
	}
}
