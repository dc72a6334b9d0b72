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
// PublishMsg and Publish without options use them.
package jspub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// New is jetstream.New(nc, opts...) with PublishMsg and Publish, when
// given no publish options, sent by Publish and read by ParseAck.
func New(nc *nats.Conn, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	return jetStream{js}, nil
}

// jetStream is a jetstream.JetStream whose publishes without options
// read their acknowledgements in one pass.
type jetStream struct{ jetstream.JetStream }

func (j jetStream) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if len(opts) > 0 {
		return j.JetStream.PublishMsg(ctx, msg, opts...)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, j.Options().DefaultTimeout)
		defer cancel()
	}
	return Publish(ctx, j.Conn(), msg)
}

func (j jetStream) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

// defaultTimeout is jetstream's default for a request whose context has
// no deadline.
const defaultTimeout = 5 * time.Second

// Publish stores msg in the stream that takes its subject and returns the
// stream's acknowledgement, as jetstream.JetStream.PublishMsg does without
// options: a ctx without a deadline gets nats.go's default of 5 s, a
// "no responders" answer (no stream, or one electing its leader) is sent
// again jetstream.DefaultPubRetryAttempts times jetstream.DefaultPubRetryWait
// apart and is then jetstream.ErrNoStreamResponse, and an error the stream
// answers is a *jetstream.APIError.
func Publish(ctx context.Context, nc *nats.Conn, msg *nats.Msg) (*jetstream.PubAck, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultTimeout)
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
// whose members are stream, seq, domain and duplicate, strings of
// printable ASCII without escapes, with or without spaces between tokens. ok is false for
// anything else (an error, another member, an escape), which ParseAck
// leaves to encoding/json.
func parseAck(b []byte) (ack *jetstream.PubAck, ok bool) {
	s := scanner{b: b}
	if !s.byte('{') {
		return nil, false
	}
	ack = &jetstream.PubAck{}
	var seen uint8
	for {
		key, ok := s.str()
		if !ok || !s.byte(':') {
			return nil, false
		}
		var bit uint8
		switch key {
		case "stream":
			bit = 1
			if ack.Stream, ok = s.str(); !ok {
				return nil, false
			}
		case "seq":
			bit = 2
			if ack.Sequence, ok = s.uint(); !ok {
				return nil, false
			}
		case "domain":
			bit = 4
			if ack.Domain, ok = s.str(); !ok {
				return nil, false
			}
		case "duplicate":
			bit = 8
			if ack.Duplicate, ok = s.bool(); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
		if seen&bit != 0 {
			return nil, false // a member twice: encoding/json keeps the last
		}
		seen |= bit
		if s.byte(',') {
			continue
		}
		if !s.byte('}') || !s.end() || ack.Stream == "" || seen&2 == 0 {
			return nil, false
		}
		return ack, true
	}
}

// scanner reads JSON tokens from b, skipping the white space before each.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) skip() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte consumes c if it is the next token.
func (s *scanner) byte(c byte) bool {
	s.skip()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (s *scanner) end() bool {
	s.skip()
	return s.i == len(s.b)
}

// str reads a string of printable ASCII without escapes (encoding/json
// would replace invalid UTF-8).
func (s *scanner) str() (string, bool) {
	if !s.byte('"') {
		return "", false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := string(s.b[s.i:j])
			s.i = j + 1
			return v, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return "", false
		}
	}
	return "", false
}

// uint reads an unsigned integer without sign, fraction or exponent.
func (s *scanner) uint() (uint64, bool) {
	s.skip()
	j := s.i
	for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
		j++
	}
	if j == s.i || (j-s.i > 1 && s.b[s.i] == '0') {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s.b[s.i:j]), 10, 64)
	if err != nil {
		return 0, false
	}
	s.i = j
	return v, true
}

// bool reads true or false.
func (s *scanner) bool() (bool, bool) {
	s.skip()
	switch {
	case len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "true":
		s.i += 4
		return true, true
	case len(s.b)-s.i >= 5 && string(s.b[s.i:s.i+5]) == "false":
		s.i += 5
		return false, true
	}
	return false, false
}
