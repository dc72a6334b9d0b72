// Package ingest is talosd's JetStream pipeline: it creates the three
// streams, runs the enforce worker loop (fetch a call, decide, seal a
// receipt into a hash chain, store it in TALOS_AUDIT, answer the
// enforcement point, ack) and the sink loop (fetch audit records, write
// them to ClickHouse in bounded batches, ack only after the insert
// returned), and composes talosd's roles: NewEnforceRole (a worker with its
// control follower and heartbeat, the Enforcer, over the shared call
// ledger and rate counters) and NewControlRole (the control plane), each
// on hash chains named anew at every start (NewWorkerChains,
// NewControlChain). DaemonConnOptions and TuneGC set up the process.
//
// The parts it composes are packages of their own: ingest/control (the
// control plane, follower and heartbeats), ingest/kv (the KV stores),
// ingest/checkpoint (chain checkpoints) and ingest/retry (the retry of
// evidence writes). The enforcement-point library is ingest/ep; it does not
// import this package.
//
// The loops get decisions through small interfaces (Decider,
// StatefulDecider) and the database through Writer, so they know nothing
// of enforcement rules or of ClickHouse.
//
// Shutdown order: cancel the context given to Run; the fetch loops stop
// taking new messages, in-flight messages finish or are left un-acked (they
// are redelivered after AckWait), then Run returns. Close the NATS
// connection only after Run has returned.
package ingest
