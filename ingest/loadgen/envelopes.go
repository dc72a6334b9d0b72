package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/schemas"
)

// envelope is one call of a benchmark run, built, signed and
// marshalled before its scheduled send, so that none of that is on the
// measured path.
type envelope struct {
	toolCallID  string
	requestHash string // of the call's request, which its post event repeats
	pre         []byte
	post        []byte // the call's post event; nil unless --post
	// The Nats-Msg-Ids of pre and post (schemas.CallMsgID), derived from
	// their bytes as they are built, as the signatures are.
	preID, postID string
}

// Maker builds the envelopes of one run. It is safe for concurrent
// use.
type Maker struct {
	Server, Tool string
	Session      string          // every call's session_id: the run, as ClickHouse counts it
	Args         json.RawMessage // the same arguments for every call
	Signer       *ep.CallSigner
	Post         bool // also build each call's post event
	// Traced gives each call a sampled parent span of a trace of its own
	// (trace_id and parent_span_id), as a traced enforcement point sends
	// it: a worker with traces on then records a decision span per
	// envelope.
	Traced bool
}

// postResultText is the CallToolResult of every bench post event.
var postResultText = json.RawMessage(`{"content":[{"type":"text","text":"bench: 3 entries"}]}`)

// make builds one call for the enforcement point epID: fresh tool_call_id,
// trace_id and correlation_id, the request_hash, and with a signer the
// capability chain and sender signature. With post, it also builds the
// call's post event as if the tool had run for 1 ms right after the call
// was issued (the timing the worker records in the ToolCallEvent), signed
// the same way.
func (m *Maker) make(epID string) (*envelope, error) {
	call, err := ep.NewCall(epID, m.Server, m.Tool, m.Args)
	if err != nil {
		return nil, err
	}
	call.SessionID = m.Session
	if m.Traced {
		var ids [24]byte
		_, _ = rand.Read(ids[:])
		call.TraceID, call.ParentSpanID = tracing.UUID(trace.TraceID(ids[:16])), hex.EncodeToString(ids[16:])
	}
	if m.Signer != nil {
		call.Actor.AgentID = m.Signer.Holder()
		if err := m.Signer.Sign(call); err != nil {
			return nil, err
		}
	}
	env := &envelope{toolCallID: call.ToolCallID}
	if env.pre, err = json.Marshal(call); err != nil {
		return nil, err
	}
	env.requestHash = ep.RequestHashOf(env.pre)
	env.preID = schemas.CallMsgID(epID, call.ToolCallID, schemas.PhasePre, env.pre)
	if !m.Post {
		return env, nil
	}
	started := time.Now()
	post, err := ep.PostOf(call, postResultText, true, started, started.Add(time.Millisecond))
	if err != nil {
		return nil, err
	}
	if m.Signer != nil {
		if err := m.Signer.Sign(post); err != nil { // a post event has its own issued_at
			return nil, err
		}
	}
	if env.post, err = json.Marshal(post); err != nil {
		return nil, err
	}
	env.postID = schemas.CallMsgID(epID, post.ToolCallID, schemas.PhasePost, env.post)
	return env, nil
}

// envelopeQueues hands each enforcement point its envelopes, in order, from
// one producer goroutine per enforcement point. Each producer keeps at most
// depth envelopes ready; ready() returns once every queue holds its first
// depth (or all of its envelopes), so a depth of the whole run prepares
// everything before the clock starts. A smaller depth bounds memory, and
// the producers then build and sign during the run, on the same CPU.
//
// Shutdown: stop() cancels the producers and waits for them; it must be
// called once the queues are no longer read.
type envelopeQueues struct {
	q      []chan *envelope
	cancel context.CancelFunc
	filled sync.WaitGroup // one per producer, done at its first fill
	wg     sync.WaitGroup // the producers

	mu  sync.Mutex
	err error // the first build error; its producer's queue is closed early
}

// startEnvelopes starts a producer per enforcement point: epIDs[i] gets
// counts[i] envelopes, at most depth ahead (depth >= 1).
func startEnvelopes(m *Maker, epIDs []string, counts []int, depth int) *envelopeQueues {
	ctx, cancel := context.WithCancel(context.Background())
	qs := &envelopeQueues{q: make([]chan *envelope, len(epIDs)), cancel: cancel}
	for i, ep := range epIDs {
		q := make(chan *envelope, min(depth, counts[i]))
		qs.q[i] = q
		qs.filled.Add(1)
		qs.wg.Add(1)
		go func(ep string, n int) {
			defer qs.wg.Done()
			defer close(q)
			signalled := false
			fill := func() {
				if !signalled {
					signalled = true
					qs.filled.Done()
				}
			}
			defer fill()
			for k := 0; k < n; k++ {
				env, err := m.make(ep)
				if err != nil {
					qs.fail(err)
					return
				}
				select {
				case q <- env:
				case <-ctx.Done():
					return
				}
				if k+1 == cap(q) {
					fill()
				}
			}
		}(ep, counts[i])
	}
	return qs
}

func (qs *envelopeQueues) fail(err error) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.err == nil {
		qs.err = err
	}
}

// ready waits until every queue is filled and returns the first build
// error, if any.
func (qs *envelopeQueues) ready() (prepared int, err error) {
	qs.filled.Wait()
	for _, q := range qs.q {
		prepared += len(q)
	}
	return prepared, qs.failed()
}

// failed is the first build error so far.
func (qs *envelopeQueues) failed() error {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.err
}

// stop ends the producers and waits for them.
func (qs *envelopeQueues) stop() {
	qs.cancel()
	for _, q := range qs.q { // unblock producers waiting on a full queue
		for range q {
		}
	}
	qs.wg.Wait()
}

// splitCalls spreads calls over n enforcement points, the first calls%n
// one more than the others.
func splitCalls(calls, n int) []int {
	counts := make([]int, n)
	for i := range counts {
		counts[i] = calls / n
		if i < calls%n {
			counts[i]++
		}
	}
	return counts
}

// send sends a prepared envelope in phase and waits for its decision (the
// one whose receipt names the call's request hash), at most timeout.
func send(client *ep.Client, phase, server string, env *envelope, timeout time.Duration) (*schemas.Decision, error) {
	p := ep.Prepared{Phase: phase, ServerID: server, ToolCallID: env.toolCallID, RequestHash: env.requestHash, Raw: env.pre, MsgID: env.preID}
	if phase == schemas.PhasePost {
		p.Raw, p.MsgID = env.post, env.postID
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return client.SendPrepared(ctx, &p)
}
