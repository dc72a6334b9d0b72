package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// SetupOptions bound Setup's waits. The zero value means 1 s for the
// first attempt, 200 ms to 2 s between attempts and a 30 s grace for
// placement (Grace).
type SetupOptions struct {
	// Attempt bounds the first attempt, doubled for each next one up to
	// 8 s: a JetStream API request that a cluster without a meta leader
	// leaves unanswered is given up and made again, and one that a busy
	// cluster answers slowly gets longer each time.
	Attempt    time.Duration
	First, Max time.Duration
	// Grace is how long "no suitable peers", "insufficient resources" and
	// "JetStream not enabled" are waited out: on a cluster starting cold
	// its nodes join JetStream one by one, and a replicated stream cannot
	// be placed until enough have; after the grace the replica count is
	// taken for more than the cluster has (or JetStream for off), and the
	// error is returned.
	Grace time.Duration
	Log   *slog.Logger
}

// ErrMisconfigured marks an error Setup returns without waiting: waiting
// cannot fix it (see Transient).
var ErrMisconfigured = errors.New("JetStream refuses this configuration")

// Setup runs try, which creates or binds a stream, a KV bucket or a
// consumer on nc's JetStream with the context it is given (bounded by
// Attempt), until it succeeds, ctx ends or it fails in a
// way that waiting cannot fix. While the cluster elects leaders or its
// nodes join (Transient), each failure is logged as what and retried,
// backing off; a misconfiguration (replicas on a server without a cluster,
// a stream that exists with another storage, missing permissions) is
// returned at once, wrapped in ErrMisconfigured, and so is a placement
// that still fails after the grace. While nc is not connected to a
// server, each failure is logged as NATS not reachable, with the servers
// nc tries and why it cannot connect, and an error returned when ctx ends
// says so. An attempt cut short by ctx ending is never taken for a
// misconfiguration. nc may be nil (then a permission violation shows as a
// timeout and is waited out).
func Setup(ctx context.Context, nc *nats.Conn, o SetupOptions, what string, try func(context.Context) error) error {
	if o.Attempt <= 0 {
		o.Attempt = time.Second
	}
	if o.First <= 0 {
		o.First = 200 * time.Millisecond
	}
	if o.Max <= 0 {
		o.Max = 2 * time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	began, backoff, limit := time.Now(), o.First, o.Attempt
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, limit)
		limit = min(2*limit, max(o.Attempt, 8*time.Second))
		err := try(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				o.Log.Info("JetStream ready: "+what, "attempts", attempt, "after", time.Since(began).Round(time.Millisecond))
			}
			return nil
		}
		transient, graced := Transient(nc, err)
		down := disconnected(nc)
		switch {
		case errors.Is(err, nats.ErrConnectionClosed) && nc != nil && nc.LastError() != nil:
			// Closed for good (refused credentials, for one): say why.
			return fmt.Errorf("%s: %w: %w", what, err, nc.LastError())
		case ctx.Err() != nil && down != nil:
			return fmt.Errorf("%s: %w: %w", what, down, err)
		case ctx.Err() != nil:
			// Shutting down: the attempt was cut short, nothing was refused.
			return fmt.Errorf("%s: %w", what, err)
		case down != nil:
			// No server to ask: every request waits in nc's buffer.
			o.Log.Warn("NATS not reachable; retrying: "+what, "err", down, "attempt", attempt, "backoff", backoff)
		case !transient && deniedAPI(nc):
			return fmt.Errorf("%w: %s: %w (%w)", ErrMisconfigured, what, err, nc.LastError())
		case !transient:
			return fmt.Errorf("%w: %s: %w", ErrMisconfigured, what, err)
		case graced && time.Since(began) > o.Grace:
			return fmt.Errorf("%w: %s: %w (for %v: more replicas than the cluster has JetStream nodes, or JetStream off?)",
				ErrMisconfigured, what, err, o.Grace)
		default:
			o.Log.Warn("JetStream not ready (cluster electing leaders or nodes joining); retrying: "+what,
				"err", err, "attempt", attempt, "backoff", backoff)
		}
		select {
		case <-ctx.Done():
			if down != nil {
				return fmt.Errorf("%s: %w: %w", what, down, err)
			}
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, o.Max)
	}
}

// Transient reports whether err, from a JetStream API request on nc, may
// go away by itself while a cluster elects leaders or starts: no answer
// (a timeout, no responders, a connection being re-established), the
// cluster temporarily unavailable, no leader. graced is true for "no
// suitable peers", "insufficient resources" and "JetStream not enabled":
// transient on a cluster still starting, a misconfiguration after a
// while. A timeout while nc's last error is a permission violation on the
// JetStream API is not transient: the request was refused, not lost.
func Transient(nc *nats.Conn, err error) (transient, graced bool) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10005, 10023, 10039, 10076: // no peers, insufficient resources; JetStream not enabled (yet?)
			return true, true
		case 10006, 10008, 10009: // cluster not active, not available, not leader
			return true, false
		}
		return apiErr.Code == 503 || apiErr.Code == 408 || apiErr.Code == 504, false
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return !deniedAPI(nc), false
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return true, true
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected), errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		// Not found: a stream just created whose leader is not yet known
		// to every node.
		return true, false
	}
	return false, false
}

// deniedAPI reports whether nc's last error is a permission violation on
// the JetStream API: its requests then go unanswered rather than refused.
func deniedAPI(nc *nats.Conn) bool {
	if nc == nil {
		return false
	}
	last := nc.LastError()
	return last != nil && errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), "$JS.API")
}

// disconnected says, when nc has no connection to a server, which servers
// it tries and why it cannot connect: its last error (TLS, authorization),
// else what dialling them answers now (refused, no route, timeout). It is
// nil when nc is nil, connected or closed.
func disconnected(nc *nats.Conn) error {
	if nc == nil || nc.IsConnected() || nc.IsClosed() {
		return nil
	}
	servers := nc.Servers()
	where := strings.Join(servers, ", ")
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("not connected to NATS at %s: %w", where, err)
	}
	var dials []error
	for _, s := range servers {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			dials = append(dials, err)
			continue
		}
		c.Close()
	}
	if len(dials) == 0 {
		return fmt.Errorf("not connected to NATS at %s yet (connecting)", where)
	}
	return fmt.Errorf("not connected to NATS at %s: %w", where, errors.Join(dials...))
}
