package verify

import (
	"crypto/ed25519"

	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// batchChunk is how many signatures one batch equation checks: below
// curve25519-voi's limit (94) for using the precomputed keys, where the
// cost per signature is lowest.
const batchChunk = 64

// minBatch is the smallest chunk worth a batch equation.
const minBatch = 4

// batchOptions is the cofactored verification RFC 8032 and FIPS 186-5
// specify, the equation batch verification checks.
var batchOptions = &voi.Options{Verify: voi.VerifyOptionsFIPS_186_5}

// VerifyAllBatch verifies every check, like VerifyAll, by batch
// verification: one random linear combination of the cofactored Ed25519
// equations of up to batchChunk signatures at a time. A chunk whose
// combination fails is verified one signature at a time with Verify's
// rules, so a bad signature is found exactly as VerifyAll finds it.
//
// What it accepts is what Verify accepts plus, in a chunk whose equation
// holds, a signature that satisfies only the cofactored equation: one
// whose R (or key) carries a small-order component. Only the holder of
// the private key can make such a signature; crypto/ed25519 rejects it.
// Callers that must accept exactly what crypto/ed25519 accepts use
// VerifyAll.
func VerifyAllBatch(checks []SigCheck) []bool {
	ok := make([]bool, len(checks))
	var bv *voi.BatchVerifier
	for start := 0; start < len(checks); start += batchChunk {
		chunk := checks[start:min(start+batchChunk, len(checks))]
		if len(chunk) >= minBatch {
			if bv == nil {
				bv = voi.NewBatchVerifierWithCapacity(batchChunk)
			}
			if batchHolds(bv.Reset(), chunk) {
				for i := range chunk {
					ok[start+i] = true
				}
				continue
			}
		}
		for i, c := range chunk {
			ok[start+i] = Verify(c.Pub, c.Message, c.Sig)
		}
	}
	return ok
}

// batchHolds reports whether the batch equation of chunk holds.
func batchHolds(bv *voi.BatchVerifier, chunk []SigCheck) bool {
	for _, c := range chunk {
		if len(c.Pub) != ed25519.PublicKeySize || len(c.Sig) != ed25519.SignatureSize {
			return false
		}
		x := expanded(c.Pub)
		if x == nil {
			return false
		}
		bv.AddExpandedWithOptions(x, c.Message, c.Sig, batchOptions)
	}
	return bv.VerifyBatchOnly(nil)
}
