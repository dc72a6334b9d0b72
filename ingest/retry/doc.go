// Package retry is how Talos retries a write it must not drop: a Policy
// backs off from First to Max and, while a JetStream message waits on the
// write, tells JetStream it is still in progress; Stop marks an error that
// retrying cannot fix. The enforce worker and the sink use it for their
// evidence writes, the checkpoint publisher for checkpoints, and talosd
// (Do) to wait at start for NATS or ClickHouse to answer. Setup waits for
// a NATS cluster that is electing leaders or forming while a stream, a KV
// bucket or a consumer is created or bound, and tells a misconfiguration,
// returned at once, from that.
package retry
