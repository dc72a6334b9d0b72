package receipts

import (
	"crypto/ed25519"

	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// Signing is RFC 8032 Ed25519, deterministic: the bytes equal
// crypto/ed25519.Sign's, computed on curve25519-voi as verify.Verify checks
// them (see that package for verification).

// Sign signs message with key. It panics if key is not
// ed25519.PrivateKeySize bytes long, as crypto/ed25519.Sign does.
func Sign(key ed25519.PrivateKey, message []byte) []byte {
	return voi.Sign(voi.PrivateKey(key), message)
}
