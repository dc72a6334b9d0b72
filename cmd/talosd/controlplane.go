package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
)

// trustedSigners are the keys whose control events this process applies:
// its own signing key and --trusted-keys (the other talosd instances').
func trustedSigners(f *Flags, key *receipts.PrivateKey) (verify.KeySet, error) {
	keys := verify.KeySet{}
	if len(f.TrustedKeys) > 0 {
		var err error
		if keys, err = verify.LoadTrustedKeys(f.TrustedKeys...); err != nil {
			return nil, fmt.Errorf("trusted keys: %w", err)
		}
	}
	keys.Add(key.Public())
	return keys, nil
}

// workerID names this process's enforce worker in heartbeats: the instance
// name as a subject token.
func workerID(f *Flags) string { return ingest.InstanceToken(f.instance()) }

func registerEnforceMetrics(reg *prometheus.Registry, e *ingest.Enforcer) {
	w, fol := e.Worker(), e.Follower()
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "talos_enforce_calls_total", Help: "Calls decided and acked by this worker.",
		}, func() float64 { return float64(w.Handled()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "talos_control_applied_seq", Help: "Last TALOS_CONTROL sequence this worker applied.",
		}, func() float64 { return float64(fol.Applied()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "talos_control_lag", Help: "Control events known but not yet applied by this worker.",
		}, func() float64 { return float64(fol.Last() - min(fol.Last(), fol.Applied())) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "talos_control_rejected_total", Help: "Control events this worker refused to apply (bad signature or sequence).",
		}, func() float64 { return float64(fol.Rejected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "talos_control_caught_up", Help: "1 once the worker has replayed TALOS_CONTROL and decides calls.",
		}, func() float64 {
			if fol.CaughtUp() {
				return 1
			}
			return 0
		}),
	)
}

// startControl prepares the control role (ingest.NewControlPlane) from
// the flags: --responder-keys, --control-skew, the checkpoint settings, the
// shared call ledger (the enforce role's, or one opened the same way), and
// the enforcement state of this process's worker (en, nil without the
// enforce role).
func startControl(ctx context.Context, f *Flags, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream, c *core, en *enforceRole) (func(context.Context) error, error) {
	responders := verify.KeySet{}
	if len(f.ResponderKeys) > 0 {
		var err error
		if responders, err = verify.LoadTrustedKeys(f.ResponderKeys...); err != nil {
			return nil, fmt.Errorf("responder keys: %w", err)
		}
	}
	if len(responders) == 0 {
		log.Warn("no --responder-keys: every control command will be refused (CTL_UNTRUSTED_KEY); create one with 'talosctl keys gen --out responder' and pass --responder-keys responder.pub")
	}
	o := ingest.ControlPlaneOptions{
		Source:        "talos://control/" + f.instance(),
		ResponderKeys: responders,
		Skew:          f.ControlSkew,
		Checkpoints:   f.checkpoints(),
		Engine:        c.engine,
		Signers:       c.signers,
		Logger:        log,
	}
	if en != nil {
		o.Ledger, o.State, o.Follower = en.ledger, en.state, en.follower
	} else {
		// The ledger every worker claims pairs and records decisions in
		// (same bucket and options as the enforce role's).
		var err error
		if o.Ledger, err = newLedger(ctx, f, js); err != nil {
			return nil, fmt.Errorf("call ledger: %w", err)
		}
	}
	o.Chain = ingest.NewControlChain(workerID(f), c.key)
	run, err := ingest.NewControlPlane(nc, js, o)
	if err != nil {
		return nil, err
	}
	log.Info("control role started", "chain", o.Chain.ID(), "responder_keys", len(responders), "replay_window", o.Ledger.Window())
	return run, nil
}
