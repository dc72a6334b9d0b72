// Package tlog is the deployment's transparency log (DESIGN.md §3, "The
// transparency log"): one append-only Merkle log, stored with tessera's
// POSIX driver under <data-dir>/tlog, whose checkpoints are C2SP
// tlog-checkpoint signed notes under the log key. Its parts:
//
//   - the log itself (Open): the storage, the log key and its origin;
//   - the log role (Role): it appends every signed record of TALOS_AUDIT —
//     decision, effect and control receipts and ToolCallEvents, not the
//     per-chain checkpoints — once, in stream order, and announces where
//     each went on schemas.SubjectLogIndex;
//   - the tiles served read-only as C2SP tlog-tiles (Handler).
//
// It depends on no other project package but schemas, ingest/retry,
// receipts/logproof (the stand-in of an oversize record) and the
// JetStream client; checking the log needs none of it (README, "The
// transparency log"; receipts/logproof and query.VerifyLog are
// talosctl's checks).
package tlog
