// Package enforce makes Talos's pure enforcement decisions: it classifies a
// tool call against the pinned tool registry and applies seed 000's document
// rules (pointers, encodings, sizes, hashes), answering allow or deny with
// every reason found. Its State is the incident state event-sourced from
// TALOS_CONTROL (kill switches, quarantines, revocations, published and
// pinned registries), applied copy-on-write and swapped atomically under
// the Decider; its ReplayGuard denies a reused correlation_id (REPLAY) with
// a bounded local LRU in front of a shared ReplayStore. It does no I/O beyond reading registry files at
// construction and imports no NATS or ClickHouse client; callers feed it
// envelopes parsed by schemas.ParseToolCall and turn its Outcome into
// receipts.
package enforce
