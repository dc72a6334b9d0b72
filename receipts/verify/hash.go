package verify

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/schemas/jsonkit"
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
			return "", fmt.Errorf("verify: receipt hash: %w", cerr)
		}
		if sum, err = hashUnsigned(canon); err != nil {
			return "", fmt.Errorf("verify: receipt hash: %w", err)
		}
	}
	return hex.EncodeToString(sum[:]), nil
}

// signatureKey is the data member a signature is written to.
const signatureKey = "signature"

var (
	errNoData      = errors.New("no data object")
	errNoSignature = errors.New("unsigned: no data.signature")
)

// signedParts finds data and data.signature in canonical event bytes and
// hashes the event without the signature: the receipt hash preimage of
// DESIGN.md §3. The verifier and ReceiptHash share it.
func signedParts(canon []byte) (data, sig jsonkit.Member, sum [32]byte, err error) {
	data, found, _, err := jsonkit.FindMember(canon, 0, "data")
	if err != nil {
		return jsonkit.Member{}, jsonkit.Member{}, sum, err
	}
	if !found || canon[data.ValStart] != '{' {
		return jsonkit.Member{}, jsonkit.Member{}, sum, errNoData
	}
	sig, found, _, err = jsonkit.FindMember(canon, data.ValStart, signatureKey)
	if err != nil {
		return jsonkit.Member{}, jsonkit.Member{}, sum, err
	}
	if !found {
		return jsonkit.Member{}, jsonkit.Member{}, sum, errNoSignature
	}
	return data, sig, hashWithout(canon, sig), nil
}

// hashWithout is sha256(jsonkit.RemoveMember(b, m)), without the copy.
func hashWithout(b []byte, m jsonkit.Member) (sum [32]byte) {
	start, end := m.Without(b)
	h := sha256.New()
	h.Write(b[:start])
	h.Write(b[end:])
	h.Sum(sum[:0])
	return sum
}

// hashUnsigned is the receipt hash of canonical event bytes.
func hashUnsigned(canon []byte) ([32]byte, error) {
	_, _, sum, err := signedParts(canon)
	return sum, err
}
