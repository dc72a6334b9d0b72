package receipts

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// ErrNotNextLink is returned by Chain.Commit for a Sealed receipt that is
// not the next link of the chain (another receipt was committed since it
// was sealed, or it belongs to another chain).
var ErrNotNextLink = errors.New("receipts: not the next link of the chain")

// Chain is one serial hash chain of receipts, written by exactly one signer
// (DESIGN.md §3): seq starts at 1 with no gaps and each link's prev_hash is
// the receipt hash of the link before.
//
// Sealing and committing are separate so that a receipt the stream drops
// never leaves a gap: the caller Seals, publishes Sealed.JSON, and Commits
// only once the stream has stored that very receipt. If the publish fails,
// or the stream drops it as a duplicate of a receipt another worker already
// stored, the caller does not Commit, and the next Seal reuses the seq.
//
// A Chain is meant to be driven by one goroutine at a time (seal, publish,
// commit, repeat); its methods are nonetheless safe for concurrent use, and
// of two receipts sealed on the same head only the first committed wins.
// Run several chains, not one chain behind a lock, to use several cores.
type Chain struct {
	id      string
	idValid bool // schemas.ValidID(id), checked once
	key     *PrivateKey

	mu   sync.Mutex // guards seq, hash and cp
	seq  uint64     // seq of the head, 0 before the first commit
	hash string     // receipt hash of the head, GenesisHash before the first
	cp   checkpointState

	// sizes are the lengths of the last event of each kind this chain
	// signed (sizeDecision, sizeEffect, sizeOther): the buffer size the
	// next one of that kind starts with. Under flight load a chain signs
	// pre receipts, bigger post receipts and ToolCallEvents in turn; one
	// hint for all made most of them outgrow their buffer.
	sizes [3]atomic.Int64
}

// Size hints of a chain, by the type of event signed.
const (
	sizeDecision = iota
	sizeEffect
	sizeOther
)

func sizeKind(typ string) int {
	switch typ {
	case schemas.TypeReceiptDecision:
		return sizeDecision
	case schemas.TypeReceiptEffect:
		return sizeEffect
	}
	return sizeOther
}

// NewChain starts a chain at genesis: its first receipt gets seq 1 and
// prev_hash schemas.GenesisHash. id names the chain (chain_id) and MUST
// be a valid subject token (schemas.ValidID); key signs every link.
func NewChain(id string, key *PrivateKey) *Chain {
	return &Chain{id: id, idValid: schemas.ValidID(id), key: key, hash: schemas.GenesisHash}
}

// ResumeChain continues a chain whose last stored link has seq and receipt
// hash hash (for a worker restarting on a chain it owns). seq 0 means
// genesis, and hash must then be schemas.GenesisHash. Checkpoints of a
// resumed chain start a new checkpoint sequence at seq+1 (checkpoint 1,
// prev_checkpoint_hash genesis), which a verifier of the whole chain
// reports; resume only a chain that was never checkpointed.
func ResumeChain(id string, key *PrivateKey, seq uint64, hash string) (*Chain, error) {
	if _, err := verify.ParseHash(hash); err != nil {
		return nil, fmt.Errorf("receipts: resume chain %s: head hash %q is not lowercase hex sha256", id, hash)
	}
	if seq == 0 && hash != schemas.GenesisHash {
		return nil, fmt.Errorf("receipts: resume chain %s: seq 0 needs the genesis hash", id)
	}
	return &Chain{id: id, idValid: schemas.ValidID(id), key: key, seq: seq, hash: hash}, nil
}

// ID returns the chain id.
func (c *Chain) ID() string { return c.id }

// SignEvent signs an event outside the chain (a ToolCallEvent) with the
// chain's signing key; see the package-level SignEvent.
func (c *Chain) SignEvent(meta Meta, v any) (*Sealed, error) {
	s, _, err := c.sign(meta, v)
	return s, err
}

// sign signs an event with the chain's key, its buffer sized by the last
// event of its kind.
func (c *Chain) sign(meta Meta, v any) (*Sealed, *schemas.Signature, error) {
	size := &c.sizes[sizeKind(meta.Type)]
	s, sig, err := signEvent(c.key, meta, v, int(size.Load()))
	if err != nil {
		return nil, nil, err
	}
	size.Store(int64(len(s.JSON)))
	return s, sig, nil
}

// Head returns the seq and receipt hash of the last committed link (0 and
// schemas.GenesisHash for an empty chain).
func (c *Chain) Head() (seq uint64, hash string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq, c.hash
}

// Seal signs data as the next link of the chain without advancing it. It
// sets data.Chain (chain_id, seq = head+1, prev_hash = head hash),
// data.ContentHashAlg if empty ("sha256"), and, once signed,
// data.Signature; any Signature already in data is replaced. meta.Type must
// be a receipt type (schemas.TypeReceipt*). On error data.Chain and
// data.Signature are unspecified and nothing is signed.
func (c *Chain) Seal(meta Meta, data *schemas.Receipt) (*Sealed, error) {
	if data == nil {
		return nil, errors.New("receipts: seal: nil receipt")
	}
	if !c.idValid {
		return nil, fmt.Errorf("receipts: seal: chain id %q is not a valid subject token", c.id)
	}
	switch meta.Type {
	case schemas.TypeReceiptDecision, schemas.TypeReceiptEffect, schemas.TypeReceiptControl:
	default:
		return nil, fmt.Errorf("receipts: seal: type %q is not a receipt type", meta.Type)
	}
	seq, prev := c.Head()
	data.Chain = schemas.Chain{ChainID: c.id, Seq: seq + 1, PrevHash: prev}
	if data.ContentHashAlg == "" {
		data.ContentHashAlg = schemas.ContentHashAlg
	}
	data.Signature = nil
	s, sig, err := c.sign(meta, data)
	if err != nil {
		return nil, err
	}
	data.Signature = sig
	s.Seq, s.ChainID, s.PrevHash = seq+1, c.id, prev
	return s, nil
}

// Commit advances the head to s, which must be the next link: sealed by
// this chain on the current head. Call it only once the receipt is stored.
func (c *Chain) Commit(s *Sealed) error {
	if s == nil {
		return fmt.Errorf("%w: nil", ErrNotNextLink)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.ChainID != c.id || s.Seq != c.seq+1 || s.PrevHash != c.hash {
		return fmt.Errorf("%w: chain %s head is seq %d; receipt %s is chain %s seq %d on prev_hash %.12s…",
			ErrNotNextLink, c.id, c.seq, s.ID, s.ChainID, s.Seq, s.PrevHash)
	}
	if err := c.addLeaf(s); err != nil {
		return err
	}
	c.seq, c.hash = s.Seq, s.Hash
	return nil
}
