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

// trustedSigners are the keys whose control events this process applies
// and whose receipts its dashboard trusts: its own signing key (key, nil
// without one) and --trusted-keys (the other talosd instances').
func trustedSigners(f *Flags, key *receipts.PrivateKey) (verify.KeySet, error) {
	keys, err := verify.LoadKeys(f.TrustedKeys...)
	if err != nil {
		return nil, fmt.Errorf("trusted keys: %w", err)
	}
	if key != nil {
		keys.Add(key.Public())
	}
	return keys, nil
}

// workerID names this process's enforce worker in heartbeats: the instance
// name as a subject token.
func workerID(f *Flags) string { return ingest.InstanceToken(f.instance()) }

// startControl prepares the control role (ingest.NewControlRole) from
// --responder-keys, --control-skew and the checkpoint settings, sharing the
// call ledger and enforcement state of this process's enforce role (en,
// nil without one), its metrics in metrics.
func startControl(ctx context.Context, f *Flags, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream, c *core, en *ingest.EnforceRole, metrics prometheus.Registerer) (func(context.Context) error, error) {
	responders, err := verify.LoadKeys(f.ResponderKeys...)
	if err != nil {
		return nil, fmt.Errorf("responder keys: %w", err)
	}
	if len(responders) == 0 {
		log.Warn("no --responder-keys: every control command will be refused (CTL_UNTRUSTED_KEY); create one with 'talosctl keys gen --out responder' and pass --responder-keys responder.pub")
	}
	return ingest.NewControlRole(ctx, nc, js, ingest.ControlRoleOptions{
		Instance: f.instance(), Key: c.key, Engine: c.engine, Signers: c.signers, ResponderKeys: responders,
		Skew: f.ControlSkew, Checkpoints: f.checkpoints(), Ledger: f.ledgerOptions(), Enforce: en, Metrics: metrics, Logger: log,
	})
}
