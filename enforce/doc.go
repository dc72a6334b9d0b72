// Package enforce makes Talos's pure enforcement decisions: it classifies a
// tool call against the pinned tool registry and applies the document
// rules of REG 9.2.1-C (pointers, encodings, sizes, hashes), answering allow
// or deny with every reason found.
//
// Around that core:
//   - State is the incident state event-sourced from TALOS_CONTROL (kill
//     switches, quarantines, revocations, published and pinned registries),
//     applied copy-on-write and swapped atomically under the Decider.
//   - A reused correlation_id is denied (REPLAY) by the call ledger's
//     first-writer-wins claim, with ReplayCache, a bounded local LRU of
//     pair owners, in front of it.
//   - Authorizer is CP-PA1's authorize(capability, tool, method,
//     request_hash): capability chains, delegations, scopes and the sender
//     signature, checked per request; IssueCapability, Delegate,
//     ExtendChain and SignEnvelope make what it verifies, and InspectChain
//     describes a chain and its verdict for a person.
//   - Preflight, Policy and RateLimiter are CSP MUST 7: input_schema,
//     sizes, path confinement (PathEscapes), allow rules and rate limits.
//   - CallLedger (implemented on NATS KV in ingest) binds idempotency keys
//     to requests across workers and matches post events to pre decisions.
//   - Discovery is the enforcement point's half of CSP MUST 3 (and
//     CM-SUBAGENT, CM-EGRESS, CM-WRAPPER): which tools a caller (a Viewer,
//     derived from its capability chain) sees in tools/list, and the
//     refusal of a hidden tool or action, on the same tool-access rules
//     (Protected, NetworkOutbound, SubagentAccess) the workers apply.
//   - The Decider builds each call's ToolCallEvent (UTS FR-EVT-007)
//     from payloads redacted by enforce/redact, hashed after redaction.
//
// It does no I/O beyond reading registry and policy files at construction
// (and the stores it is given) and imports no NATS or ClickHouse client;
// callers feed it envelopes parsed by schemas.ParseToolCall and turn its
// Decided into receipts and events.
package enforce
