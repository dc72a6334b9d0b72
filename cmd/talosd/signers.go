package main

import (
	"log/slog"
	"path/filepath"

	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/receipts"
)

// checkpoints are the chains' checkpoint settings from the flags.
func (f *Flags) checkpoints() checkpoint.Options {
	return checkpoint.Options{Every: f.CheckpointEvery, Interval: f.CheckpointInterval, Off: !f.ChainCheckpoints}
}

// signersDir keeps the public key of every signing key this data dir's
// talosd ever used, so that receipts signed before a key rotation keep
// verifying (talosctl verify --trusted-keys <data-dir>/keys/signers).
func (f *Flags) signersDir() string { return filepath.Join(f.DataDir, "keys", "signers") }

// keepSigner adds key's public key to signersDir. A failure is logged,
// not fatal: the signing key itself is the user's.
func keepSigner(f *Flags, key *receipts.PrivateKey, log *slog.Logger) {
	path, added, err := receipts.KeepPublicKey(f.signersDir(), key)
	if err != nil {
		log.Warn("cannot keep the signing key's public key for verification after a rotation", "path", path, "err", err)
	} else if added {
		log.Info("signing key added to the signers kept for verification", "kid", key.KID, "path", path)
	}
}
