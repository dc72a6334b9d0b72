// Package receipts is the producer side of Talos receipts: it signs,
// seals and chains them, and signs the checkpoints over them; package
// receipts/verify checks them.
//
// A receipt is a CloudEvent 1.0 in structured JSON mode whose data is a
// schemas.Receipt (or, for other signed event types, any JSON object). The
// signing rule is DESIGN.md §3:
//
//	hash = sha256(JCS(event with data.signature removed))   // the receipt hash
//	data.signature = {alg: "Ed25519", kid, sig: base64url(Ed25519(key, hash))}
//
// Ed25519 signs the 32 raw bytes of hash, not its hex form. The receipt hash
// is written as lowercase hex; it is also the next link's chain.prev_hash.
//
// The bytes this package publishes (Sealed.JSON) are themselves canonical
// (RFC 8785, written with schemas/jsonkit) and are exactly the signed bytes
// with the data.signature member inserted at its sorted position, so a
// verifier recovers the signed bytes by removing that one member.
//
// Producers: integers beyond ±2^53 cannot survive RFC 8785 (numbers are IEEE
// doubles there), so any such value MUST be carried as a JSON string;
// jsonkit.MarshalCanonical refuses larger integers rather than silently
// rounding them.
//
// The package is pure: it imports no I/O client (no NATS, no ClickHouse) and
// no enforce code. What it shares with the verifier (key ids and public-key
// sets, receipt hashes, Merkle hashing, signature checks) it takes from
// receipts/verify, never the reverse.
package receipts
