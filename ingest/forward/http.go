package forward

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// httpSender posts events to a Splunk HEC or a webhook, in requests of at
// most BatchBytes. A request is accepted only by a 2xx answer; any other
// answer, or none, fails the whole Send.
type httpSender struct {
	url        string
	auth       string // the Authorization header, "" for none
	hec        bool
	d          Destination
	client     *http.Client
	batchBytes int
	now        func() time.Time
	body       []byte
}

// StatusError is a non-2xx answer of an HTTP destination.
type StatusError struct {
	Destination string
	Code        int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("destination %s answered HTTP %d", e.Destination, e.Code)
}

func newHTTPSender(d Destination) (*httpSender, error) {
	u, _ := url.Parse(d.URL)
	cfg, err := d.TLS.tlsConfig(u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("destination %s: %w", d.Name, err)
	}
	s := &httpSender{url: d.URL, hec: d.Type == TypeHEC, d: d, batchBytes: d.BatchBytes, now: time.Now,
		client: &http.Client{
			Timeout: time.Duration(d.Timeout),
			Transport: &http.Transport{TLSClientConfig: cfg, MaxIdleConns: 2, IdleConnTimeout: time.Minute,
				TLSHandshakeTimeout: time.Duration(d.Timeout), ResponseHeaderTimeout: time.Duration(d.Timeout)},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
	if d.TokenFile != "" {
		tok, err := readToken(d.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("destination %s: %w", d.Name, err)
		}
		s.auth = "Bearer " + tok
		if s.hec {
			s.auth = "Splunk " + tok
		}
	}
	return s, nil
}

// Send posts events, in order, in as many requests as BatchBytes asks.
func (s *httpSender) Send(ctx context.Context, events []Event) (uint64, error) {
	for len(events) > 0 {
		n := s.encode(events)
		if err := s.post(ctx); err != nil {
			return 0, err
		}
		events = events[n:]
	}
	return 0, nil
}

// Lost is false: a 2xx answer is the destination's acceptance.
func (s *httpSender) Lost(uint64) bool { return false }

// Close releases idle connections.
func (s *httpSender) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

// encode renders the first events that fit in BatchBytes (at least one)
// into s.body and returns how many.
func (s *httpSender) encode(events []Event) int {
	b := s.body[:0]
	if !s.hec {
		b = append(b, '[')
	}
	n := 0
	for i := range events {
		mark := len(b)
		if !s.hec && i > 0 {
			b = append(b, ',')
		}
		if s.hec {
			b = s.appendHEC(b, &events[i])
		} else {
			b = appendWebhook(b, &events[i])
		}
		if n > 0 && len(b)+1 > s.batchBytes {
			b = b[:mark]
			break
		}
		n++
	}
	if !s.hec {
		b = append(b, ']')
	}
	s.body = b
	return n
}

func (s *httpSender) post(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(s.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "talosd-forward")
	if s.auth != "" {
		req.Header.Set("Authorization", s.auth)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("destination %s: %w", s.d.Name, redactURL(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &StatusError{Destination: s.d.Name, Code: resp.StatusCode}
	}
	return nil
}

// redactURL drops the URL from a client error (its query may hold a
// secret some webhooks put there); the destination's name says which.
func redactURL(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// appendHEC appends one HEC event object: the CloudEvent as "event" and
// the indexed fields as "fields" (strings or arrays of strings, as HEC
// wants them).
func (s *httpSender) appendHEC(b []byte, e *Event) []byte {
	b = append(b, `{"time":`...)
	b = strconv.AppendFloat(b, e.unixTime(s.now()), 'f', 3, 64)
	b = appendMember(b, "host", s.d.Hostname)
	b = appendMember(b, "source", appName)
	b = appendMember(b, "sourcetype", s.d.Sourcetype)
	b = appendMember(b, "index", s.d.Index)
	b = append(b, `,"event":`...)
	b = appendRaw(b, e)
	b = append(b, `,"fields":{"event_id":`...)
	b = jsonkit.AppendString(b, e.ID)
	b = appendIndexed(b, e)
	return append(b, "}}\n"...)
}

// appendWebhook appends one webhook object: the indexed fields and the
// CloudEvent as "event".
func appendWebhook(b []byte, e *Event) []byte {
	b = append(b, `{"id":`...)
	b = jsonkit.AppendString(b, e.ID)
	b = appendMember(b, "time", e.Time)
	b = appendIndexed(b, e)
	b = append(b, `,"event":`...)
	b = appendRaw(b, e)
	return append(b, '}')
}

// appendIndexed appends the members SIEMs index (empty ones left out).
func appendIndexed(b []byte, e *Event) []byte {
	b = appendMember(b, "type", e.Type)
	b = appendMember(b, "subject", e.Subject)
	b = appendMember(b, "receipt_id", e.ReceiptID)
	b = appendMember(b, "agent", e.Agent)
	b = appendMember(b, "tool", e.Tool)
	b = appendMember(b, "decision", e.Decision)
	if len(e.Reasons) > 0 {
		b = append(b, `,"reason_codes":[`...)
		for i, r := range e.Reasons {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonkit.AppendString(b, r)
		}
		b = append(b, ']')
	}
	return b
}

func appendMember(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	b = append(b, ',')
	b = jsonkit.AppendString(b, name)
	b = append(b, ':')
	return jsonkit.AppendString(b, value)
}

// appendRaw appends the stored record: its bytes unchanged when it is
// JSON (the signed CloudEvent), else as a JSON string.
func appendRaw(b []byte, e *Event) []byte {
	if e.JSON {
		return append(b, e.Raw...)
	}
	return jsonkit.AppendString(b, strings.ToValidUTF8(string(e.Raw), "\uFFFD"))
}
