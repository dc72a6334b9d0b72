package main

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
)

// checkpoints are the chains' checkpoint settings from the flags.
func (f *Flags) checkpoints() ingest.CheckpointOptions {
	return ingest.CheckpointOptions{Every: f.CheckpointEvery, Interval: f.CheckpointInterval}
}

// signersDir keeps the public key of every signing key this data dir's
// talosd ever used, so that receipts signed before a key rotation keep
// verifying (talosctl verify --trusted-keys <data-dir>/keys/signers).
func (f *Flags) signersDir() string { return filepath.Join(f.DataDir, "keys", "signers") }

// keepSigner adds key's public key to signersDir (once per key id). A
// failure is logged, not fatal: the signing key itself is the user's.
func keepSigner(f *Flags, key *receipts.PrivateKey, log *slog.Logger) {
	dir := f.signersDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Warn("cannot keep the signing key's public key for verification after a rotation", "dir", dir, "err", err)
		return
	}
	path := filepath.Join(dir, key.KID+".pub")
	switch err := receipts.WritePublicKey(key.Public(), path); {
	case err == nil:
		log.Info("signing key added to the signers kept for verification", "kid", key.KID, "path", path)
	case !errors.Is(err, receipts.ErrKeyFileExists):
		log.Warn("cannot keep the signing key's public key for verification after a rotation", "path", path, "err", err)
	}
}
