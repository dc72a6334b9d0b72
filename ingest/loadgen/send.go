package loadgen

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// SendUnsigned sends calls as 4 enforcement points (sessions of session)
// to the talosd behind natsURL, each with its post event, unsigned (that
// talosd must take calls without capabilities), and fails unless every one
// was decided and every allowed one posted. It serves tests that need
// records in TALOS_AUDIT.
func SendUnsigned(natsURL, session string, calls int) error {
	clients, closeAll, err := Connect(1, 4, session, func() (*nats.Conn, error) { return nats.Connect(natsURL) })
	defer closeAll()
	if err != nil {
		return err
	}
	m, err := NewMaker("files", "list_directory", session, 256, true)
	if err != nil {
		return err
	}
	p, err := Prepare(m, clients, calls, 0)
	if err != nil {
		return err
	}
	defer p.Stop()
	tally := p.Send(clients, Pacing{Inflight: 4, Server: "files", Timeout: time.Minute})
	if tally.None != 0 || tally.Allowed+tally.Denied != int64(calls) || tally.Posted != tally.Allowed {
		return fmt.Errorf("calls: %+v", tally)
	}
	return nil
}
