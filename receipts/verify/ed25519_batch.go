package verify

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"hash"

	"github.com/oasisprotocol/curve25519-voi/curve"
	"github.com/oasisprotocol/curve25519-voi/curve/scalar"
	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// batchChunk is how many signatures one batch equation checks.
const batchChunk = 256

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
	var (
		eq batchEquation
		bv *voi.BatchVerifier
	)
	for start := 0; start < len(checks); start += batchChunk {
		chunk := checks[start:min(start+batchChunk, len(checks))]
		var holds bool
		if len(chunk) >= minBatch {
			var summed bool
			if holds, summed = eq.check(chunk, len(chunk)/4); !summed {
				if bv == nil {
					bv = voi.NewBatchVerifierWithCapacity(batchChunk)
				}
				holds = voiHolds(bv.Reset(), chunk)
			}
		}
		if holds {
			for i := range chunk {
				ok[start+i] = true
			}
			continue
		}
		for i, c := range chunk {
			ok[start+i] = Verify(c.Pub, c.Message, c.Sig)
		}
	}
	return ok
}

// voiHolds reports whether the batch equation of chunk holds, by
// curve25519-voi's batch verifier (bv, reset).
func voiHolds(bv *voi.BatchVerifier, chunk []SigCheck) bool {
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

// batchEquation checks the cofactored batch equation of RFC 8032 (§5.1.7,
// and FIPS 186-5's) for a chunk of signatures:
//
//	[8]( [-Σ z_i·s_i]B + Σ [z_i]R_i + Σ [z_i·k_i]A_i ) = 0
//
// with z_i random 128-bit scalars and k_i = SHA-512(R_i || A_i || M_i).
// The terms of one key are summed into one, [Σ z_i·k_i]A: the records a
// verifier checks are signed by a few keys, so the multiscalar
// multiplication has about n+2 points where curve25519-voi's batch
// verifier (which this follows, signature checks included) has 2n+1.
// Its buffers are reused from chunk to chunk.
type batchEquation struct {
	rs      []curve.EdwardsPoint // R_i
	as      []curve.EdwardsPoint // the distinct keys
	keys    [][]byte             // their encodings, in the order of as
	keyOf   []int                // each signature's key, an index of keys
	zs      []scalar.Scalar      // z_i: R_i's coefficients
	acoef   []scalar.Scalar      // the keys' coefficients
	bcoef   scalar.Scalar
	points  []*curve.EdwardsPoint
	scalars []*scalar.Scalar
	random  []byte
	h       hash.Hash
}

// check decides the batch equation of chunk, each key's terms summed, if
// its signatures are by at most maxKeys keys; otherwise it decides nothing
// (summed false). VerifyAllBatch allows a quarter as many keys as
// signatures: beyond that curve25519-voi's verifier, with its precomputed
// table of each key, is cheaper (BenchmarkBatchEquation, 256 signatures:
// 8.8 against 13.6 µs a signature by one key, 10.1 against 13.7 by four,
// 17.5 against 13.7 by 256 keys). holds is false also when a signature or
// key cannot be decoded, or a signature's s is not below the group order
// or its R is not canonically encoded.
func (e *batchEquation) check(chunk []SigCheck, maxKeys int) (holds, summed bool) {
	n := len(chunk)
	if cap(e.rs) < n {
		e.rs = make([]curve.EdwardsPoint, n)
		e.as = make([]curve.EdwardsPoint, n)
		e.keyOf = make([]int, n)
		e.zs = make([]scalar.Scalar, n)
		e.acoef = make([]scalar.Scalar, n)
		e.points = make([]*curve.EdwardsPoint, 0, 2*n+1)
		e.scalars = make([]*scalar.Scalar, 0, 2*n+1)
		e.random = make([]byte, 16*n)
		e.h = sha512.New()
	}
	if !e.index(chunk, maxKeys) {
		return false, false
	}
	rs, as, zs, acoef := e.rs[:n], e.as[:n], e.zs[:n], e.acoef[:n]
	var enc curve.CompressedEdwardsY
	// Each key canonical and on the curve (small-order keys are allowed,
	// as in the cofactored equation).
	for j, pub := range e.keys {
		if len(pub) != ed25519.PublicKeySize {
			return false, true
		}
		if _, err := enc.SetBytes(pub); err != nil || !enc.IsCanonicalVartime() {
			return false, true
		}
		if _, err := as[j].SetCompressedY(&enc); err != nil {
			return false, true
		}
		acoef[j].Zero()
	}
	_, _ = rand.Read(e.random[:16*n]) // never fails (crypto/rand)
	e.bcoef.Zero()
	var (
		s, k, t scalar.Scalar
		wide    [64]byte
		z       [32]byte
	)
	for i, c := range chunk {
		if len(c.Sig) != ed25519.SignatureSize {
			return false, true
		}
		// s in [0, L) (no malleable encodings); R canonical and on the curve.
		if !scalar.ScMinimalVartime(c.Sig[32:]) {
			return false, true
		}
		if _, err := s.SetBytesModOrder(c.Sig[32:]); err != nil {
			return false, true
		}
		if _, err := enc.SetBytes(c.Sig[:32]); err != nil || !enc.IsCanonicalVartime() {
			return false, true
		}
		if _, err := rs[i].SetCompressedY(&enc); err != nil {
			return false, true
		}
		e.h.Reset()
		e.h.Write(c.Sig[:32])
		e.h.Write(c.Pub)
		e.h.Write(c.Message)
		if _, err := k.SetBytesModOrderWide(e.h.Sum(wide[:0])); err != nil {
			return false, true
		}
		copy(z[:16], e.random[16*i:16*i+16]) // z[16:] stays zero: z < 2^128
		if _, err := zs[i].SetBytesModOrder(z[:]); err != nil {
			return false, true
		}
		e.bcoef.Add(&e.bcoef, t.Mul(&zs[i], &s))
		j := e.keyOf[i]
		acoef[j].Add(&acoef[j], t.Mul(&zs[i], &k))
	}
	e.bcoef.Neg(&e.bcoef)
	e.points = append(e.points[:0], curve.ED25519_BASEPOINT_POINT)
	e.scalars = append(e.scalars[:0], &e.bcoef)
	for i := range rs {
		e.points = append(e.points, &rs[i])
		e.scalars = append(e.scalars, &zs[i])
	}
	for j := range e.keys {
		e.points = append(e.points, &as[j])
		e.scalars = append(e.scalars, &acoef[j])
	}
	var sum curve.EdwardsPoint
	return sum.MultiscalarMulVartime(e.scalars, e.points).IsSmallOrder(), true
}

// index finds chunk's distinct keys (e.keys) and each signature's among
// them (e.keyOf), searching them in turn; false if there are more than
// maxKeys.
func (e *batchEquation) index(chunk []SigCheck, maxKeys int) bool {
	e.keys = e.keys[:0]
next:
	for i, c := range chunk {
		for j, k := range e.keys {
			if string(k) == string(c.Pub) {
				e.keyOf[i] = j
				continue next
			}
		}
		if len(e.keys) == maxKeys {
			return false
		}
		e.keyOf[i] = len(e.keys)
		e.keys = append(e.keys, c.Pub)
	}
	return true
}
