// Package ingest is Talos's JetStream plumbing: it creates the three streams,
// runs the enforce worker loop (fetch a call, decide, seal a receipt into a
// hash chain, store it in TALOS_AUDIT, answer the enforcement point, ack) and
// the sink loop (fetch audit records, write them to ClickHouse in bounded
// batches, ack only after the insert returned). It also composes the
// control plane (NewControlPlane: the control service over talos.ctl.>, its
// prechecks against the enforcement state and the call ledger) and keeps
// the state shared by workers in KV buckets (the call ledger, the rate
// counters of NewRateLimiter), and names the hash chains of a start
// (NewWorkerChains, NewControlChain: new ids at every start).
//
// It is also the enforcement-point library: Client publishes a call and
// waits for its decision, NewCall, HashRequest, CallSigner and SignedPost
// build, hash and sign envelopes, Outbox delivers post events until
// JetStream acknowledges them, and Approvals hands approve and reject
// control events to parked calls. talosctl call, talosctl bench
// (ingest/loadgen), talosd dev's demo (ingest/demo) and the MCP gateway
// (ingest/gateway) all use it.
//
// The loops get decisions and receipt signing through small interfaces
// (Decider, Sealer) and the database through Writer, so they know nothing
// of enforcement rules or of ClickHouse.
//
// Shutdown order: cancel the context given to Run; the fetch loops stop
// taking new messages, in-flight messages finish or are left un-acked (they
// are redelivered after AckWait), then Run returns. Close the NATS
// connection only after Run has returned.
package ingest
