package testenv

import (
	"testing"

	"github.com/talos-audit/talos/ingest/natsserver"
)

// The embedded NATS server of package natsserver, under the names the tests
// use.
type (
	NATS        = natsserver.Server
	NATSOptions = natsserver.Options
)

// DefaultNATSMaxPayload is the largest message the embedded server accepts.
const DefaultNATSMaxPayload = natsserver.DefaultMaxPayload

// StartNATS starts an embedded nats-server with JetStream (natsserver.Start).
func StartNATS(opts NATSOptions) (*NATS, error) { return natsserver.Start(opts) }

// NATSForTest starts an embedded server stored in t.TempDir() and shuts it
// down when the test ends.
func NATSForTest(t testing.TB) *NATS {
	t.Helper()
	n, err := StartNATS(NATSOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n
}
