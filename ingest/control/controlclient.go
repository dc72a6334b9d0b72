package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Retry bounds of ControlClient.Do.
const (
	// controlAttemptTimeout bounds one request; a mutation that waits for
	// a busy stream may take longer, and is then answered on a retry.
	controlAttemptTimeout = 3 * time.Second
	controlRetryFirst     = 100 * time.Millisecond
	controlRetryMax       = time.Second
)

// ControlClient sends control commands to the control service (what
// talosctl uses). It is safe for concurrent use.
type ControlClient struct {
	nc    *nats.Conn
	key   *receipts.PrivateKey
	actor string
}

// NewControlClient returns a client that signs with key (nil: commands go
// unsigned, and the service refuses them) on behalf of actor.
func NewControlClient(nc *nats.Conn, key *receipts.PrivateKey, actor string) *ControlClient {
	return &ControlClient{nc: nc, key: key, actor: actor}
}

// NewCommand returns a command for verb with a fresh UUIDv7 command_id,
// the client's actor and issued_at now; set the verb's fields, then Do it.
func (c *ControlClient) NewCommand(verb string) *schemas.ControlCommand {
	return &schemas.ControlCommand{
		SchemaVersion: schemas.ControlCommandVersion,
		CommandID:     uuid.Must(uuid.NewV7()).String(),
		Verb:          verb,
		Actor:         c.actor,
		IssuedAt:      time.Now().UTC().Format(schemas.TimeFormat),
	}
}

// Do signs cmd (if the client has a key; the signature replaces any in
// cmd) and sends it to talos.ctl.<verb>. When no service answers in time
// (no responders, a timeout), or one answers CTL_INTERNAL having recorded
// nothing (no seq: it could not reach a stream, say while the cluster
// elects a leader), it sends the same bytes again, so the same
// command_id, until ctx ends: the service appends a command once however
// often it arrives, and answers a repeat with the first append's seq and
// receipt. A refusal is a reply with OK false, not an error (the last
// CTL_INTERNAL when ctx ends); the error is for no reply at all or an
// unreadable one.
func (c *ControlClient) Do(ctx context.Context, cmd *schemas.ControlCommand) (*schemas.ControlReply, error) {
	if c.key != nil {
		if err := receipts.SignCommand(c.key, cmd); err != nil {
			return nil, err
		}
	}
	data, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("control command: %w", err)
	}
	subject := schemas.CtlSubject(cmd.Verb)
	backoff := controlRetryFirst
	for {
		actx, cancel := context.WithTimeout(ctx, controlAttemptTimeout)
		m, err := c.nc.RequestWithContext(actx, subject, data)
		cancel()
		var reply schemas.ControlReply
		if err == nil {
			if err := json.Unmarshal(m.Data, &reply); err != nil {
				return nil, fmt.Errorf("control reply on %s: %w", subject, err)
			}
			if reply.OK || reply.Code != schemas.CtlInternal || reply.Seq != 0 {
				return &reply, nil
			}
		}
		retryable := err == nil || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
			errors.Is(err, context.DeadlineExceeded)
		if ctx.Err() != nil || !retryable {
			return noReply(ctx, cmd.Verb, &reply, err)
		}
		select {
		case <-ctx.Done():
			return noReply(ctx, cmd.Verb, &reply, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, controlRetryMax)
	}
}

// noReply ends Do without an answer it could use: the last CTL_INTERNAL
// reply when there was one (err nil), else err.
func noReply(ctx context.Context, verb string, reply *schemas.ControlReply, err error) (*schemas.ControlReply, error) {
	switch {
	case err == nil:
		return reply, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("control %s: no reply (%w): %w", verb, err, ctx.Err())
	}
	return nil, fmt.Errorf("control %s: %w", verb, err)
}

// Propagation is how an accepted mutation reached the workers.
type Propagation struct {
	Seq   uint64    // the TALOS_CONTROL seq of the command
	Sent  time.Time // when the command was first sent
	Acked time.Time // when the reply arrived
	// Applied maps each worker that reported Seq applied to when its
	// heartbeat saying so arrived.
	Applied map[string]time.Time
	// Missing are the workers of the reply that stopped being live, or had
	// not applied Seq when the wait ended.
	Missing []string
}

// lastApplied is the latest Applied time (zero if none).
func (p *Propagation) lastApplied() time.Time {
	var last time.Time
	for _, t := range p.Applied {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// AfterAck is how long after the reply the last worker reported the seq
// applied (0 if every worker had it by then, or none did).
func (p *Propagation) AfterAck() time.Duration {
	last := p.lastApplied()
	if last.IsZero() {
		return 0
	}
	return max(0, last.Sub(p.Acked))
}

// AfterSend is how long after the command was sent the last worker
// reported the seq applied (0 if none did).
func (p *Propagation) AfterSend() time.Duration {
	last := p.lastApplied()
	if last.IsZero() {
		return 0
	}
	return max(0, last.Sub(p.Sent))
}

// DoAndWait does cmd and, if it was an accepted mutation, waits up to wait
// for every worker named in the reply to report its seq applied. The
// status watcher starts before the command is sent, so no heartbeat is
// missed. Propagation is nil for a refusal or a read. A wait that runs
// out (wait, or ctx's deadline) is not an error: the workers still pending
// are in Missing; only a cancelled ctx is.
func (c *ControlClient) DoAndWait(ctx context.Context, cmd *schemas.ControlCommand, wait time.Duration) (*schemas.ControlReply, *Propagation, error) {
	w, err := NewStatusWatcher(c.nc)
	if err != nil {
		return nil, nil, err
	}
	defer w.Close()
	sent := time.Now()
	reply, err := c.Do(ctx, cmd)
	if err != nil {
		return nil, nil, err
	}
	acked := time.Now()
	if !reply.OK || reply.Seq == 0 {
		return reply, nil, nil
	}
	p := &Propagation{Seq: reply.Seq, Sent: sent, Acked: acked, Applied: map[string]time.Time{}}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	applied, missing, err := w.WaitApplied(wctx, reply.Seq, reply.Workers)
	p.Applied, p.Missing = applied, missing
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return reply, p, err
	}
	// Running out of time (wait, or ctx's own deadline) is what Missing
	// reports.
	return reply, p, nil
}

// RefusedError is a reply with OK false: the control service refused
// the command (Reply.Code says why).
type RefusedError struct {
	Verb  string
	Reply *schemas.ControlReply
}

func (e *RefusedError) Error() string {
	msg := fmt.Sprintf("%s refused: %s (%s)", e.Verb, e.Reply.Error, e.Reply.Code)
	if e.Reply.ReceiptSuppressed {
		msg += "; no receipt: too many refusals, the next receipt counts this one"
	}
	return msg
}

// UnconfirmedError is an accepted mutation that some live workers did not
// report applied within the wait.
type UnconfirmedError struct {
	Seq     uint64
	Missing []string
}

func (e *UnconfirmedError) Error() string {
	return fmt.Sprintf("%d worker(s) did not confirm seq %d in time: %s", len(e.Missing), e.Seq, strings.Join(e.Missing, ", "))
}

// Send does cmd and, when wait is positive, waits up to wait for every
// live worker to apply it (DoAndWait). It folds the outcome into one
// error: no reply is a nil reply and Do's error; a refusal is the reply
// and a *RefusedError; workers that did not confirm in time are the reply,
// the propagation and an *UnconfirmedError. Propagation is nil without a
// wait, for a refusal and for a read.
func (c *ControlClient) Send(ctx context.Context, cmd *schemas.ControlCommand, wait time.Duration) (*schemas.ControlReply, *Propagation, error) {
	var (
		rep  *schemas.ControlReply
		prop *Propagation
		err  error
	)
	if wait > 0 {
		rep, prop, err = c.DoAndWait(ctx, cmd, wait)
	} else {
		rep, err = c.Do(ctx, cmd)
	}
	switch {
	case err != nil:
		return nil, nil, err
	case !rep.OK:
		return rep, nil, &RefusedError{Verb: cmd.Verb, Reply: rep}
	case prop != nil && len(prop.Missing) > 0:
		return rep, prop, &UnconfirmedError{Seq: rep.Seq, Missing: prop.Missing}
	}
	return rep, prop, nil
}
