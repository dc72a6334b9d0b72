package ep

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas"
)

// ErrNoDecision is returned when no decision arrived within the timeout.
// An enforcement point MUST treat it as a deny (fail closed).
var ErrNoDecision = errors.New("no decision within timeout: deny (fail closed)")

// Client is the enforcement-point side of Talos: it publishes calls to
// TALOS_CALLS and waits for their decisions on talos.decision.<ep_id>.
// It is safe for concurrent use.
type Client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	epID string
	sub  *nats.Subscription

	mu      sync.Mutex
	waiters map[string]chan *schemas.Decision // key: tool_call_id + ":" + phase
}

// NewClient subscribes to the decisions for epID.
func NewClient(nc *nats.Conn, js jetstream.JetStream, epID string) (*Client, error) {
	if !schemas.ValidID(epID) {
		return nil, fmt.Errorf("ep_id %q must match %s", epID, schemas.IDPattern)
	}
	c := &Client{nc: nc, js: js, epID: epID, waiters: map[string]chan *schemas.Decision{}}
	sub, err := nc.Subscribe(schemas.DecisionSubject(epID), c.onDecision)
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
	ch := c.waiters[d.ToolCallID+":"+d.Phase]
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- d:
		default: // a redelivered call answered twice; the first answer stands
		}
	}
}

// Call publishes the envelope and waits for its decision.
func (c *Client) Call(ctx context.Context, call *schemas.ToolCall) (*schemas.Decision, error) {
	raw, err := json.Marshal(call)
	if err != nil {
		return nil, err
	}
	return c.Send(ctx, call.Phase, call.ServerID, call.ToolCallID, raw)
}

// Send publishes raw envelope bytes (which may be malformed, for testing
// the workers) and waits for the decision on toolCallID and phase. The
// wait ends with ErrNoDecision when ctx has no deadline after 10 s.
func (c *Client) Send(ctx context.Context, phase, serverID, toolCallID string, raw []byte) (*schemas.Decision, error) {
	key := toolCallID + ":" + phase
	ch := make(chan *schemas.Decision, 1)
	c.mu.Lock()
	c.waiters[key] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, key)
		c.mu.Unlock()
	}()
	if err := c.Publish(ctx, phase, serverID, toolCallID, raw); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	select {
	case d := <-ch:
		return d, nil
	case <-ctx.Done():
		return nil, ErrNoDecision
	}
}

// Publish stores a call in TALOS_CALLS without waiting for its decision.
func (c *Client) Publish(ctx context.Context, phase, serverID, toolCallID string, raw []byte) error {
	msg := &nats.Msg{Subject: schemas.CallSubject(phase, serverID), Data: raw, Header: nats.Header{}}
	if toolCallID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, schemas.CallMsgID(toolCallID, phase))
	}
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish call: %w", err)
	}
	return nil
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
