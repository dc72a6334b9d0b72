package control

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// ControlPlaneOptions configure NewControlPlane.
type ControlPlaneOptions struct {
	// Chain signs the control receipts (see ControlOptions.Chain). Required.
	Chain *receipts.Chain
	// Source is the CloudEvent source of the control receipts.
	Source string
	// ResponderKeys are the keys whose signed commands are accepted; none
	// refuses every command (CTL_UNTRUSTED_KEY).
	ResponderKeys verify.KeySet
	// Skew bounds a command's issued_at against this clock.
	Skew time.Duration
	// Checkpoints are the control chain's checkpoint settings.
	Checkpoints checkpoint.Options
	// RefusalLimits and Metrics are ControlOptions'.
	RefusalLimits RefusalLimits
	Metrics       prometheus.Registerer
	// Ledger is the shared call ledger: approve and reject must name a call
	// awaiting approval, and it is the control service's replay store.
	// Required.
	Ledger *kv.Ledger
	// State and Follower are the enforcement state of this process's
	// enforce worker and the follower that keeps it current. When Follower
	// is nil, the control plane runs a follower of its own over a decider
	// of Engine, trusting Signers' control events.
	State    func() *enforce.State
	Follower *ControlFollower
	Engine   *enforce.Engine
	Signers  verify.KeySet
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

var _ ReplayAdmin = (*kv.Ledger)(nil)

// StatePrecheck judges a mutating command against the enforcement state
// (enforce.State.Precheck) and, for an approve or reject, the call ledger
// (enforce.State.AwaitsApproval), whose call it records as the target.
func StatePrecheck(state func() *enforce.State, ledger enforce.CallLedger) func(*schemas.ControlCommand) Verdict {
	return func(c *schemas.ControlCommand) Verdict {
		st := state()
		if code, detail := st.Precheck(c); code != "" {
			return Verdict{Code: code, Detail: detail}
		}
		target, code, detail := st.AwaitsApproval(ledger, c)
		return Verdict{Code: code, Detail: detail, Target: target}
	}
}

// PrecheckWait bounds how long a control command's precheck waits for the
// follower to apply the control events before it.
const PrecheckWait = 5 * time.Second

// NewControlPlane prepares the control role: the control service answering
// talos.ctl.>, whose prechecks consult the enforcement state (once the
// follower has applied every event before the command) and then the call
// ledger; list and show read the same state; and the live-worker watcher
// for status. The returned run owns every goroutine it starts: the
// follower of its own, if any, and the service; it returns once both have
// stopped, after ctx ends.
func NewControlPlane(nc *nats.Conn, js jetstream.JetStream, o ControlPlaneOptions) (run func(context.Context) error, err error) {
	if o.Ledger == nil {
		return nil, errors.New("ingest: control plane needs the call ledger")
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	state, follower := o.State, o.Follower
	var runFollower func(context.Context) error
	if follower == nil {
		holder, err := enforce.NewDecider(o.Engine, enforce.DeciderOptions{})
		if err != nil {
			return nil, err
		}
		if follower, err = NewControlFollower(js, holder, FollowerOptions{Keys: o.Signers, Logger: log}); err != nil {
			return nil, err
		}
		state, runFollower = holder.State, follower.Run
	}
	watch, err := NewStatusWatcher(nc)
	if err != nil {
		return nil, err
	}
	ledger := o.Ledger
	svc, err := NewControlService(nc, js, ControlOptions{
		Chain:         o.Chain,
		Source:        o.Source,
		ResponderKeys: o.ResponderKeys,
		Skew:          o.Skew,
		Checkpoints:   o.Checkpoints,
		RefusalLimits: o.RefusalLimits,
		Metrics:       o.Metrics,
		Status:        watch,
		Logger:        log,
		Hooks: ControlHooks{
			Precheck: follower.Precheck(StatePrecheck(state, ledger), PrecheckWait),
			View:     func() schemas.IncidentView { return state().View() },
			Replay:   ledger,
		},
	})
	if err != nil {
		watch.Close()
		return nil, err
	}
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
