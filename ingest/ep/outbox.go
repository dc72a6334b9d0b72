package ep

import (
	"context"
	"encoding/json"
	"fmt"
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
// was away for a while. NewOutbox's lives in memory: a process killed
// while NATS is down loses what it holds. OpenOutbox's has each event
// stored by JetStream before Send returns, or else keeps it in a spool
// directory until JetStream acknowledges it, and sends what a previous
// process left there first, so a crash loses nothing that Send accepted.
//
// Its one delivery goroutine is started by Start and owned by Drain, which
// the owner MUST call before it exits.
type Outbox struct {
	log   *slog.Logger
	spool *spool // nil: in memory only
	mu    sync.Mutex
	cond  *sync.Cond
	q     []queued
	busy  bool // a post is being published
	// unspooled counts the events waiting (or being published) that the
	// spool could not take: they would not survive a crash.
	unspooled int
	// direct counts the posts Send is publishing itself (sendDirect).
	direct  int
	js      jetstream.JetStream // set by Start: nil until started
	stopped bool
	stop    chan struct{} // closed by Drain: give up
	done    chan struct{} // closed when the loop has returned
}

// queued is an event waiting for JetStream and its spool file ("": none).
type queued struct {
	post *schemas.ToolCall
	file string
}

// NewOutbox builds an outbox in memory that logs to log.
func NewOutbox(log *slog.Logger) *Outbox {
	o := &Outbox{log: log, stop: make(chan struct{}), done: make(chan struct{})}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// OpenOutbox builds an outbox that spools to dir (created with mode 0700
// when missing) and queues what dir holds, in the order it was sent,
// before anything sent later. Files it cannot read back are moved to
// dir/quarantine and logged. dir "" is NewOutbox. The spool is this
// process's until Drain returns (ErrSpoolInUse for a second one).
func OpenOutbox(log *slog.Logger, dir string) (*Outbox, error) {
	o := NewOutbox(log)
	if dir == "" {
		return o, nil
	}
	s, q, err := openSpool(dir, log)
	if err != nil {
		return nil, fmt.Errorf("spool %s: %w", dir, err)
	}
	o.spool, o.q = s, q
	if len(q) > 0 {
		log.Info("spooled events from a previous run queued first", "dir", dir, "count", len(q))
	}
	return o, nil
}

// Dir is the spool directory; "" in memory.
func (o *Outbox) Dir() string {
	if o.spool == nil {
		return ""
	}
	return o.spool.dir
}

// DirectAttempt bounds how long Send, with a spool, waits for JetStream
// to acknowledge a post it publishes itself before it spools the post
// instead.
const DirectAttempt = 500 * time.Millisecond

// Send hands over a post event; with a spool, it is durable when Send
// returns: stored by JetStream, or else on disk. An envelope of phase pre
// is delivered on its own subject alike: an enforcement point that
// reports a refusal without waiting for its decision (the gateway's
// unauthenticated requests) sends it here. An event the spool cannot take
// (a full or failing disk) is logged and still queued in memory, and Full
// holds until it is delivered.
//
// With a spool, a started outbox with nothing waiting publishes the post
// itself and waits up to DirectAttempt for its acknowledgement: JetStream,
// where every record of the audit trail is kept, then has it, and the
// spool's two fsyncs are not needed. Otherwise, or if that publish fails, the post is spooled and
// queued as before, with the same Nats-Msg-Id, so a publish that was
// stored after all is not stored twice.
func (o *Outbox) Send(post *schemas.ToolCall) {
	if o.spool != nil && o.sendDirect(post) {
		return
	}
	e := queued{post: post}
	if o.spool != nil {
		var err error
		if e.file, err = o.spool.write(post); err != nil {
			o.log.Error("post event not spooled: held in memory only; no call is taken until it is delivered",
				"tool_call_id", post.ToolCallID, "err", err)
		}
	}
	o.mu.Lock()
	o.q = append(o.q, e)
	if o.spool != nil && e.file == "" {
		o.unspooled++
	}
	o.mu.Unlock()
	o.cond.Broadcast()
}

// sendDirect publishes post and reports whether JetStream acknowledged it
// within DirectAttempt; it publishes nothing (false) unless the outbox is
// started and nothing waits in it, so that no post overtakes one queued
// before it, and the connection is up.
func (o *Outbox) sendDirect(post *schemas.ToolCall) bool {
	o.mu.Lock()
	js := o.js
	if js == nil || o.stopped || len(o.q) > 0 || o.busy || js.Conn().Status() != nats.CONNECTED {
		o.mu.Unlock()
		return false
	}
	o.direct++
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.direct--
		o.mu.Unlock()
	}()
	msg, err := postMsg(post)
	if err != nil {
		return false // Send queues it, and the loop logs and drops it
	}
	ctx, cancel := context.WithTimeout(context.Background(), DirectAttempt)
	defer cancel()
	_, err = js.PublishMsg(ctx, msg)
	return err == nil
}

// Full reports whether no more calls should be taken: OutboxLimit events
// wait, or an event the spool could not take does (fail closed: no new
// call runs while a report would not survive a crash).
func (o *Outbox) Full() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.q) >= OutboxLimit || o.unspooled > 0
}

// pending is how many posts are not yet acknowledged.
func (o *Outbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.q) + o.direct
	if o.busy {
		n++
	}
	return n
}

// Start runs the delivery loop on js until Drain stops it.
func (o *Outbox) Start(js jetstream.JetStream) {
	o.mu.Lock()
	o.js = js
	o.mu.Unlock()
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
			e := o.q[0]
			o.q = o.q[1:]
			o.busy = true
			o.mu.Unlock()
			delivered := o.deliver(js, e.post)
			if delivered && e.file != "" {
				o.spool.remove(e.file)
			}
			o.mu.Lock()
			o.busy = false
			switch {
			case !delivered:
				o.q = append([]queued{e}, o.q...)
			case o.spool != nil && e.file == "":
				o.unspooled--
			}
			o.mu.Unlock()
			o.cond.Broadcast()
		}
	}()
}

// Drain waits up to wait for every queued post to be delivered, then stops
// the loop and releases the spool. It returns how many were not
// delivered; the spooled ones stay in the spool for the next OpenOutbox,
// and it logs those that were held in memory only (lost).
func (o *Outbox) Drain(wait time.Duration) int {
	deadline := time.Now().Add(wait)
	for o.pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	o.mu.Lock()
	o.stopped = true
	started := o.js != nil
	o.mu.Unlock()
	close(o.stop)
	o.cond.Broadcast()
	if started {
		<-o.done
	}
	if o.spool != nil {
		o.spool.close()
		o.mu.Lock()
		lost := o.unspooled
		o.mu.Unlock()
		if lost > 0 {
			o.log.Error("post events the spool could not take are lost", "dir", o.spool.dir, "count", lost)
		}
	}
	return o.pending()
}

// deliver publishes one post until it is acknowledged, or until Drain
// gives up (false).
func (o *Outbox) deliver(js jetstream.JetStream, post *schemas.ToolCall) bool {
	msg, err := postMsg(post)
	if err != nil {
		o.log.Error("post event cannot be encoded; dropped", "tool_call_id", post.ToolCallID, "err", err)
		return true
	}
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

// postMsg is post's message on its call subject, with its Nats-Msg-Id.
func postMsg(post *schemas.ToolCall) (*nats.Msg, error) {
	raw, err := json.Marshal(post)
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: schemas.CallSubject(post.Phase, post.EPID, post.ServerID), Data: raw, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, schemas.CallMsgID(post.EPID, post.ToolCallID, post.Phase, raw))
	return msg, nil
}
