// Package verify is the offline verifier of Talos receipts: what an auditor
// needs to check exported events with nothing but the events and the trusted
// public keys. It depends only on the wire types (schemas), canonical JSON
// (schemas/jsonkit) and crypto, so it can be read and audited on its own.
//
// It holds public-key sets and the reading of .pub files (KeySet, KeyID,
// LoadTrustedKeys); the receipt hash, sha256 of the canonical event without
// data.signature (ReceiptHash, DESIGN.md §3); Ed25519 verification, one at
// a time or batched (Verify, VerifyAll, VerifyAllBatch); the signed-event
// reader (VerifyEvent, VerifyEvents); chain-link and checkpoint checks over
// a stream of events (Verifier, Verifier.AddAll, SortForVerify, PlaceOf,
// ReadEvents, ScanEvents, VerifyFile, Report); and RFC 6962 Merkle trees,
// inclusion proofs and checkpoints (Tree, VerifyInclusion,
// VerifyCheckpoint, Proof, VerifyProof).
//
// Package receipts, the producer side, imports it for the pieces both
// share; it never imports receipts.
package verify
