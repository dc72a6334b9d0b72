package gateway

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
)

// natsStatus logs why the gateway cannot reach NATS and when it does:
// while it is not connected every call is denied, and "not reachable"
// alone does not tell a refused dial from a TLS or an authorization
// failure. Each distinct reason is logged once until the connection is
// made; nats.go calls it from its callback goroutine.
type natsStatus struct {
	log *slog.Logger
	url string // redacted

	mu   sync.Mutex
	last string // the reason last logged; "" once connected
}

// options are the nats.Connect options that report to n.
func (n *natsStatus) options() []nats.Option {
	return []nats.Option{nats.ReconnectErrHandler(n.failed), nats.ConnectHandler(n.connected), nats.ReconnectHandler(n.connected)}
}

// failed logs err unless it was the reason last logged. nats.ErrNoServers
// says only that the first round of attempts failed; the attempt that
// follows names why.
func (n *natsStatus) failed(_ *nats.Conn, err error) {
	if err == nil || errors.Is(err, nats.ErrNoServers) {
		return
	}
	n.mu.Lock()
	seen := err.Error() == n.last
	n.last = err.Error()
	n.mu.Unlock()
	if !seen {
		n.log.Warn("NATS not reachable yet; every call is denied until it is", "url", n.url, "err", err)
	}
}

// connected logs a connection made after a failure was logged.
func (n *natsStatus) connected(nc *nats.Conn) {
	n.mu.Lock()
	failed := n.last != ""
	n.last = ""
	n.mu.Unlock()
	if failed {
		n.log.Info("NATS connected", "url", natsauth.Redact(nc.ConnectedUrl()))
	}
}
