// Package jspub stores messages in JetStream streams and reads the
// streams' acknowledgements in one pass.
//
// nats.go's jetstream.PublishMsg decodes each acknowledgement, a few dozen
// bytes, with encoding/json: on the hot path that was a tenth of an
// enforcement point's CPU per call, and its deep call stack grew the stack
// of every goroutine that published. Publish sends and retries as
// PublishMsg does without options and returns the same values and errors;
// ParseAck reads the acknowledgements nats-server writes and leaves
// anything else to encoding/json. New gives a jetstream.JetStream whose
// PublishMsg, Publish and PublishMsgAsync without options use them.
package jspub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// New is jetstream.New(nc, opts...) with PublishMsg and Publish, when
// given no publish options, sent by Publish and read by ParseAck, and
// PublishMsgAsync without options sent likewise without waiting (its
// acknowledgements read by ParseAck too).
func New(nc *nats.Conn, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	return jetStream{js, &asyncPublisher{nc: nc}}, nil
}

// jetStream is a jetstream.JetStream whose publishes without options
// read their acknowledgements in one pass.
type jetStream struct {
	jetstream.JetStream
	async *asyncPublisher
}

func (j jetStream) PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if len(opts) > 0 {
		return j.JetStream.PublishMsgAsync(msg, opts...)
	}
	return j.async.publish(msg)
}

func (j jetStream) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if len(opts) > 0 {
		return j.JetStream.PublishMsg(ctx, msg, opts...)
	}
	return publish(ctx, j.Conn(), msg, j.Options().DefaultTimeout)
}

func (j jetStream) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

// Publish stores msg in the stream that takes its subject and returns the
// stream's acknowledgement, as jetstream.JetStream.PublishMsg does without
// options: a ctx without a deadline gets nats.go's default of 5 s, a
// "no responders" answer (no stream, or one electing its leader) is sent
// again jetstream.DefaultPubRetryAttempts times jetstream.DefaultPubRetryWait
// apart and is then jetstream.ErrNoStreamResponse, and an error the stream
// answers is a *jetstream.APIError.
func Publish(ctx context.Context, nc *nats.Conn, msg *nats.Msg) (*jetstream.PubAck, error) {
	return publish(ctx, nc, msg, defaultTimeout)
}

// defaultTimeout is jetstream's default for a request whose context has
// no deadline.
const defaultTimeout = 5 * time.Second

// publish is Publish with timeout for a ctx without a deadline.
func publish(ctx context.Context, nc *nats.Conn, msg *nats.Msg, timeout time.Duration) (*jetstream.PubAck, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		select {
		case <-ctx.Done():
		case <-time.After(jetstream.DefaultPubRetryWait):
		}
		resp, err = nc.RequestMsgWithContext(ctx, msg)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return nil, err
	}
	return ParseAck(resp.Data)
}

// ParseAck reads a stream's answer to a publish: its acknowledgement, or
// the error it answered (a *jetstream.APIError, wrapped as nats.go wraps
// it). An answer that is neither is jetstream.ErrInvalidJSAck.
func ParseAck(b []byte) (*jetstream.PubAck, error) {
	if ack, ok := parseAck(b); ok {
		return ack, nil
	}
	return parseAckJSON(b)
}

// parseAckJSON is ParseAck with encoding/json, as nats.go decodes an
// acknowledgement: what the one-pass reader must agree with.
func parseAckJSON(b []byte) (*jetstream.PubAck, error) {
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, jetstream.ErrInvalidJSAck
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("nats: %w", resp.Error)
	}
	if resp.PubAck == nil || resp.PubAck.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	return resp.PubAck, nil
}

// parseAck reads an acknowledgement as nats-server writes it: one object
// whose members are stream, seq, domain and duplicate, its strings
// without escapes, with or without white space between tokens. ok is
// false for anything else (an error, another member, an escape), which
// ParseAck leaves to encoding/json.
func parseAck(b []byte) (ack *jetstream.PubAck, ok bool) {
	r := jsonkit.Reader{B: b}
	ack = &jetstream.PubAck{}
	seen, ok := r.Object(true, func(name string) (bit uint, ok bool) {
		switch name {
		case "stream":
			ack.Stream, ok = r.PlainString()
			return 1, ok
		case "seq":
			ack.Sequence, ok = r.Uint()
			return 2, ok
		case "domain":
			ack.Domain, ok = r.PlainString()
			return 4, ok
		case "duplicate":
			ack.Duplicate = r.Literal("true")
			return 8, ack.Duplicate || r.Literal("false")
		}
		return 0, false
	})
	r.Space()
	if !ok || r.I != len(b) || ack.Stream == "" || seen&2 == 0 {
		return nil, false
	}
	return ack, true
}
