package jspub

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// asyncPublisher sends publishes without waiting, as
// jetstream.JetStream.PublishMsgAsync does without options, and reads
// their acknowledgements with ParseAck, outside its lock. nats.go decodes
// each with encoding/json while holding the lock every publish takes: in
// an enforce worker, whose lanes wait for three such acknowledgements per
// call, its handler was 4 to 6 % of the CPU (BENCHMARKS.md).
//
// Each publish gets a reply subject of its own under one wildcard
// subscription on the connection's inbox prefix. A "no responders"
// answer (no stream, or one electing its leader) is sent again
// jetstream.DefaultPubRetryAttempts times jetstream.DefaultPubRetryWait
// apart, as nats.go does, and is then jetstream.ErrNoStreamResponse; an
// error the stream answers is its *jetstream.APIError, unwrapped, as
// nats.go delivers it. A publish whose answer never comes (lost in a
// reconnect, say) is given up after staleAfter with
// jetstream.ErrAsyncPublishTimeout, so that nothing waits for it for ever
// and the pending set stays bounded; callers wait on their own deadlines
// well before that.
type asyncPublisher struct {
	nc *nats.Conn

	mu      sync.Mutex
	prefix  string // the reply subjects' prefix, ending in "."; set once, by the first publish
	sub     *nats.Subscription
	pending map[string]*pubFuture // by reply token
	next    uint64
	swept   time.Time // when stale futures were last looked for
}

// staleAfter is how long an unanswered publish is waited for.
var staleAfter = time.Minute

// pubFuture is one publish's jetstream.PubAckFuture. Exactly one of ok and
// err receives a value, once.
type pubFuture struct {
	msg     *nats.Msg
	reply   string
	sent    time.Time
	retries int
	ok      chan *jetstream.PubAck
	err     chan error
}

func (f *pubFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *pubFuture) Err() <-chan error            { return f.err }
func (f *pubFuture) Msg() *nats.Msg               { return f.msg }

// publish sends m with a reply subject of its own and returns its future.
func (p *asyncPublisher) publish(m *nats.Msg) (jetstream.PubAckFuture, error) {
	if m.Reply != "" {
		return nil, jetstream.ErrAsyncPublishReplySubjectSet
	}
	now := time.Now()
	p.mu.Lock()
	if p.sub == nil {
		// Set before the subscription's goroutine starts, which reads
		// prefix without the lock.
		p.prefix, p.pending = p.nc.NewInbox()+".", map[string]*pubFuture{}
		sub, err := p.nc.Subscribe(p.prefix+"*", p.answered)
		if err != nil {
			p.mu.Unlock()
			return nil, err
		}
		p.sub = sub
	}
	if now.Sub(p.swept) > staleAfter/4 {
		p.sweepLocked(now)
	}
	p.next++
	token := strconv.FormatUint(p.next, 36)
	f := &pubFuture{msg: m, reply: p.prefix + token, sent: now,
		ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	p.pending[token] = f
	p.mu.Unlock()
	if err := p.send(f); err != nil {
		p.take(token)
		return nil, err
	}
	return f, nil
}

// send publishes f's message with f's reply subject.
func (p *asyncPublisher) send(f *pubFuture) error {
	return p.nc.PublishMsg(&nats.Msg{Subject: f.msg.Subject, Reply: f.reply, Data: f.msg.Data, Header: f.msg.Header})
}

// take removes and returns the future of token (nil if none waits).
func (p *asyncPublisher) take(token string) *pubFuture {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.pending[token]
	delete(p.pending, token)
	return f
}

// answered resolves the future a stream's answer is for.
func (p *asyncPublisher) answered(m *nats.Msg) {
	token, ok := strings.CutPrefix(m.Subject, p.prefix)
	if !ok {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" { // no responders
		p.mu.Lock()
		f := p.pending[token]
		if f != nil && f.retries < jetstream.DefaultPubRetryAttempts {
			f.retries++
			p.mu.Unlock()
			time.AfterFunc(jetstream.DefaultPubRetryWait, func() {
				if err := p.send(f); err != nil {
					if f := p.take(token); f != nil {
						f.err <- err
					}
				}
			})
			return
		}
		delete(p.pending, token)
		p.mu.Unlock()
		if f != nil {
			f.err <- jetstream.ErrNoStreamResponse
		}
		return
	}
	f := p.take(token)
	if f == nil {
		return // given up on, or an answer to a publish retried after it came
	}
	ack, err := ParseAck(m.Data)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) {
			err = apiErr
		}
		f.err <- err
		return
	}
	f.ok <- ack
}

// sweepLocked gives up on the publishes unanswered for staleAfter.
func (p *asyncPublisher) sweepLocked(now time.Time) {
	p.swept = now
	for token, f := range p.pending {
		if now.Sub(f.sent) > staleAfter {
			delete(p.pending, token)
			f.err <- jetstream.ErrAsyncPublishTimeout
		}
	}
}
