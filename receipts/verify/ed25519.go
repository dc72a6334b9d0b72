package verify

import (
	"crypto/ed25519"
	"sync"

	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// Ed25519 signing and verification for every signature Talos makes or
// checks (receipts, events, checkpoints, control commands, sender
// signatures, capabilities).
//
// Signing is RFC 8032 Ed25519, deterministic: the bytes equal
// crypto/ed25519.Sign's. Verification accepts exactly what
// crypto/ed25519.Verify accepts (the cofactorless equation over the
// signature's R as sent). Both run on curve25519-voi, which is measurably
// faster on this project's machines than the standard library (see
// BENCHMARKS.md, "Ed25519"), and verification keeps each public key's
// precomputed form, since a deployment verifies many signatures by few
// keys (its signers, its agents).

// stdlibOptions makes voi verify as crypto/ed25519 does.
var stdlibOptions = &voi.Options{Verify: voi.VerifyOptionsStdLib}

// Verify reports whether sig is pub's signature of message, with the
// standard library's rules. A malformed key or signature is false.
func Verify(pub ed25519.PublicKey, message, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	if x := expanded(pub); x != nil {
		return voi.VerifyExpandedWithOptions(x, message, sig, stdlibOptions)
	}
	return ed25519.Verify(pub, message, sig)
}

// SigCheck is one signature to verify: Sig over Message by Pub.
type SigCheck struct {
	Pub     ed25519.PublicKey
	Message []byte
	Sig     []byte
}

// VerifyAll verifies every check and reports, per check, whether it holds
// (Verify's rules). It is the entry point for callers that verify many
// signatures at once, so that the implementation may share work between
// them; today it verifies one at a time with the precomputed keys.
func VerifyAll(checks []SigCheck) []bool {
	ok := make([]bool, len(checks))
	for i, c := range checks {
		ok[i] = Verify(c.Pub, c.Message, c.Sig)
	}
	return ok
}

// maxExpandedKeys bounds the precomputed keys kept; beyond it the cache is
// dropped and rebuilt (a deployment has few signers; this only bounds a
// flood of distinct keys).
const maxExpandedKeys = 4096

var expandedKeys sync.Map // string(pub) -> *voi.ExpandedPublicKey
var expandedCount struct {
	sync.Mutex
	n int
}

// expanded is pub's precomputed form, or nil if pub does not decode (the
// caller then lets crypto/ed25519 reject or accept it as it would).
func expanded(pub ed25519.PublicKey) *voi.ExpandedPublicKey {
	if x, ok := expandedKeys.Load(string(pub)); ok {
		return x.(*voi.ExpandedPublicKey)
	}
	x, err := voi.NewExpandedPublicKey(voi.PublicKey(pub))
	if err != nil {
		return nil
	}
	expandedCount.Lock()
	if expandedCount.n >= maxExpandedKeys {
		expandedKeys.Clear()
		expandedCount.n = 0
	}
	expandedCount.n++
	expandedCount.Unlock()
	expandedKeys.Store(string(pub), x)
	return x
}
