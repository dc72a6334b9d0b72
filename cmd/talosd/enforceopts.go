package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts/verify"
)

// enforceOptions builds the enforce role's checks from the flags:
// capabilities (CP-EI), preflight, policy and rate limits (CSP MUST 7), the
// shared call ledger (replay, idempotency, post matching) and the redactor
// of the flight recorder (UTS FR-EVT-007).
func enforceOptions(ctx context.Context, f *Flags, log *slog.Logger, js jetstream.JetStream) (enforce.DeciderOptions, error) {
	o := enforce.DeciderOptions{
		MaxEnvelopeBytes:  f.MaxEnvelopeBytes,
		RequireCapability: f.Capabilities != "optional",
		Preflight:         enforce.PreflightConfig{MaxArgsBytes: f.MaxArgsBytes},
		ReplayWindow:      f.ReplayWindow,
	}
	issuers := verify.KeySet{}
	if len(f.CapabilityIssuers) > 0 {
		ks, err := verify.LoadTrustedKeys(f.CapabilityIssuers...)
		if err != nil {
			return o, usagef("--capability-issuers: %v", err)
		}
		issuers = ks
	} else if o.RequireCapability {
		log.Warn("no --capability-issuers: every phase-pre call will be denied (capabilities are required; --capabilities optional turns that off)")
	}
	authz, err := enforce.NewAuthorizer(enforce.CapabilityConfig{Issuers: issuers})
	if err != nil {
		return o, err
	}
	o.Capabilities = authz
	if f.Policy != "" {
		p, err := enforce.LoadPolicy(f.Policy)
		if err != nil {
			return o, usagef("--policy: %v", err)
		}
		o.Policy = p
		if o.RateLimiter, err = ingest.NewRateLimiter(ctx, js, p, f.Replicas); err != nil {
			return o, err
		}
	}
	ledger, err := newLedger(ctx, f, js)
	if err != nil {
		return o, fmt.Errorf("call ledger: %w", err)
	}
	o.Ledger = ledger
	key, kid, err := redact.LoadOrCreateKey(redactionKeyPath(f), true)
	if err != nil {
		return o, fmt.Errorf("--redaction-key: %w", err)
	}
	red, err := redact.New(redact.Config{Key: key, KeyID: kid, ExtraFieldNames: f.RedactFields})
	if err != nil {
		return o, err
	}
	o.Redactor = red
	log.Info("enforce checks", "capabilities", f.Capabilities, "issuers", len(issuers), "policy", f.Policy != "",
		"redaction_key_id", kid)
	return o, nil
}

// newLedger opens the shared call ledger with the flags' window, replicas
// and storage (every role that uses it opens it the same way).
func newLedger(ctx context.Context, f *Flags, js jetstream.JetStream) (*ingest.Ledger, error) {
	return ingest.NewLedger(ctx, js, ingest.LedgerOptions{Window: f.ReplayWindow, Replicas: f.Replicas, Memory: f.ReplayStorage == "memory"})
}

// redactionKeyPath is --redaction-key, default <data-dir>/keys/redaction.key.
func redactionKeyPath(f *Flags) string {
	if f.RedactionKey != "" {
		return f.RedactionKey
	}
	return filepath.Join(f.DataDir, "keys", "redaction.key")
}
