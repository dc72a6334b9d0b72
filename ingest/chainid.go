package ingest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

var notToken = regexp.MustCompile(`[^a-z0-9_-]+`)

// InstanceToken turns an instance name into the subject token that starts
// its chain ids and names its worker: lower case, every run of other
// characters than [a-z0-9_-] made one "-", "-" and "_" trimmed at the ends,
// at most 40 characters; "talosd" if nothing is left.
func InstanceToken(instance string) string {
	s := notToken.ReplaceAllString(strings.ToLower(instance), "-")
	s = strings.Trim(s, "-_")
	if s == "" {
		s = "talosd"
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

// bootID is 4 random bytes in hex, new at each start, so that a restarted
// process starts new chains instead of continuing its old ones.
func bootID() string {
	boot := make([]byte, 4)
	_, _ = rand.Read(boot)
	return hex.EncodeToString(boot)
}

// NewWorkerChains returns a worker's n chains signed by key, named
// <token>-<8 hex, new at each call>-<i>, and base, the common prefix of
// their ids. token is InstanceToken of the instance name.
func NewWorkerChains(token string, n int, key *receipts.PrivateKey) (chains []*receipts.Chain, base string, err error) {
	base = token + "-" + bootID()
	chains = make([]*receipts.Chain, n)
	for i := range chains {
		id := base + "-" + strconv.Itoa(i)
		if !schemas.ValidID(id) {
			return nil, "", fmt.Errorf("chain id %q is not a valid subject token", id)
		}
		chains[i] = receipts.NewChain(id, key)
	}
	return chains, base, nil
}

// NewControlChain returns a control service's chain signed by key, named
// <token>-control-<8 hex, new at each call>.
func NewControlChain(token string, key *receipts.PrivateKey) *receipts.Chain {
	return receipts.NewChain(token+"-control-"+bootID(), key)
}
