package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/loadgen"
)

// SendCalls sends calls as 4 enforcement points (sessions of session) to
// the talosd behind natsURL, each call with its post event, and fails the
// test unless every one was decided and every allowed one posted. They
// are unsigned: the talosd must take calls without capabilities.
func SendCalls(t testing.TB, natsURL, session string, calls int) {
	t.Helper()
	clients, closeAll, err := loadgen.Connect(1, 4, session, func() (*nats.Conn, error) { return nats.Connect(natsURL) })
	defer closeAll()
	if err != nil {
		t.Fatal(err)
	}
	m, err := loadgen.NewMaker("files", "list_directory", session, 256, true)
	if err != nil {
		t.Fatal(err)
	}
	p, err := loadgen.Prepare(m, clients, calls, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	tally := p.Send(clients, loadgen.Pacing{Inflight: 4, Server: "files", Timeout: time.Minute})
	if tally.None != 0 || tally.Allowed+tally.Denied != int64(calls) || tally.Posted != tally.Allowed {
		t.Fatalf("calls: %+v", tally)
	}
}
