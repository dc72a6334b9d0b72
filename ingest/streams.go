package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/schemas"
)

// StreamOptions configures the four streams. The zero value is the
// embedded single-node default.
type StreamOptions struct {
	// Replicas is 1 (default) on a single node, 3 in a cluster. An
	// existing stream keeps a higher count (EnsureStreams).
	Replicas int
	// AuditMaxAge bounds TALOS_AUDIT retention (default 30 days).
	AuditMaxAge time.Duration
	// DuplicateWindow is how long JetStream remembers Nats-Msg-Id values on
	// TALOS_CALLS and TALOS_AUDIT (default DefaultDuplicateWindow). It must
	// exceed the consumers' AckWait so a redelivered call cannot store a
	// second receipt.
	DuplicateWindow time.Duration
	// MaxMsgSize bounds one message (default 8 MiB).
	MaxMsgSize int32
	// DecisionMaxAge is how long TALOS_DECISIONS keeps a decision for its
	// enforcement point to ask again (default 2 minutes: longer than any
	// enforcement point of the repository waits for a decision).
	DecisionMaxAge time.Duration
	// Memory stores streams in memory (benchmarks only; never in prod).
	Memory bool
	// Setup bounds the waits for a cluster that is electing leaders or
	// starting (retry.Setup); its zero value means the defaults.
	Setup retry.SetupOptions
}

// DefaultDuplicateWindow is the streams' duplicate window unless
// StreamOptions say otherwise.
const DefaultDuplicateWindow = 2 * time.Minute

func (o StreamOptions) withDefaults() StreamOptions {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.AuditMaxAge <= 0 {
		o.AuditMaxAge = 30 * 24 * time.Hour
	}
	if o.DuplicateWindow <= 0 {
		o.DuplicateWindow = DefaultDuplicateWindow
	}
	if o.MaxMsgSize <= 0 {
		o.MaxMsgSize = 8 << 20
	}
	if o.DecisionMaxAge <= 0 {
		o.DecisionMaxAge = 2 * time.Minute
	}
	return o
}

// StreamConfigs returns the configurations EnsureStreams applies, in the
// order it applies them.
func StreamConfigs(o StreamOptions) []jetstream.StreamConfig {
	o = o.withDefaults()
	storage := jetstream.FileStorage
	if o.Memory {
		storage = jetstream.MemoryStorage
	}
	return []jetstream.StreamConfig{
		{
			Name:        schemas.StreamCalls,
			Description: "Talos tool calls awaiting a decision (raw, unredacted; work queue, never archived)",
			Subjects:    []string{schemas.SubjectCallsAll},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     storage,
			Replicas:    o.Replicas,
			Duplicates:  o.DuplicateWindow,
			MaxMsgSize:  o.MaxMsgSize,
			Discard:     jetstream.DiscardOld,
		},
		{
			Name:        schemas.StreamAudit,
			Description: "Talos signed receipts and events: the system of record",
			Subjects:    []string{schemas.SubjectAuditAll},
			Retention:   jetstream.LimitsPolicy,
			Storage:     storage,
			Replicas:    o.Replicas,
			MaxAge:      o.AuditMaxAge,
			Duplicates:  o.DuplicateWindow,
			MaxMsgSize:  o.MaxMsgSize,
			Discard:     jetstream.DiscardOld,
		},
		{
			Name:        schemas.StreamControl,
			Description: "Talos control events: the source of truth for enforcement state",
			Subjects:    []string{schemas.SubjectControlAll},
			Retention:   jetstream.LimitsPolicy,
			Storage:     storage,
			Replicas:    o.Replicas,
			Duplicates:  o.DuplicateWindow,
			MaxMsgSize:  o.MaxMsgSize,
		},
		{
			// One message per call and phase, the decision reply as its
			// enforcement point received it: what it gets when it asks
			// again (a direct get of its own subject).
			Name:              schemas.StreamDecisions,
			Description:       "Talos decision replies, kept for their enforcement points to ask again",
			Subjects:          []string{schemas.SubjectDecisionsAll},
			Retention:         jetstream.LimitsPolicy,
			Storage:           storage,
			Replicas:          o.Replicas,
			MaxAge:            o.DecisionMaxAge,
			MaxMsgsPerSubject: 1,
			Duplicates:        o.DuplicateWindow,
			MaxMsgSize:        o.MaxMsgSize,
			Discard:           jetstream.DiscardOld,
			AllowDirect:       true,
		},
	}
}

// EnsureStreams creates the four streams or updates them to the wanted
// configuration. It is safe to call from every process at start, all at
// once: while the cluster elects leaders or its nodes join, each stream is
// retried with a log line (retry.Setup); a misconfiguration fails at once.
// An update never lowers an existing stream's replica count, as the KV
// buckets' never does (package kv): a cluster runs them at R3, and a
// process started without --replicas that joins it must not take two
// copies of the system of record away.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions) error {
	for _, cfg := range StreamConfigs(o) {
		err := retry.Setup(ctx, js.Conn(), o.Setup, "stream "+cfg.Name, func(ctx context.Context) error {
			return ensureStream(ctx, js, cfg)
		})
		if err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	st, err := js.Stream(ctx, cfg.Name)
	switch {
	case err == nil:
		cfg.Replicas = max(cfg.Replicas, st.CachedInfo().Config.Replicas)
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return err
	}
	_, err = js.CreateOrUpdateStream(ctx, cfg)
	return err
}
