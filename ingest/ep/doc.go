// Package ep is the enforcement-point library: what a process that stands
// between an agent and its tools needs to have each call decided by Talos.
// NewCall, CallSpec, SignedPost and PostOf build envelopes; HashRequest
// sets their request_hash and CallSigner attaches a capability chain and
// signs them (CP-SFC); Client publishes a call to TALOS_CALLS on its own
// enforcement point's subjects and waits for its decision, the one whose
// receipt names the request it sent, asking TALOS_DECISIONS again for one
// it missed (ErrNoDecision once none is stored by the deadline, and
// ErrDuplicateCall for a Nats-Msg-Id another message holds: deny, fail
// closed); Outbox
// delivers post events until JetStream acknowledges them (OpenOutbox: each
// kept in a spool directory until then, so a crash loses none); Approvals
// follows the approve and reject events of TALOS_CONTROL and hands each
// that talosd signed to the call parked on it.
//
// talosctl call, talosctl bench (ingest/loadgen), talosd dev's demo
// (ingest/demo) and the MCP gateway (ingest/gateway) all use it. It imports
// no other ingest package: an enforcement point links none of the daemon.
package ep
