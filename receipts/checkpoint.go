package receipts

import (
	"time"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// checkpointState is a chain's pending checkpoint range: the receipts
// committed since the last checkpoint, as a Merkle tree.
type checkpointState struct {
	tree      verify.Tree
	from      uint64    // seq of the first pending receipt; 0: none pending
	firstPrev string    // its prev_hash
	lastHash  string    // receipt hash of the last pending receipt
	since     time.Time // when the first pending receipt was committed

	seq      uint64 // checkpoints cut so far
	prevHash string // hash of the last checkpoint event, GenesisHash before the first
}

// addLeaf records a committed link; c.mu must be held.
func (c *Chain) addLeaf(s *Sealed) error {
	leaf, err := verify.ReceiptLeaf(s.Hash)
	if err != nil {
		return err
	}
	cp := &c.cp
	if cp.from == 0 {
		cp.from, cp.firstPrev, cp.since = s.Seq, s.PrevHash, time.Now()
	}
	cp.tree.Add(leaf)
	cp.lastHash = s.Hash
	return nil
}

// Pending is how many committed receipts no checkpoint covers yet, and
// when the first of them was committed (zero when none).
func (c *Chain) Pending() (n uint64, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cp.tree.Size(), c.cp.since
}

// Checkpoint signs a checkpoint over the receipts committed since the last
// one and starts a new range. It returns nil, nil when there are none.
// meta.Type is set to schemas.TypeCheckpoint and meta.Subject to the chain
// id. final marks the chain's last checkpoint (its signer is stopping).
//
// The returned event MUST be published (retrying with the same bytes
// until stored): the next checkpoint names its hash, so a lost one shows
// as a checkpoint gap to the verifier.
func (c *Chain) Checkpoint(meta Meta, final bool) (*Sealed, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp := &c.cp
	if cp.from == 0 {
		return nil, nil
	}
	if cp.prevHash == "" {
		cp.prevHash = schemas.GenesisHash
	}
	meta.Type, meta.Subject = schemas.TypeCheckpoint, c.id
	data := schemas.Checkpoint{
		ChainID:            c.id,
		CheckpointSeq:      cp.seq + 1,
		FromSeq:            cp.from,
		ToSeq:              cp.from + cp.tree.Size() - 1,
		TreeSize:           cp.tree.Size(),
		RootHash:           cp.tree.Root().String(),
		FirstPrevHash:      cp.firstPrev,
		LastReceiptHash:    cp.lastHash,
		PrevCheckpointHash: cp.prevHash,
		MerkleAlg:          schemas.MerkleAlgRFC6962,
		Final:              final,
	}
	s, _, err := signEvent(c.key, meta, &data, 1024)
	if err != nil {
		return nil, err
	}
	s.ChainID, s.Seq, s.PrevHash = c.id, data.CheckpointSeq, data.PrevCheckpointHash
	cp.seq, cp.prevHash = data.CheckpointSeq, s.Hash
	cp.tree.Reset()
	cp.from, cp.firstPrev, cp.lastHash, cp.since = 0, "", "", time.Time{}
	return s, nil
}
