package receipts

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/gowebpki/jcs"
)

// ReceiptHash returns the receipt hash of a signed event: lowercase hex
// sha256 of its canonical form with data.signature removed (DESIGN.md §3).
//
// Events are published in canonical form, so the fast path hashes raw
// without re-encoding it; raw that the canonical scanner cannot walk is
// canonicalized first. ReceiptHash checks no signature: use it for
// projections (the receipt_hash column), and VerifyEvent for trust.
func ReceiptHash(raw []byte) (string, error) {
	sum, err := hashUnsigned(raw)
	if err != nil {
		canon, cerr := jcs.Transform(raw)
		if cerr != nil {
			return "", fmt.Errorf("receipts: receipt hash: %w", cerr)
		}
		if sum, err = hashUnsigned(canon); err != nil {
			return "", fmt.Errorf("receipts: receipt hash: %w", err)
		}
	}
	return hex.EncodeToString(sum[:]), nil
}

// hashUnsigned hashes canonical event bytes without data.signature.
func hashUnsigned(canon []byte) ([32]byte, error) {
	dm, found, _, err := findMember(canon, 0, "data")
	if err != nil || !found || canon[dm.valStart] != '{' {
		return [32]byte{}, errNotCanonical
	}
	sm, found, _, err := findMember(canon, dm.valStart, "signature")
	if err != nil {
		return [32]byte{}, err
	}
	if !found {
		return [32]byte{}, fmt.Errorf("unsigned: no data.signature")
	}
	return sha256.Sum256(removeMember(canon, sm)), nil
}
