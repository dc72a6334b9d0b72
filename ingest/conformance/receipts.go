package conformance

import (
	"fmt"
	"sort"

	"github.com/talos-audit/talos/receipts/verify"
)

// runReceipts: every envelope the run sent got a decision naming its
// receipt (RCPT-01), and, with trusted keys, every such receipt is
// signed by one and links to its predecessor where the run holds both
// (T-CHAIN-1).
func (r *run) runReceipts() {
	rc := Result{Group: GroupCSP, ID: "RCPT-01", Test: "ingest/pipeline_test.go TestPipelineReasonCodes"}
	var missing int
	var raws [][]byte
	for _, s := range r.sent {
		if s.d == nil || s.d.ReceiptID == "" || len(s.d.Receipt) == 0 {
			missing++
			continue
		}
		rc.ReceiptIDs = append(rc.ReceiptIDs, s.d.ReceiptID)
		raws = append(raws, s.d.Receipt)
	}
	if missing > 0 || len(raws) == 0 {
		rc.Status, rc.Reason = Fail, fmt.Sprintf("%d of %d envelopes got no receipt", missing, len(r.sent))
	} else {
		rc.Status, rc.Reason = Pass, fmt.Sprintf("each of %d envelopes (allowed, denied, malformed) got a decision with its receipt", len(raws))
	}
	r.set(rc)
	r.set(r.chainResult(raws))
}

// chainResult verifies raws' signatures and the links between receipts
// the run holds consecutively in one chain.
func (r *run) chainResult(raws [][]byte) Result {
	res := Result{Group: GroupCSP, ID: "T-CHAIN-1", Check: "receipts signed and chained", Test: "receipts/chain_test.go TestSealVerifyRoundTrip"}
	if r.cfg.TrustedKeys == nil {
		res.Status, res.Reason = NotApplicable, "no trusted keys given (--trusted-keys): signatures not checked"
		return res
	}
	type link struct {
		seq        uint64
		hash, prev string
	}
	chains := map[string][]link{}
	for _, raw := range raws {
		ev, err := verify.VerifyEvent(raw, r.cfg.TrustedKeys)
		if err != nil {
			res.Status, res.Reason = Fail, err.Error()
			return res
		}
		res.ReceiptIDs = append(res.ReceiptIDs, ev.ID)
		c := ev.Data.Chain
		chains[c.ChainID] = append(chains[c.ChainID], link{c.Seq, ev.Hash, c.PrevHash})
	}
	links := 0
	for id, ls := range chains {
		sort.Slice(ls, func(i, j int) bool { return ls[i].seq < ls[j].seq })
		for i := 1; i < len(ls); i++ {
			if ls[i].seq != ls[i-1].seq+1 {
				continue
			}
			if ls[i].prev != ls[i-1].hash {
				res.Status, res.Reason = Fail, fmt.Sprintf("chain %s seq %d: prev_hash is not the hash of seq %d", id, ls[i].seq, ls[i-1].seq)
				return res
			}
			links++
		}
	}
	res.Status = Pass
	res.Reason = fmt.Sprintf("%d receipts signed by trusted keys, in %d chain(s); %d links between consecutive receipts checked", len(raws), len(chains), links)
	return res
}
