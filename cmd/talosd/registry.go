package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
)

// registryState is the registry this process's enforce role enforces once
// it has replayed TALOS_CONTROL, beside the bootstrap registry of
// --registry, which a registry pin overrides.
type registryState struct {
	// Path and Bootstrap are --registry and the registry loaded from it.
	Path      string
	Bootstrap *enforce.Registry
	// InForce is the registry calls are decided under: the pinned bundle,
	// or Bootstrap while nothing is pinned.
	InForce *enforce.Registry
	// PinnedSeq is the control seq of the registry.pin in force; 0: none.
	PinnedSeq uint64
}

// enforcedRegistry waits until en has replayed TALOS_CONTROL, then logs
// the registry it enforces, and warns when a pin overrides --registry.
// Without an enforce role (en nil) it is the bootstrap registry, logged at
// start. The error is ctx's when ctx ends first.
func enforcedRegistry(ctx context.Context, f *Flags, log *slog.Logger, c *core, en *ingest.EnforceRole) (registryState, error) {
	r := registryState{Path: f.Registry, Bootstrap: c.reg, InForce: c.reg}
	if en == nil {
		return r, nil
	}
	st, err := en.CaughtUpState(ctx)
	if err != nil {
		return r, err
	}
	r.InForce = st.Registry()
	_, r.PinnedSeq = st.Pinned()
	log.Info("registry pinned", "digest", r.InForce.Digest(), "servers", len(r.InForce.Manifests()), "source", r.source())
	if r.overridden() {
		log.Warn("registry pin overrides --registry: "+r.advice(), "enforced_digest", r.InForce.Digest(), "control_seq", r.PinnedSeq)
	}
	return r, nil
}

// source says where the registry in force comes from: --registry, or the
// registry pin of a control seq.
func (r registryState) source() string {
	switch {
	case r.PinnedSeq == 0:
		return r.Path + " (--registry; no registry pin)"
	case r.overridden():
		return fmt.Sprintf("registry pin at control seq %d", r.PinnedSeq)
	}
	return fmt.Sprintf("%s, pinned at control seq %d", r.Path, r.PinnedSeq)
}

// overridden reports whether a registry pin puts another registry than
// --registry in force.
func (r registryState) overridden() bool { return r.InForce.Digest() != r.Bootstrap.Digest() }

// advice says why --registry is not enforced and how to enforce it, with
// the commands the README names.
func (r registryState) advice() string {
	d := r.Bootstrap.Digest()
	return fmt.Sprintf("--registry %s (%s) is only the bootstrap registry, not enforced while a registry pin exists; "+
		"to enforce it, publish and pin it: talosctl registry publish %s, then talosctl registry pin %s --wait", r.Path, d, r.Path, d)
}
