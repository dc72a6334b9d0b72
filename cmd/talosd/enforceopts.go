package main

import (
	"errors"
	"log/slog"
	"path/filepath"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/kv"
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
	if len(f.CapabilityIssuers) == 0 && o.RequireCapability {
		log.Warn("no --capability-issuers: every phase-pre call will be denied (capabilities are required; --capabilities optional turns that off)")
	}
	issuers, kid, err := o.LoadFiles(enforce.CheckFiles{CapabilityIssuers: f.CapabilityIssuers, Policy: f.Policy,
		RedactionKey: redactionKeyPath(f), RedactFields: f.RedactFields})
	var ferr *enforce.CheckFileError
	if errors.As(err, &ferr) && ferr.Flag != "redaction-key" {
		return o, usagef("%v", err)
	}
	if err != nil {
		return o, err
	}
	log.Info("enforce checks", "capabilities", f.Capabilities, "issuers", issuers, "policy", f.Policy != "", "redaction_key_id", kid)
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
