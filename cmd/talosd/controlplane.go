package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// trustedSigners are the keys whose control events this process applies:
// its own signing key and --trusted-keys (the other talosd instances').
func trustedSigners(f *Flags, key *receipts.PrivateKey) (receipts.KeySet, error) {
	keys := receipts.KeySet{}
	if len(f.TrustedKeys) > 0 {
		var err error
		if keys, err = receipts.LoadTrustedKeys(f.TrustedKeys...); err != nil {
			return nil, fmt.Errorf("trusted keys: %w", err)
		}
	}
	keys.Add(key.Public())
	return keys, nil
}

// workerID names this process's enforce worker in heartbeats: the instance
// name as a subject token.
func workerID(f *Flags) string { return chainPrefix(f.instance()) }

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

// startControl prepares the control role: the control service answering
// talos.ctl.>, with the enforcement state of this process's worker (or,
// without the enforce role, a follower of its own) for list/show and
// prechecks, the shared call ledger (approve and reject must name a call
// awaiting approval), the shared replay store, and the live-worker
// watcher. The returned run owns every goroutine it starts.
func startControl(ctx context.Context, f *Flags, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream,
	key *receipts.PrivateKey, engine *enforce.Engine, signers receipts.KeySet, ledger *ingest.Ledger,
	state func() *enforce.State, follower *ingest.ControlFollower) (func(context.Context) error, error) {
	responders := receipts.KeySet{}
	if len(f.ResponderKeys) > 0 {
		var err error
		if responders, err = receipts.LoadTrustedKeys(f.ResponderKeys...); err != nil {
			return nil, fmt.Errorf("responder keys: %w", err)
		}
	}
	if len(responders) == 0 {
		log.Warn("no --responder-keys: every control command will be refused (CTL_UNTRUSTED_KEY); create one with 'talosctl keys gen --out responder' and pass --responder-keys responder.pub")
	}
	// The ledger every worker claims pairs and records decisions in (same
	// bucket and options as the enforce role's).
	if ledger == nil {
		var err error
		if ledger, err = newLedger(ctx, f, js); err != nil {
			return nil, fmt.Errorf("call ledger: %w", err)
		}
	}
	var runFollower func(context.Context) error
	if follower == nil {
		holder, err := enforce.NewDecider(engine, enforce.DeciderOptions{})
		if err != nil {
			return nil, err
		}
		if follower, err = ingest.NewControlFollower(js, holder, ingest.FollowerOptions{Keys: signers, Logger: log}); err != nil {
			return nil, err
		}
		state, runFollower = holder.State, follower.Run
	}
	watch, err := ingest.NewStatusWatcher(nc)
	if err != nil {
		return nil, err
	}
	boot := make([]byte, 4)
	_, _ = rand.Read(boot)
	chainID := chainPrefix(f.instance()) + "-control-" + hex.EncodeToString(boot)
	svc, err := ingest.NewControlService(nc, js, ingest.ControlOptions{
		Chain:         receipts.NewChain(chainID, key),
		Source:        "talos://control/" + f.instance(),
		ResponderKeys: responders,
		Skew:          f.ControlSkew,
		Checkpoints:   f.checkpoints(),
		Status:        watch,
		Logger:        log,
		Hooks: ingest.ControlHooks{
			Precheck: follower.Precheck(func(c *schemas.ControlCommand) (string, string) {
				if code, detail := state().Precheck(c); code != "" {
					return code, detail
				}
				return enforce.AwaitsApproval(ledger, c)
			}, 5*time.Second),
			View:   func() schemas.IncidentView { return state().View() },
			Replay: ledger,
		},
	})
	if err != nil {
		watch.Close()
		return nil, err
	}
	log.Info("control role started", "chain", chainID, "responder_keys", len(responders), "replay_window", ledger.Window())
	return func(ctx context.Context) error {
		defer watch.Close()
		var wg sync.WaitGroup
		var ferr error
		if runFollower != nil {
			wg.Add(1)
			go func() { defer wg.Done(); ferr = runFollower(ctx) }()
		}
		err := svc.Run(ctx)
		wg.Wait()
		return errors.Join(err, ferr)
	}, nil
}
