package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/receipts/verify"
)

// enforceChecks are the enforce role's checks from the flags:
// capabilities (CP-EI), preflight, policy and rate limits (CSP MUST 7) and
// the redactor of the flight recorder (UTS FR-EVT-007). The shared call
// ledger and rate counters are ingest.NewEnforceRole's.
func enforceChecks(f *Flags, log *slog.Logger) (enforce.DeciderOptions, error) {
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
	var err error
	if o.Capabilities, err = enforce.NewAuthorizer(enforce.CapabilityConfig{Issuers: issuers}); err != nil {
		return o, err
	}
	if f.Policy != "" {
		if o.Policy, err = enforce.LoadPolicy(f.Policy); err != nil {
			return o, usagef("--policy: %v", err)
		}
	}
	key, kid, err := redact.LoadOrCreateKey(redactionKeyPath(f), true)
	if err != nil {
		return o, fmt.Errorf("--redaction-key: %w", err)
	}
	if o.Redactor, err = redact.New(redact.Config{Key: key, KeyID: kid, ExtraFieldNames: f.RedactFields}); err != nil {
		return o, err
	}
	log.Info("enforce checks", "capabilities", f.Capabilities, "issuers", len(issuers), "policy", f.Policy != "",
		"redaction_key_id", kid)
	return o, nil
}

// ledgerOptions are the shared call ledger's (every role that uses it
// opens it the same way).
func (f *Flags) ledgerOptions() kv.LedgerOptions {
	return kv.LedgerOptions{Window: f.ReplayWindow, Replicas: f.Replicas, Memory: f.ReplayStorage == "memory"}
}

// redactionKeyPath is --redaction-key, default <data-dir>/keys/redaction.key.
func redactionKeyPath(f *Flags) string {
	if f.RedactionKey != "" {
		return f.RedactionKey
	}
	return filepath.Join(f.DataDir, "keys", "redaction.key")
}
