package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
)

// EnforceRoleOptions configure NewEnforceRole: the enforce role of a
// talosd process (DESIGN.md §4). Instance, Key and Engine are required.
type EnforceRoleOptions struct {
	// Instance is the process's instance name: its worker id is
	// InstanceToken(Instance), its CloudEvent source
	// talos://enforce/<Instance>.
	Instance string
	// Key signs the receipts; Engine holds the bootstrap registry.
	Key    *receipts.PrivateKey
	Engine *enforce.Engine
	// Chains is the number of hash chains (dealt into lanes of 16, one
	// signing goroutine each); 0 means DefaultChainsPerCPU x GOMAXPROCS.
	Chains int
	// Checks are the decider's checks. NewEnforceRole fills in the shared
	// state: Checks.Ledger (the call ledger of Ledger) and, when
	// Checks.Policy has rate limits, Checks.RateLimiter (counted across
	// workers in Ledger.Replicas replicas).
	Checks enforce.DeciderOptions
	Ledger kv.LedgerOptions
	// AckWait and Checkpoints are the worker's (WorkerOptions).
	AckWait     time.Duration
	Checkpoints checkpoint.Options
	// Signers are the keys whose control events are applied.
	Signers           verify.KeySet
	HeartbeatInterval time.Duration
	// Tracing, when enabled, records each decision in the trace its
	// envelope names (WorkerOptions.Tracer).
	Tracing *tracing.Provider
	Logger  *slog.Logger
}

// ErrBadInstance is what NewEnforceRole's error wraps when the instance
// name makes no valid chain id.
var ErrBadInstance = errors.New("bad instance name")

type badInstance struct {
	instance string
	err      error
}

func (e badInstance) Error() string        { return fmt.Sprintf("instance %q: %v", e.instance, e.err) }
func (e badInstance) Is(target error) bool { return target == ErrBadInstance }

// EnforceRole is a prepared enforce role: the enforcer to Run, and what a
// control role of the same process shares with it (Share).
type EnforceRole struct {
	*Enforcer
	// WorkerID names the worker in heartbeats; ChainPrefix is the common
	// prefix of its chain ids (new at every start) and Chains their number.
	WorkerID, ChainPrefix string
	Chains                int
	ledger                *kv.Ledger
	state                 func() *enforce.State
}

// DefaultChainsPerCPU is how many hash chains an enforce worker runs per
// GOMAXPROCS unless told otherwise: 8 lanes of 16 (Worker). A lane's batch
// puts one receipt into each of its chains and waits on JetStream once for
// them all, so the lanes, not the CPU, bound a worker with too few; 8 per
// CPU keep the stack on two cores busy at saturation (BENCHMARKS.md,
// "A batch's receipts published together").
const DefaultChainsPerCPU = 128

// NewEnforceRole prepares the enforce role: its hash chains
// (NewWorkerChains), the call ledger and rate counters shared by every
// worker, the decider over o.Engine, and the enforcer. An instance name
// that makes no valid chain id is an error that names it.
func NewEnforceRole(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, o EnforceRoleOptions) (*EnforceRole, error) {
	if o.Chains <= 0 {
		o.Chains = DefaultChainsPerCPU * runtime.GOMAXPROCS(0)
	}
	id := InstanceToken(o.Instance)
	chains, base, err := NewWorkerChains(id, o.Chains, o.Key)
	if err != nil {
		return nil, badInstance{o.Instance, err}
	}
	if o.Checks.Policy != nil {
		if o.Checks.RateLimiter, err = kv.NewRateLimiter(ctx, js, o.Checks.Policy, o.Ledger.Replicas); err != nil {
			return nil, err
		}
	}
	ledger, err := kv.NewLedger(ctx, js, withLogger(o.Ledger, o.Logger))
	if err != nil {
		return nil, fmt.Errorf("call ledger: %w", err)
	}
	o.Checks.Ledger = ledger
	dec, err := enforce.NewDecider(o.Engine, o.Checks)
	if err != nil {
		return nil, err
	}
	wo := WorkerOptions{Chains: chains, Source: "talos://enforce/" + o.Instance, AckWait: o.AckWait, Checkpoints: o.Checkpoints}
	if o.Tracing.Enabled() {
		wo.Tracer = o.Tracing.Tracer()
	}
	enf, err := NewEnforcer(nc, js, dec, EnforcerOptions{
		WorkerID:          id,
		Worker:            wo,
		Keys:              o.Signers,
		HeartbeatInterval: o.HeartbeatInterval,
		RegistryDigest:    func() string { return dec.State().Registry().Digest() },
		Logger:            o.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &EnforceRole{Enforcer: enf, WorkerID: id, ChainPrefix: base, Chains: len(chains), ledger: ledger, state: dec.State}, nil
}

// CaughtUpState waits until Run has replayed TALOS_CONTROL and returns
// the role's enforcement state then: the registry it enforces
// (State.Registry) and the pin that put it in force (State.Pinned). The
// error is ctx's when ctx ends first.
func (r *EnforceRole) CaughtUpState(ctx context.Context) (*enforce.State, error) {
	if err := r.Follower().WaitCaughtUp(ctx); err != nil {
		return nil, err
	}
	return r.state(), nil
}

// ControlRoleOptions configure NewControlRole. Instance, Key and Engine
// are as for the enforce role; the rest are control.ControlPlaneOptions'.
type ControlRoleOptions struct {
	Instance      string
	Key           *receipts.PrivateKey
	Engine        *enforce.Engine
	Signers       verify.KeySet
	ResponderKeys verify.KeySet
	Skew          time.Duration
	Checkpoints   checkpoint.Options
	// Ledger opens the shared call ledger when there is no Enforce role
	// (with the options every role uses, so they open the same bucket).
	Ledger kv.LedgerOptions
	// Enforce is this process's enforce role, nil without one: the control
	// service then reads its ledger and enforcement state instead of
	// following TALOS_CONTROL itself.
	Enforce *EnforceRole
	// Metrics, if set, gets the control service's metrics.
	Metrics prometheus.Registerer
	Logger  *slog.Logger
}

// NewControlRole prepares the control role (control.NewControlPlane) on a new
// control chain (NewControlChain) and logs that it started.
func NewControlRole(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, o ControlRoleOptions) (run func(context.Context) error, err error) {
	p := control.ControlPlaneOptions{
		Chain:         NewControlChain(InstanceToken(o.Instance), o.Key),
		Source:        "talos://control/" + o.Instance,
		ResponderKeys: o.ResponderKeys,
		Skew:          o.Skew,
		Checkpoints:   o.Checkpoints,
		Engine:        o.Engine,
		Signers:       o.Signers,
		Metrics:       o.Metrics,
		Logger:        o.Logger,
	}
	if en := o.Enforce; en != nil {
		p.Ledger, p.State, p.Follower = en.ledger, en.state, en.Follower()
	} else if p.Ledger, err = kv.NewLedger(ctx, js, withLogger(o.Ledger, o.Logger)); err != nil {
		return nil, fmt.Errorf("call ledger: %w", err)
	}
	if run, err = control.NewControlPlane(nc, js, p); err != nil {
		return nil, err
	}
	if o.Logger != nil {
		o.Logger.Info("control role started", "chain", p.Chain.ID(), "responder_keys", len(o.ResponderKeys), "replay_window", p.Ledger.Window())
	}
	return run, nil
}

// withLogger is o with log as its logger unless it has one.
func withLogger(o kv.LedgerOptions, log *slog.Logger) kv.LedgerOptions {
	if o.Logger == nil {
		o.Logger = log
	}
	return o
}
