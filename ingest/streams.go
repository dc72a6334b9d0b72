package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// StreamOptions configures the three streams. The zero value is the
// embedded single-node default.
type StreamOptions struct {
	// Replicas is 1 (default) on a single node, 3 in a cluster. An
	// existing stream keeps a higher count (EnsureStreams).
	Replicas int
	// AuditMaxAge bounds TALOS_AUDIT retention (default 30 days).
	AuditMaxAge time.Duration
	// DuplicateWindow is how long JetStream remembers Nats-Msg-Id values on
	// TALOS_CALLS and TALOS_AUDIT (default 2 minutes). It must exceed the
	// consumers' AckWait so a redelivered call cannot store a second receipt.
	DuplicateWindow time.Duration
	// MaxMsgSize bounds one message (default 8 MiB).
	MaxMsgSize int32
	// Memory stores streams in memory (benchmarks only; never in prod).
	Memory bool
}

func (o StreamOptions) withDefaults() StreamOptions {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.AuditMaxAge <= 0 {
		o.AuditMaxAge = 30 * 24 * time.Hour
	}
	if o.DuplicateWindow <= 0 {
		o.DuplicateWindow = 2 * time.Minute
	}
	if o.MaxMsgSize <= 0 {
		o.MaxMsgSize = 8 << 20
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
	}
}

// EnsureStreams creates the three streams or updates them to the wanted
// configuration. It is safe to call from every process at start. An update
// never lowers an existing stream's replica count, as the KV buckets'
// never does (package kv): a cluster runs them at R3, and a process started
// without --replicas that joins it must not take two copies of the system
// of record away.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions) error {
	for _, cfg := range StreamConfigs(o) {
		st, err := js.Stream(ctx, cfg.Name)
		switch {
		case err == nil:
			cfg.Replicas = max(cfg.Replicas, st.CachedInfo().Config.Replicas)
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}
