package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/receipts/verify"
)

// DefaultTrustedKeys is where the gateway looks for talosd's public keys
// when --trusted-keys is not given: keys/signers of talosd's data dir,
// where talosd keeps the public key of every key it signs with. The data
// dir is the directory of the --nats-auth users file when one is named
// (talosd writes it as <data-dir>/nats-auth.json), else ./talos-data, the
// dev stack's.
func DefaultTrustedKeys(usersFile string) string {
	dataDir := filepath.Dir(natsauth.DevUsersFile)
	if usersFile != "" && usersFile != natsauth.None {
		dataDir = filepath.Dir(usersFile)
	}
	return filepath.Join(dataDir, "keys", "signers")
}

// TrustedKeys loads the keys approve and reject events must be signed by
// (--trusted-keys: .pub files or directories of them). A path given that
// cannot be read is an error. With none given, DefaultTrustedKeys(usersFile)
// is read if it exists; if it does not, the set is empty, which is logged:
// no approval can then be applied, and parked calls are denied when they
// time out (fail closed).
func TrustedKeys(paths []string, usersFile string, log *slog.Logger) (verify.KeySet, error) {
	if len(paths) == 0 {
		def := DefaultTrustedKeys(usersFile)
		if _, err := os.Stat(def); errors.Is(err, fs.ErrNotExist) {
			log.Error("no --trusted-keys and no talosd signers at the default path: approvals cannot be applied; calls that need one are denied after --approval-timeout", "path", def)
			return verify.KeySet{}, nil
		}
		paths = []string{def}
	}
	keys, err := verify.LoadKeys(paths...)
	if err != nil {
		return nil, fmt.Errorf("--trusted-keys: %w", err)
	}
	kids := make([]string, 0, len(keys))
	for kid := range keys {
		kids = append(kids, kid)
	}
	slices.Sort(kids)
	log.Info("approvals are applied when signed by a trusted talosd key", "keys", strings.Join(kids, ","), "from", strings.Join(paths, ","))
	return keys, nil
}
