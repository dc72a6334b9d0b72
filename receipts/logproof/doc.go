// Package logproof checks what the deployment's transparency log says,
// with nothing but public keys (DESIGN.md §3, "The transparency log" and
// "Verification"): a checkpoint's signed note against the log's verifier
// key (OpenCheckpoint), its cosignatures against a witness policy
// (Policy), the stand-in entry of an oversize record (StandIn), and the
// self-contained proof bundle of one record (Bundle, VerifyBundle).
//
// It reads no network and no database: the log's tiles are read by the
// caller (query.VerifyLog, talosctl verify), and the Merkle and note
// checks are golang.org/x/mod's sumdb/note and sumdb/tlog, tessera's
// witness policy and torchwood's cosignature verifier.
package logproof
