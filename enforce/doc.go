// Package enforce makes Talos's pure enforcement decisions: it classifies a
// tool call against the pinned tool registry and applies seed 000's document
// rules (pointers, encodings, sizes, hashes), answering allow or deny with
// every reason found. It does no I/O beyond reading registry files at
// construction and imports no NATS or ClickHouse client; callers feed it
// envelopes parsed by schemas.ParseToolCall and turn its Outcome into
// receipts.
package enforce
