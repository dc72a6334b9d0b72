package ep

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// ErrNoDecision is returned when no decision arrived within the timeout.
// An enforcement point MUST treat it as a deny (fail closed).
var ErrNoDecision = errors.New("no decision within timeout: deny (fail closed)")

// ErrDuplicateCall is returned when TALOS_CALLS answers a call's first
// publish as a duplicate: a message with its Nats-Msg-Id
// (<ep_id>:<tool_call_id>:<phase>:<digest>) that this client did not publish is
// already there, and the call was not stored. An enforcement point MUST
// treat it as a deny (fail closed).
var ErrDuplicateCall = errors.New("TALOS_CALLS already holds a call with this Nats-Msg-Id that this client did not publish: the call was not stored (fail closed)")

// maxSent bounds the Nats-Msg-Ids a Client remembers having published.
const maxSent = 4096

// ClientOptions configure a Client. The zero value means the defaults.
type ClientOptions struct {
	// ReaskAfter is how long a call waits for its decision before the
	// client asks TALOS_DECISIONS for it, and then between two asks
	// (default 1 s; a decision normally arrives in milliseconds).
	ReaskAfter time.Duration
	// PublishAttempt bounds one attempt at storing a call in TALOS_CALLS
	// (default 2 s): an attempt lost with a stream leader is never
	// acknowledged, and is sent again, same bytes and Nats-Msg-Id, until
	// the call's deadline.
	PublishAttempt time.Duration
	// Keys, when not empty, are talosd's public keys: a decision is taken
	// only if its receipt is signed by one of them and names the
	// decision's receipt id.
	Keys verify.KeySet
}

// Client is the enforcement-point side of Talos: it publishes calls to
// TALOS_CALLS on its own subjects (talos.call.<phase>.<ep_id>.<server_id>)
// and waits for their decisions on talos.decision.<ep_id>.>, asking
// TALOS_DECISIONS again for one it missed (SendHashed). A decision is
// taken for a call only if it names the call's tool_call_id and phase and,
// when the client knows the call's request hash, its receipt's
// request_hash is that hash. It is safe for concurrent use.
type Client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	epID string
	sub  *nats.Subscription
	o    ClientOptions

	mu      sync.Mutex
	waiters map[string]*waiter // key: tool_call_id + ":" + phase
	sent    sentIDs

	reasked atomic.Uint64
}

// waiter is a call waiting for its decision.
type waiter struct {
	ch          chan *schemas.Decision
	requestHash string // "" when the client could not read the envelope it sent
	keys        verify.KeySet
}

// NewClient subscribes to the decisions for epID, with the default
// options.
func NewClient(nc *nats.Conn, js jetstream.JetStream, epID string) (*Client, error) {
	return NewClientWithOptions(nc, js, epID, ClientOptions{})
}

// NewClientWithOptions subscribes to the decisions for epID
// (talos.decision.<ep_id>.>).
func NewClientWithOptions(nc *nats.Conn, js jetstream.JetStream, epID string, o ClientOptions) (*Client, error) {
	if !schemas.ValidID(epID) {
		return nil, fmt.Errorf("ep_id %q must match %s", epID, schemas.IDPattern)
	}
	if o.ReaskAfter <= 0 {
		o.ReaskAfter = time.Second
	}
	if o.PublishAttempt <= 0 {
		o.PublishAttempt = 2 * time.Second
	}
	c := &Client{nc: nc, js: js, epID: epID, o: o, waiters: map[string]*waiter{}}
	sub, err := nc.Subscribe(schemas.DecisionSubjects(epID), c.onDecision)
	if err != nil {
		return nil, fmt.Errorf("subscribe decisions: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	c.sub = sub
	return c, nil
}

// Reasked is how many decisions this client obtained by asking
// TALOS_DECISIONS again (their live reply missed).
func (c *Client) Reasked() uint64 { return c.reasked.Load() }

// EPID is the enforcement point id this client speaks for.
func (c *Client) EPID() string { return c.epID }

// Close stops listening for decisions.
func (c *Client) Close() error { return c.sub.Unsubscribe() }

func (c *Client) onDecision(m *nats.Msg) {
	d, err := schemas.ParseDecision(m.Data)
	if err != nil {
		return
	}
	c.mu.Lock()
	w := c.waiters[d.ToolCallID+":"+d.Phase]
	c.mu.Unlock()
	if w == nil || !w.accepts(d) {
		return
	}
	select {
	case w.ch <- d:
	default: // a redelivered call answered twice; the first answer stands
	}
}

// accepts reports whether d decides the request w sent: its receipt's
// request_hash is the request's hash. A receipt without one is taken only
// for what it can be, a VAL-HTC-001 deny (the worker could not read the
// envelope). Any other answer is another request's and is ignored: the
// call then ends without a decision (fail closed).
func (w *waiter) accepts(d *schemas.Decision) bool {
	if len(w.keys) > 0 {
		ev, err := verify.VerifyEvent(d.Receipt, w.keys)
		if err != nil || ev.ID != d.ReceiptID {
			return false
		}
	}
	if w.requestHash == "" {
		return true
	}
	got, ok := receiptRequestHash(d.Receipt)
	if !ok {
		return false
	}
	if got == "" {
		return d.Decision == schemas.DecisionDeny && slices.Equal(d.ReasonCodes, []string{schemas.CodeEnvelopeInvalid})
	}
	return got == w.requestHash
}

// receiptRequestHash reads data.request_hash of a receipt CloudEvent (""
// when it has none); ok is false when the receipt is not a JSON object
// with an object data. A receipt as the worker stores it is canonical
// JSON, whose member is found in one walk without decoding the rest; any
// other receipt, and one without the member, are decoded.
func receiptRequestHash(receipt []byte) (hash string, ok bool) {
	if m, found, err := jsonkit.FindPath(receipt, 0, "data", "request_hash"); err == nil && found {
		v := receipt[m.ValStart:m.End]
		if end, _, ok := jsonkit.ScanString(v, 0); ok && end == len(v) {
			return jsonkit.Unescape(v[1 : end-1]), true
		}
	}
	var r struct {
		Data *struct {
			RequestHash string `json:"request_hash"`
		} `json:"data"`
	}
	if json.Unmarshal(receipt, &r) != nil || r.Data == nil {
		return "", false
	}
	return r.Data.RequestHash, true
}

// Call publishes the envelope and waits for its decision, the one whose
// receipt names its request's hash (a request that cannot be
// canonicalised has none: the worker denies it VAL-HTC-001).
func (c *Client) Call(ctx context.Context, call *schemas.ToolCall) (*schemas.Decision, error) {
	raw, err := json.Marshal(call)
	if err != nil {
		return nil, err
	}
	hash, _ := requestHash(&call.Request)
	return c.SendHashed(ctx, call.Phase, call.ServerID, call.ToolCallID, hash, raw)
}

// Send publishes raw envelope bytes (which may be malformed, for testing
// the workers) and waits for the decision on toolCallID and phase whose
// receipt names the hash of raw's request (RequestHashOf; any decision on
// toolCallID and phase if raw has no request to hash). The wait ends with
// ErrNoDecision when ctx has no deadline after 10 s.
func (c *Client) Send(ctx context.Context, phase, serverID, toolCallID string, raw []byte) (*schemas.Decision, error) {
	return c.SendHashed(ctx, phase, serverID, toolCallID, RequestHashOf(raw), raw)
}

// SendHashed is Send for a caller that knows the request hash of raw
// (hex sha256 of the RFC 8785 form of its request, as HashRequest sets
// it): it is not computed again.
//
// A decision missed (a reply lost with a node, or sent while this client
// was reconnecting) is asked for again: after ReaskAfter without one, and
// every ReaskAfter until ctx's deadline, the client reads the call's
// decision from TALOS_DECISIONS, where the worker stored the reply before
// it acked the call, and takes it on the same terms as a live one. A call
// not decided yet (in the stream, or being decided) is asked for until
// the deadline; only then is it ErrNoDecision.
func (c *Client) SendHashed(ctx context.Context, phase, serverID, toolCallID, requestHash string, raw []byte) (*schemas.Decision, error) {
	return c.SendPrepared(ctx, &Prepared{Phase: phase, ServerID: serverID, ToolCallID: toolCallID, RequestHash: requestHash, Raw: raw})
}

// Prepared is an envelope ready to send with what the client would
// otherwise derive from its bytes on the way: a caller that builds its
// envelopes ahead (a load generator, which signs them before its clock
// starts) derives these then too.
type Prepared struct {
	Phase, ServerID, ToolCallID string
	// RequestHash is the hash of Raw's request (RequestHashOf, or as
	// HashRequest sets it); "" when Raw has none to hash.
	RequestHash string
	// MsgID is the call's Nats-Msg-Id, schemas.CallMsgID of this client's
	// ep_id, ToolCallID, Phase and Raw; "" to have the client compute it.
	MsgID string
	Raw   []byte
}

// SendPrepared is SendHashed for a Prepared envelope.
func (c *Client) SendPrepared(ctx context.Context, p *Prepared) (*schemas.Decision, error) {
	phase, toolCallID := p.Phase, p.ToolCallID
	key := toolCallID + ":" + phase
	w := &waiter{ch: make(chan *schemas.Decision, 1), requestHash: p.RequestHash, keys: c.o.Keys}
	c.mu.Lock()
	c.waiters[key] = w
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, key)
		c.mu.Unlock()
	}()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	if err := c.publish(ctx, p); err != nil {
		if ctx.Err() != nil {
			// Perhaps stored all the same: its decision may be recorded.
			return nil, fmt.Errorf("%w (%w)", ErrNoDecision, err)
		}
		return nil, err
	}
	return c.await(ctx, w, phase, toolCallID)
}

// await waits for w's decision until ctx ends, asking TALOS_DECISIONS for
// it every ReaskAfter.
func (c *Client) await(ctx context.Context, w *waiter, phase, toolCallID string) (*schemas.Decision, error) {
	tick := time.NewTimer(c.o.ReaskAfter)
	defer tick.Stop()
	for {
		select {
		case d := <-w.ch:
			return d, nil
		case <-ctx.Done():
			return nil, ErrNoDecision
		case <-tick.C:
			if d := c.reask(ctx, w, phase, toolCallID); d != nil {
				c.reasked.Add(1)
				return d, nil
			}
			tick.Reset(c.o.ReaskAfter)
		}
	}
}

// reask reads call toolCallID's decision for phase from TALOS_DECISIONS
// (a direct get of talos.decision.<ep_id>.<phase>.<tool_call_id>, which
// NATS lets this enforcement point's user make for its own ep_id only).
// It returns the decision if one is stored and w accepts it, else nil:
// not decided yet, not stored on the replica that answered yet, or no
// answer (the caller asks again).
func (c *Client) reask(ctx context.Context, w *waiter, phase, toolCallID string) *schemas.Decision {
	if !schemas.SafeToken(toolCallID) {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, c.o.ReaskAfter)
	defer cancel()
	m, err := c.nc.RequestWithContext(rctx, schemas.DecisionGetSubject(c.epID, phase, toolCallID), nil)
	if err != nil || m.Header.Get("Status") != "" { // 404: nothing stored (yet)
		return nil
	}
	d, err := schemas.ParseDecision(m.Data)
	if err != nil || d.ToolCallID != toolCallID || d.Phase != phase || !w.accepts(d) {
		return nil
	}
	return d
}

// Publish stores a call in TALOS_CALLS without waiting for its decision,
// on this client's subject talos.call.<phase>.<ep_id>.<server_id> with
// Nats-Msg-Id <ep_id>:<tool_call_id>:<phase>:<digest of raw> (none
// without a toolCallID). An attempt that gets no acknowledgement within
// PublishAttempt (a stream leader lost, a reconnect) is made again with
// the same bytes until ctx ends. The stream answering it as a duplicate is
// ErrDuplicateCall unless this client published that Nats-Msg-Id before
// (a retry of its own publish, among the last 4,096 it made, or an
// earlier attempt of this one whose acknowledgement was lost).
func (c *Client) Publish(ctx context.Context, phase, serverID, toolCallID string, raw []byte) error {
	return c.publish(ctx, &Prepared{Phase: phase, ServerID: serverID, ToolCallID: toolCallID, Raw: raw})
}

// publish is Publish for a Prepared envelope.
func (c *Client) publish(ctx context.Context, p *Prepared) error {
	msg := &nats.Msg{Subject: schemas.CallSubject(p.Phase, c.epID, p.ServerID), Data: p.Raw, Header: nats.Header{}}
	id, first := "", false
	if p.ToolCallID != "" {
		if id = p.MsgID; id == "" {
			id = schemas.CallMsgID(c.epID, p.ToolCallID, p.Phase, p.Raw)
		}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		c.mu.Lock()
		first = c.sent.add(id)
		c.mu.Unlock()
	}
	var ack *jetstream.PubAck
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.o.PublishAttempt)
		a, err := c.js.PublishMsg(actx, msg)
		cancel()
		if err == nil {
			ack = a
			first = first && attempt == 1
			break
		}
		if ctx.Err() != nil || !lostPublish(err) {
			return fmt.Errorf("publish call: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish call: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if ack.Duplicate && first {
		// Not this client's message: a later publish of the id is no retry.
		c.mu.Lock()
		c.sent.remove(id)
		c.mu.Unlock()
		return ErrDuplicateCall
	}
	return nil
}

// lostPublish reports whether a publish error may mean the message was
// lost (or stored and its acknowledgement lost): worth sending again.
func lostPublish(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// sentIDs remembers the last maxSent Nats-Msg-Ids a Client published, so
// that a duplicate acknowledgement of one of them is known for a retry of
// its own publish.
type sentIDs struct {
	slot  map[string]int // id -> its place in order
	order []string       // ring of ids, oldest at next once full
	next  int
}

// add records id and reports whether it is new.
func (s *sentIDs) add(id string) bool {
	if _, ok := s.slot[id]; ok {
		return false
	}
	if s.slot == nil {
		s.slot = map[string]int{}
	}
	i := len(s.order)
	if i < maxSent {
		s.order = append(s.order, id)
	} else {
		i = s.next
		if old := s.order[i]; s.slot[old] == i {
			delete(s.slot, old)
		}
		s.order[i] = id
		s.next = (i + 1) % maxSent
	}
	s.slot[id] = i
	return true
}

// remove forgets id.
func (s *sentIDs) remove(id string) { delete(s.slot, id) }

// RequestHashOf is the request hash of envelope bytes: hex sha256 of the
// RFC 8785 form of their request member, or "" when raw is not a JSON
// object with a request object that can be canonicalised.
func RequestHashOf(raw []byte) string {
	var env struct {
		Request json.RawMessage `json:"request"`
	}
	if json.Unmarshal(raw, &env) != nil || len(env.Request) == 0 || env.Request[0] != '{' {
		return ""
	}
	canon, err := jsonkit.Canonicalize(env.Request)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

// NewCall builds a phase-pre envelope with fresh ids: tool_call_id and
// trace_id are UUIDv7, correlation_id is 128 random bits (base64url).
func NewCall(epID, serverID, toolName string, arguments any) (*schemas.ToolCall, error) {
	args, err := json.Marshal(arguments)
	if err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	var corr [16]byte
	if _, err := rand.Read(corr[:]); err != nil {
		return nil, err
	}
	return &schemas.ToolCall{
		SchemaVersion: schemas.ToolCallSchemaVersion,
		Phase:         schemas.PhasePre,
		ToolCallID:    uuid.Must(uuid.NewV7()).String(),
		TraceID:       uuid.Must(uuid.NewV7()).String(),
		CorrelationID: base64.RawURLEncoding.EncodeToString(corr[:]),
		SessionID:     "session-" + uuid.NewString()[:8],
		EPID:          epID,
		ServerID:      serverID,
		ToolName:      toolName,
		Transport:     "mcp",
		Actor:         schemas.Actor{Kind: "agent", AgentID: "agent-" + epID},
		Request:       schemas.Request{Name: toolName, Arguments: args},
		IssuedAt:      time.Now().UTC().Format(schemas.TimeFormat),
	}, nil
}

// SignedPost builds the phase-post envelope of a decided pre call and,
// with a signer, signs it again (a post event has its own issued_at). A
// nil result (the call did not run, or failed upstream) leaves result out.
func SignedPost(pre *schemas.ToolCall, result any, ok bool, started, ended time.Time, s *CallSigner) (*schemas.ToolCall, error) {
	post, err := PostOf(pre, result, ok, started, ended)
	if err != nil {
		return nil, err
	}
	if result == nil {
		post.Result = nil
	}
	if s != nil {
		if err := s.Sign(post); err != nil {
			return nil, err
		}
	}
	return post, nil
}

// PostOf builds the phase-post envelope for a decided pre call.
func PostOf(pre *schemas.ToolCall, result any, ok bool, started, ended time.Time) (*schemas.ToolCall, error) {
	res, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	post := *pre
	post.Phase = schemas.PhasePost
	post.Result = res
	post.OK = &ok
	post.Timing = &schemas.Timing{
		StartedAt: started.UTC().Format(schemas.TimeFormat),
		EndedAt:   ended.UTC().Format(schemas.TimeFormat),
	}
	post.IssuedAt = ended.UTC().Format(schemas.TimeFormat)
	return &post, nil
}

// RecordNoDecision publishes the post event of pre, a call that got no
// decision by its deadline (ErrNoDecision), so that the refusal is in the
// audit trail too: no result, error DECISION_TIMEOUT of kind "denied",
// signed again with s when s is not nil (as the gateway's are). It waits up to 5 s for
// TALOS_CALLS to store it. The gateway records its refusals likewise.
func (c *Client) RecordNoDecision(pre *schemas.ToolCall, s *CallSigner) error {
	now := time.Now()
	post, err := SignedPost(pre, nil, false, now, now, s)
	if err != nil {
		return err
	}
	post.Error = &schemas.CallError{Code: schemas.CodeDecisionTimeout, Kind: "denied", Message: "no decision by the deadline"}
	raw, err := json.Marshal(post)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Publish(ctx, post.Phase, post.ServerID, post.ToolCallID, raw)
}
