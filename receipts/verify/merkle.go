package verify

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
)

// This file is RFC 6962 §2.1 Merkle tree hashing (the Certificate
// Transparency and Rekor tree), over the receipts of a checkpoint range:
//
//	MTH({})        = SHA-256()
//	MTH({d0})      = SHA-256(0x00 || d0)                 (leaf hash)
//	MTH(D[n])      = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))
//
// where k is the largest power of two smaller than n. A receipt's leaf data
// is the 32 bytes of its receipt hash.

// Hash is a SHA-256 digest.
type Hash [sha256.Size]byte

// String is the hash in lowercase hex.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// ParseHash reads 64 lowercase hex digits.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if !isHexHash(s) {
		return h, fmt.Errorf("verify: %q is not a lowercase hex sha256", s)
	}
	_, err := hex.Decode(h[:], []byte(s))
	return h, err
}

// LeafHash is the RFC 6962 hash of a leaf: SHA-256(0x00 || data).
func LeafHash(data []byte) Hash {
	h := sha256.New()
	h.Write([]byte{0})
	h.Write(data)
	var out Hash
	h.Sum(out[:0])
	return out
}

// NodeHash is the RFC 6962 hash of an interior node: SHA-256(0x01 || l || r).
func NodeHash(l, r Hash) Hash {
	var buf [1 + 2*sha256.Size]byte
	buf[0] = 1
	copy(buf[1:], l[:])
	copy(buf[1+sha256.Size:], r[:])
	return sha256.Sum256(buf[:])
}

// EmptyRoot is the tree hash of no leaves, SHA-256 of the empty string.
func EmptyRoot() Hash { return sha256.Sum256(nil) }

// ReceiptLeaf is the leaf hash of a receipt given its receipt hash (64
// lowercase hex digits).
func ReceiptLeaf(receiptHash string) (Hash, error) {
	var raw Hash
	if !isHexHash(receiptHash) {
		return Hash{}, fmt.Errorf("verify: receipt hash %q is not lowercase hex sha256", receiptHash)
	}
	if _, err := hex.Decode(raw[:], []byte(receiptHash)); err != nil {
		return Hash{}, err
	}
	return LeafHash(raw[:]), nil
}

// Tree accumulates leaf hashes in order and yields the RFC 6962 root of
// what it has seen, in O(log n) memory: it keeps the roots of the complete
// subtrees that make up the leaves so far (a compact range). The zero value
// is an empty tree.
type Tree struct {
	n     uint64
	stack []Hash // roots of complete subtrees, largest (leftmost) first
}

// Size is the number of leaves added.
func (t *Tree) Size() uint64 { return t.n }

// Add appends one leaf hash.
func (t *Tree) Add(leaf Hash) {
	t.stack = append(t.stack, leaf)
	// Every trailing 1 bit of n is a complete subtree the new leaf now pairs.
	for n := t.n; n&1 == 1; n >>= 1 {
		k := len(t.stack)
		t.stack[k-2] = NodeHash(t.stack[k-2], t.stack[k-1])
		t.stack = t.stack[:k-1]
	}
	t.n++
}

// Root is the tree hash of the leaves added so far.
func (t *Tree) Root() Hash {
	if t.n == 0 {
		return EmptyRoot()
	}
	// The ragged right edge folds right to left, as MTH splits at the
	// largest power of two.
	r := t.stack[len(t.stack)-1]
	for i := len(t.stack) - 2; i >= 0; i-- {
		r = NodeHash(t.stack[i], r)
	}
	return r
}

// Reset empties the tree, keeping its memory.
func (t *Tree) Reset() { t.n, t.stack = 0, t.stack[:0] }

// RootOf is the tree hash of leaves.
func RootOf(leaves []Hash) Hash {
	var t Tree
	for _, l := range leaves {
		t.Add(l)
	}
	return t.Root()
}

// InclusionProof is the RFC 6962 audit path of leaves[index]: the sibling
// hashes from the leaf up to the root.
func InclusionProof(leaves []Hash, index uint64) ([]Hash, error) {
	if index >= uint64(len(leaves)) {
		return nil, fmt.Errorf("verify: inclusion proof: index %d outside a tree of %d leaves", index, len(leaves))
	}
	return path(leaves, index), nil
}

func path(leaves []Hash, m uint64) []Hash {
	n := uint64(len(leaves))
	if n <= 1 {
		return nil
	}
	k := splitPoint(n)
	if m < k {
		return append(path(leaves[:k], m), RootOf(leaves[k:]))
	}
	return append(path(leaves[k:], m-k), RootOf(leaves[:k]))
}

// splitPoint is the largest power of two smaller than n (n > 1).
func splitPoint(n uint64) uint64 { return 1 << (bits.Len64(n-1) - 1) }

// ErrProofMismatch is returned by VerifyInclusion when a proof does not
// lead to the expected root.
var ErrProofMismatch = errors.New("verify: inclusion proof does not match the root")

// VerifyInclusion checks that leaf is at index in a tree of size leaves
// whose root is root, given its audit path (RFC 9162 §2.1.3.2).
func VerifyInclusion(leaf Hash, index, size uint64, proof []Hash, root Hash) error {
	if index >= size {
		return fmt.Errorf("verify: inclusion proof: index %d outside a tree of %d leaves", index, size)
	}
	fn, sn := index, size-1
	r := leaf
	for _, p := range proof {
		if sn == 0 {
			return fmt.Errorf("%w: the proof is longer than the tree is deep", ErrProofMismatch)
		}
		if fn&1 == 1 || fn == sn {
			r = NodeHash(p, r)
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			r = NodeHash(r, p)
		}
		fn >>= 1
		sn >>= 1
	}
	if sn != 0 {
		return fmt.Errorf("%w: the proof is shorter than the tree is deep", ErrProofMismatch)
	}
	if !bytes.Equal(r[:], root[:]) {
		return ErrProofMismatch
	}
	return nil
}

// isHexHash reports whether s is a hash as DESIGN.md §3 writes it: 64
// lowercase hex digits.
func isHexHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
