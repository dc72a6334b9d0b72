package verify

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/talos-audit/talos/schemas"
)

// VerifiedCheckpoint is a checkpoint whose signature checked out.
type VerifiedCheckpoint struct {
	schemas.Checkpoint
	ID   string // CloudEvent id
	Hash string // event hash (the next checkpoint's prev_checkpoint_hash)
	KID  string
	Time string
}

// VerifyCheckpoint verifies one signed checkpoint CloudEvent: its signature
// against keys, its type, and that its data is a well-formed checkpoint.
// Errors are *VerifyError as for VerifyEvent.
func VerifyCheckpoint(raw []byte, keys KeySet) (*VerifiedCheckpoint, error) {
	ev, err := VerifyEvent(raw, keys)
	if err != nil {
		return nil, err
	}
	return CheckpointOf(ev)
}

// CheckpointOf reads the checkpoint of an event VerifyEvent verified:
// its type, its data against checkpoint.schema.json, a consistent range.
func CheckpointOf(ev *Event) (*VerifiedCheckpoint, error) {
	if ev.Type != schemas.TypeCheckpoint {
		return nil, malformed("event %s: type %q is not a checkpoint", ev.ID, ev.Type)
	}
	if err := schemas.ValidateCheckpoint(ev.RawData); err != nil {
		return nil, malformed("checkpoint %s: %v", ev.ID, err)
	}
	vc := &VerifiedCheckpoint{ID: ev.ID, Hash: ev.Hash, KID: ev.KID, Time: ev.Time}
	if err := json.Unmarshal(ev.RawData, &vc.Checkpoint); err != nil {
		return nil, malformed("checkpoint %s: %v", ev.ID, err)
	}
	c := &vc.Checkpoint
	if c.ToSeq < c.FromSeq || c.TreeSize != c.ToSeq-c.FromSeq+1 {
		return nil, malformed("checkpoint %s: range %d..%d does not hold tree_size %d", ev.ID, c.FromSeq, c.ToSeq, c.TreeSize)
	}
	return vc, nil
}

// ProofFormat names the inclusion proof document format.
const ProofFormat = "talos.inclusion_proof.v1"

// Proof is an offline-checkable inclusion proof: one signed receipt, the
// signed checkpoint whose range holds it, and the RFC 6962 audit path from
// the receipt's leaf to the checkpoint's root. VerifyProof needs nothing
// else but the trusted public keys.
type Proof struct {
	Format     string          `json:"format"`
	Receipt    json.RawMessage `json:"receipt"`    // the signed receipt CloudEvent
	Checkpoint json.RawMessage `json:"checkpoint"` // the signed checkpoint CloudEvent
	LeafIndex  uint64          `json:"leaf_index"` // receipt seq - checkpoint from_seq
	TreeSize   uint64          `json:"tree_size"`
	AuditPath  []string        `json:"audit_path"` // hex, leaf to root
}

// BuildProof makes the proof that receipt is in checkpoint, given the
// receipt hashes of the checkpoint's whole range in seq order. It checks
// what it builds (VerifyProof with keys) before returning it.
func BuildProof(receipt, checkpoint []byte, rangeHashes []string, keys KeySet) (*Proof, *ProofResult, error) {
	p := &Proof{Format: ProofFormat, Receipt: receipt, Checkpoint: checkpoint}
	ev, cp, err := p.signedParts(keys)
	if err != nil {
		return nil, nil, err
	}
	seq := ev.Data.Chain.Seq
	if ev.Data.Chain.ChainID != cp.ChainID || seq < cp.FromSeq || seq > cp.ToSeq {
		return nil, nil, fmt.Errorf("verify: receipt %s (chain %s seq %d) is not in checkpoint %d of chain %s (seq %d..%d)",
			ev.ID, ev.Data.Chain.ChainID, seq, cp.CheckpointSeq, cp.ChainID, cp.FromSeq, cp.ToSeq)
	}
	if uint64(len(rangeHashes)) != cp.TreeSize {
		return nil, nil, fmt.Errorf("verify: %d receipt hashes for a checkpoint of %d", len(rangeHashes), cp.TreeSize)
	}
	leaves := make([]Hash, len(rangeHashes))
	for i, h := range rangeHashes {
		if leaves[i], err = ReceiptLeaf(h); err != nil {
			return nil, nil, err
		}
	}
	path, err := InclusionProof(leaves, seq-cp.FromSeq)
	if err != nil {
		return nil, nil, err
	}
	p.LeafIndex, p.TreeSize, p.AuditPath = seq-cp.FromSeq, cp.TreeSize, make([]string, len(path))
	for i, h := range path {
		p.AuditPath[i] = h.String()
	}
	res, err := p.check(ev, cp)
	if err != nil {
		return nil, nil, err
	}
	return p, res, nil
}

// ProofResult is what a verified proof establishes.
type ProofResult struct {
	ReceiptID     string `json:"receipt_id"`
	ReceiptHash   string `json:"receipt_hash"`
	ChainID       string `json:"chain_id"`
	Seq           uint64 `json:"seq"`
	CheckpointID  string `json:"checkpoint_id"`
	CheckpointSeq uint64 `json:"checkpoint_seq"`
	FromSeq       uint64 `json:"from_seq"`
	ToSeq         uint64 `json:"to_seq"`
	RootHash      string `json:"root_hash"`
	ReceiptKID    string `json:"receipt_kid"`
	CheckpointKID string `json:"checkpoint_kid"`
}

// ErrProofInvalid wraps every reason VerifyProof rejects a proof.
var ErrProofInvalid = errors.New("verify: inclusion proof invalid")

// VerifyProof checks a proof offline: the receipt's and the checkpoint's
// signatures against keys, that the receipt's chain position is the
// proof's leaf in the checkpoint's range, and that its audit path leads
// from the receipt's leaf hash to the signed root.
func VerifyProof(p *Proof, keys KeySet) (*ProofResult, error) {
	if p == nil || p.Format != ProofFormat {
		return nil, proofInvalid("not a %s document", ProofFormat)
	}
	ev, cp, err := p.signedParts(keys)
	if err != nil {
		return nil, err
	}
	return p.check(ev, cp)
}

func proofInvalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrProofInvalid, fmt.Sprintf(format, a...))
}

// signedParts verifies the proof's receipt and checkpoint signatures.
func (p *Proof) signedParts(keys KeySet) (*Event, *VerifiedCheckpoint, error) {
	ev, err := VerifyEvent(p.Receipt, keys)
	if err != nil {
		return nil, nil, proofInvalid("receipt: %v", err)
	}
	if !isReceiptType(ev.Type) {
		return nil, nil, proofInvalid("receipt %s: type %q is not a receipt", ev.ID, ev.Type)
	}
	cp, err := VerifyCheckpoint(p.Checkpoint, keys)
	if err != nil {
		return nil, nil, proofInvalid("checkpoint: %v", err)
	}
	return ev, cp, nil
}

// check establishes, for the verified receipt ev and checkpoint cp, that
// the receipt's chain position is the proof's leaf in the checkpoint's
// range and that the audit path leads from its leaf hash to the root.
func (p *Proof) check(ev *Event, cp *VerifiedCheckpoint) (*ProofResult, error) {
	c := ev.Data.Chain
	switch {
	case c.ChainID != cp.ChainID:
		return nil, proofInvalid("receipt is in chain %s, the checkpoint covers chain %s", c.ChainID, cp.ChainID)
	case c.Seq < cp.FromSeq || c.Seq > cp.ToSeq:
		return nil, proofInvalid("receipt seq %d is outside the checkpoint's range %d..%d", c.Seq, cp.FromSeq, cp.ToSeq)
	case p.TreeSize != cp.TreeSize:
		return nil, proofInvalid("proof tree_size %d, the checkpoint signed %d", p.TreeSize, cp.TreeSize)
	case p.LeafIndex != c.Seq-cp.FromSeq:
		return nil, proofInvalid("leaf_index %d, but seq %d is leaf %d of the range", p.LeafIndex, c.Seq, c.Seq-cp.FromSeq)
	}
	path := make([]Hash, len(p.AuditPath))
	for i, s := range p.AuditPath {
		var err error
		if path[i], err = ParseHash(s); err != nil {
			return nil, proofInvalid("audit_path[%d]: %v", i, err)
		}
	}
	leaf, err := ReceiptLeaf(ev.Hash)
	if err != nil {
		return nil, proofInvalid("%v", err)
	}
	root, err := ParseHash(cp.RootHash)
	if err != nil {
		return nil, proofInvalid("checkpoint root: %v", err)
	}
	if err := VerifyInclusion(leaf, p.LeafIndex, p.TreeSize, path, root); err != nil {
		return nil, proofInvalid("%v", err)
	}
	return &ProofResult{ReceiptID: ev.ID, ReceiptHash: ev.Hash, ChainID: c.ChainID, Seq: c.Seq,
		CheckpointID: cp.ID, CheckpointSeq: cp.CheckpointSeq, FromSeq: cp.FromSeq, ToSeq: cp.ToSeq,
		RootHash: cp.RootHash, ReceiptKID: ev.KID, CheckpointKID: cp.KID}, nil
}
