package ep

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// OutboxLimit bounds the post events waiting for NATS. While it is full an
// enforcement point denies new calls (ENFORCEMENT_UNAVAILABLE) rather than
// run calls it could not report.
const OutboxLimit = 10000

// Outbox delivers an enforcement point's post events to TALOS_CALLS in
// order, retrying until JetStream acknowledges each one: a call that ran,
// or that the enforcement point refused on its own (NATS down, no
// decision, rejected), is never left out of the audit trail because NATS
// was away for a while. It lives in memory: a process killed while NATS
// is down loses what it holds.
//
// Its one delivery goroutine is started by Start and owned by Drain, which
// the owner MUST call before it exits.
type Outbox struct {
	log     *slog.Logger
	mu      sync.Mutex
	cond    *sync.Cond
	q       []*schemas.ToolCall
	busy    bool // a post is being published
	stopped bool
	stop    chan struct{} // closed by Drain: give up
	done    chan struct{} // closed when the loop has returned
}

// NewOutbox builds an outbox that logs to log.
func NewOutbox(log *slog.Logger) *Outbox {
	o := &Outbox{log: log, stop: make(chan struct{}), done: make(chan struct{})}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// Send queues a post event. An envelope of phase pre is delivered on its
// own subject alike: an enforcement point that reports a refusal without
// waiting for its decision (the gateway's unauthenticated requests) queues
// it here.
func (o *Outbox) Send(post *schemas.ToolCall) {
	o.mu.Lock()
	o.q = append(o.q, post)
	o.mu.Unlock()
	o.cond.Broadcast()
}

// Full reports whether no more calls should be taken.
func (o *Outbox) Full() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.q) >= OutboxLimit
}

// pending is how many posts are not yet acknowledged.
func (o *Outbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.q)
	if o.busy {
		n++
	}
	return n
}

// Start runs the delivery loop on js until Drain stops it.
func (o *Outbox) Start(js jetstream.JetStream) {
	go func() {
		defer close(o.done)
		for {
			o.mu.Lock()
			for len(o.q) == 0 && !o.stopped {
				o.cond.Wait()
			}
			if o.stopped {
				o.mu.Unlock()
				return
			}
			post := o.q[0]
			o.q = o.q[1:]
			o.busy = true
			o.mu.Unlock()
			delivered := o.deliver(js, post)
			o.mu.Lock()
			o.busy = false
			if !delivered {
				o.q = append([]*schemas.ToolCall{post}, o.q...)
			}
			o.mu.Unlock()
			o.cond.Broadcast()
		}
	}()
}

// Drain waits up to wait for every queued post to be delivered, then stops
// the loop. It returns how many were not delivered.
func (o *Outbox) Drain(wait time.Duration) int {
	deadline := time.Now().Add(wait)
	for o.pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	o.mu.Lock()
	o.stopped = true
	o.mu.Unlock()
	close(o.stop)
	o.cond.Broadcast()
	<-o.done
	return o.pending()
}

// deliver publishes one post until it is acknowledged, or until Drain
// gives up (false).
func (o *Outbox) deliver(js jetstream.JetStream, post *schemas.ToolCall) bool {
	raw, err := json.Marshal(post)
	if err != nil {
		o.log.Error("post event cannot be encoded; dropped", "tool_call_id", post.ToolCallID, "err", err)
		return true
	}
	msg := &nats.Msg{Subject: schemas.CallSubject(post.Phase, post.EPID, post.ServerID), Data: raw, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, schemas.CallMsgID(post.EPID, post.ToolCallID, post.Phase))
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := js.PublishMsg(ctx, msg)
		cancel()
		if err == nil {
			if attempt > 1 {
				o.log.Info("post event delivered after retries", "tool_call_id", post.ToolCallID, "attempts", attempt)
			}
			return true
		}
		if attempt == 1 {
			o.log.Warn("post event not delivered yet; retrying", "tool_call_id", post.ToolCallID, "err", err)
		}
		select {
		case <-o.stop:
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}
