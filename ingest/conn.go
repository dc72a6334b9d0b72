package ingest

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// DaemonConnOptions are the nats.Connect options of a long-running
// process's own connection, named name: it retries a failed first connect,
// reconnects forever every 250 ms, and logs disconnects, reconnects and a
// final close (refused credentials, for one, make nats.go give up).
func DaemonConnOptions(name string, log *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
		nats.ClosedHandler(func(c *nats.Conn) {
			if err := c.LastError(); err != nil {
				log.Error("nats connection closed for good; restart talosd once fixed", "err", err)
			}
		}),
	}
}
