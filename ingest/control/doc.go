// Package control is Talos's control plane. Responders send signed control
// commands (kill switches, quarantines, revocations, registry changes,
// approvals, replay administration and the read verbs) on talos.ctl.>;
// ControlService verifies each one, records a signed control receipt for
// it in TALOS_AUDIT on its own hash chain, and appends accepted mutations
// to TALOS_CONTROL. NewControlPlane composes the service with its
// prechecks against the enforcement state and the call ledger (ingest/kv).
//
// The workers' side: ControlFollower applies TALOS_CONTROL to a worker's
// enforcement state, verifying every event, and Heartbeat publishes which
// control seq the worker enforces. StatusWatcher follows those heartbeats
// to know the live workers; ControlClient (what talosctl uses) sends
// commands and, with DoAndWait, waits until every live worker has applied
// one (Propagation); WriteStateEntries and its siblings print replies as
// text.
package control
