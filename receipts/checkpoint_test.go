package receipts

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// checkpointed builds a chain of n receipts with a checkpoint after every
// `every` receipts (and one over the rest if final). It returns the
// receipts and the checkpoints in the order they were made.
func checkpointed(t *testing.T, c *Chain, n, every int, final bool) (recs, cps [][]byte) {
	t.Helper()
	for i := 1; i <= n; i++ {
		s, err := c.Seal(testMeta(i), receipttest.Receipt(i, 1))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(s); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, s.JSON)
		if i%every == 0 {
			cp, err := c.Checkpoint(Meta{Source: "talos://enforce/test"}, false)
			if err != nil || cp == nil {
				t.Fatalf("checkpoint after %d: %v %v", i, cp, err)
			}
			cps = append(cps, cp.JSON)
		}
	}
	if final {
		cp, err := c.Checkpoint(Meta{Source: "talos://enforce/test"}, true)
		if err != nil {
			t.Fatal(err)
		}
		if cp != nil {
			cps = append(cps, cp.JSON)
		}
	}
	return recs, cps
}

func verifyAll(keys verify.KeySet, partial bool, sets ...[][]byte) verify.Report {
	var all [][]byte
	for _, s := range sets {
		all = append(all, s...)
	}
	verify.SortForVerify(all)
	v := verify.NewVerifier(keys)
	v.AllowPartial = partial
	for _, raw := range all {
		v.Add(raw)
	}
	return v.Finish()
}

func TestChainCheckpoints(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	c := NewChain("w1", key)
	if cp, err := c.Checkpoint(Meta{Source: "talos://enforce/test"}, false); cp != nil || err != nil {
		t.Fatalf("checkpoint of an empty range: %v %v", cp, err)
	}
	recs, cps := checkpointed(t, c, 23, 10, true)
	if len(cps) != 3 {
		t.Fatalf("%d checkpoints, want 3 (1..10, 11..20, 21..23 final)", len(cps))
	}
	var prev string = schemas.GenesisHash
	for i, raw := range cps {
		vc, err := verify.VerifyCheckpoint(raw, keys)
		if err != nil {
			t.Fatal(err)
		}
		from := uint64(10*i + 1)
		to := min(from+9, 23)
		if vc.ChainID != "w1" || vc.CheckpointSeq != uint64(i+1) || vc.FromSeq != from || vc.ToSeq != to ||
			vc.TreeSize != to-from+1 || vc.PrevCheckpointHash != prev || vc.Final != (i == 2) || vc.MerkleAlg != schemas.MerkleAlgRFC6962 {
			t.Errorf("checkpoint %d: %+v", i+1, vc.Checkpoint)
		}
		// The root is RFC 6962 over the receipt hashes of the range.
		var leaves []verify.Hash
		for _, r := range recs[from-1 : to] {
			ev, err := verify.VerifyEvent(r, keys)
			if err != nil {
				t.Fatal(err)
			}
			l, _ := verify.ReceiptLeaf(ev.Hash)
			leaves = append(leaves, l)
		}
		if verify.RootOf(leaves).String() != vc.RootHash {
			t.Errorf("checkpoint %d root differs from verify.RootOf its receipts", i+1)
		}
		prev = vc.Hash
	}
	if n, since := c.Pending(); n != 0 || !since.IsZero() {
		t.Errorf("pending after the final checkpoint: %d %v", n, since)
	}

	r := verifyAll(keys, false, recs, cps)
	if !r.OK() || r.Checkpoints != 3 || r.Uncovered != 0 || r.Chains["w1"].CheckpointedTo != 23 {
		t.Fatalf("untouched chain: %+v", r)
	}
	// Without the final checkpoint, 3 receipts are not covered.
	r = verifyAll(keys, false, recs, cps[:2])
	if !r.OK() || r.Checkpoints != 2 || r.Uncovered != 3 {
		t.Fatalf("two checkpoints: %+v", r)
	}
}

func oneProblem(t *testing.T, r verify.Report, kind, id, detail string) {
	t.Helper()
	if len(r.Problems) != 1 {
		t.Fatalf("want one %s problem, got %d: %v", kind, len(r.Problems), r.Problems)
	}
	p := r.Problems[0]
	if p.Kind != kind || p.ReceiptID != id || !strings.Contains(p.String(), detail) {
		t.Fatalf("want %s at %s mentioning %q, got %s", kind, id, detail, p)
	}
}

func eventID(t *testing.T, raw []byte) string {
	t.Helper()
	var ev struct{ ID string }
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.ID
}

func TestCheckpointTamperCases(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	recs, cps := checkpointed(t, NewChain("w1", key), 20, 5, false)

	t.Run("tail deleted after its checkpoint", func(t *testing.T) {
		// Receipts 19 and 20 gone: only the checkpoint knows they existed.
		r := verifyAll(keys, false, recs[:18], cps)
		oneProblem(t, r, verify.ProblemChainGap, eventID(t, cps[3]), "seq 19..20 missing after receipt "+eventID(t, recs[17]))
		if verify.Category(r.Problems[0].Kind) != verify.CategoryMissing {
			t.Fatal("a deleted tail is not 'missing'")
		}
	})
	t.Run("receipt deleted inside a range", func(t *testing.T) {
		// One problem, the gap: the range's checkpoint is not also
		// reported (it cannot be compared; it is counted as unchecked).
		rest := append(append([][]byte{}, recs[:7]...), recs[8:]...)
		r := verifyAll(keys, false, rest, cps)
		oneProblem(t, r, verify.ProblemChainGap, eventID(t, recs[8]), "seq 8 missing")
		if r.Checkpoints != 3 || r.CheckpointsUnchecked != 1 {
			t.Fatalf("checkpoints %d unchecked %d", r.Checkpoints, r.CheckpointsUnchecked)
		}
	})
	t.Run("every receipt of a chain deleted", func(t *testing.T) {
		r := verifyAll(keys, false, cps)
		if r.OK() || r.Problems[len(r.Problems)-1].Kind != verify.ProblemChainGap {
			t.Fatalf("%+v", r.Problems)
		}
	})
	t.Run("checkpoint deleted", func(t *testing.T) {
		r := verifyAll(keys, false, recs, append(append([][]byte{}, cps[:1]...), cps[2:]...))
		oneProblem(t, r, verify.ProblemCheckpointGap, eventID(t, cps[2]), "checkpoint 2 missing")
	})
	t.Run("checkpoint by an untrusted key", func(t *testing.T) {
		other := testKey(t, 9)
		_, foreign := checkpointed(t, NewChain("w1", other), 5, 5, false)
		all := append(append([][]byte{}, cps[1:]...), foreign...)
		r := verifyAll(keys, false, recs, all)
		var kinds []string
		for _, p := range r.Problems {
			kinds = append(kinds, p.Kind)
		}
		// The foreign checkpoint is named; checkpoint 1 is then missing.
		if len(r.Problems) != 2 || r.Problems[0].Kind != verify.ProblemUnknownKey || r.Problems[0].Record != verify.RecordCheckpoint ||
			r.Problems[0].ReceiptID != eventID(t, foreign[0]) || r.Problems[1].Kind != verify.ProblemCheckpointGap {
			t.Fatalf("problems %v: %v", kinds, r.Problems)
		}
	})
	t.Run("history rewritten with the real key", func(t *testing.T) {
		// An insider with the signing key re-signs receipt 7 with other
		// content and re-chains everything after it: every link and
		// signature is good, but the checkpoints made before say otherwise.
		c := NewChain("w1", key)
		var forged [][]byte
		for i := 1; i <= 20; i++ {
			r := receipttest.Receipt(i, 1)
			if i == 7 {
				r.Decision, r.ResultCode = schemas.DecisionDeny, schemas.DecisionDeny
			}
			s, err := c.Seal(testMeta(i), r)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Commit(s); err != nil {
				t.Fatal(err)
			}
			forged = append(forged, s.JSON)
		}
		if r := verifyAll(keys, false, forged); !r.OK() {
			t.Fatalf("the rewritten chain alone should verify (that is the point): %v", r.Problems)
		}
		r := verifyAll(keys, false, forged, cps)
		// Checkpoint 2 (seq 6..10) no longer matches; checkpoint 3 starts
		// after a different prev_hash, and so do the ones after it.
		if len(r.Problems) < 2 || r.Problems[0].Kind != verify.ProblemCheckpointMismatch || r.Problems[0].ReceiptID != eventID(t, cps[1]) ||
			!strings.Contains(r.Problems[0].Detail, "Merkle root over the stored receipts seq 6..10") {
			t.Fatalf("%v", r.Problems)
		}
		for _, p := range r.Problems {
			if p.Kind != verify.ProblemCheckpointMismatch || verify.Category(p.Kind) != verify.CategoryAltered {
				t.Fatalf("unexpected %s", p)
			}
		}
	})
	t.Run("duplicate and conflicting checkpoints", func(t *testing.T) {
		r := verifyAll(keys, false, recs, cps, cps[:1])
		oneProblem(t, r, verify.ProblemDuplicateSeq, eventID(t, cps[0]), "same content")
	})
	t.Run("receipts after a final checkpoint", func(t *testing.T) {
		c := NewChain("w2", key)
		recs2, cps2 := checkpointed(t, c, 4, 10, true)
		more := buildLinks(t, c, 5, 6, 1)
		r := verifyAll(keys, false, recs2, cps2, more)
		oneProblem(t, r, verify.ProblemCheckpointMismatch, eventID(t, cps2[0]), "final checkpoint")
	})
	t.Run("a partial range verifies its checkpoints", func(t *testing.T) {
		r := verifyAll(keys, true, recs[10:], cps[2:])
		if !r.OK() || r.Checkpoints != 2 {
			t.Fatalf("%+v", r)
		}
	})
}

func TestInclusionProofOffline(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	recs, cps := checkpointed(t, NewChain("w1", key), 13, 13, false)
	var hashes []string
	for _, r := range recs {
		ev, err := verify.VerifyEvent(r, keys)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, ev.Hash)
	}
	for i := range recs {
		p, res, err := verify.BuildProof(recs[i], cps[0], hashes, keys)
		if err != nil {
			t.Fatalf("receipt %d: %v", i+1, err)
		}
		if res.Seq != uint64(i+1) || res.CheckpointSeq != 1 || p.LeafIndex != uint64(i) || p.TreeSize != 13 {
			t.Fatalf("receipt %d: %+v", i+1, res)
		}
		// Round trip through JSON, as a file handed to an auditor.
		b, _ := json.Marshal(p)
		var back verify.Proof
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if _, err := verify.VerifyProof(&back, keys); err != nil {
			t.Fatalf("receipt %d: %v", i+1, err)
		}
	}
	p, _, err := verify.BuildProof(recs[4], cps[0], hashes, keys)
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(q *verify.Proof)) error {
		q := *p
		q.AuditPath = append([]string(nil), p.AuditPath...)
		f(&q)
		_, err := verify.VerifyProof(&q, keys)
		return err
	}
	other := testKey(t, 7)
	otherKeys := verify.KeySet{}
	otherKeys.Add(other.Public())
	cases := map[string]error{
		"path hash flipped": mut(func(q *verify.Proof) { q.AuditPath[0] = strings.Repeat("0", 64) }),
		"wrong leaf index":  mut(func(q *verify.Proof) { q.LeafIndex++ }),
		"wrong tree size":   mut(func(q *verify.Proof) { q.TreeSize++ }),
		"another receipt":   mut(func(q *verify.Proof) { q.Receipt = recs[5] }),
		"receipt edited":    mut(func(q *verify.Proof) { q.Receipt = []byte(strings.Replace(string(q.Receipt), `"allow"`, `"deny"`, 1)) }),
		"checkpoint edited": mut(func(q *verify.Proof) {
			q.Checkpoint = []byte(strings.Replace(string(q.Checkpoint), `"tree_size":13`, `"tree_size":14`, 1))
		}),
		"not a proof":           mut(func(q *verify.Proof) { q.Format = "x" }),
		"path truncated":        mut(func(q *verify.Proof) { q.AuditPath = q.AuditPath[1:] }),
		"checkpoint as receipt": mut(func(q *verify.Proof) { q.Receipt = q.Checkpoint }),
	}
	for name, err := range cases {
		if !errors.Is(err, verify.ErrProofInvalid) {
			t.Errorf("%s: %v, want verify.ErrProofInvalid", name, err)
		}
	}
	if _, err := verify.VerifyProof(p, otherKeys); !errors.Is(err, verify.ErrProofInvalid) || !strings.Contains(err.Error(), "not a trusted key") {
		t.Errorf("untrusted key: %v", err)
	}
	if _, _, err := verify.BuildProof(recs[0], cps[0], hashes[:12], keys); err == nil {
		t.Error("BuildProof with a short range accepted")
	}
}
