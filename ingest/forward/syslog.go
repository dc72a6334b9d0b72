package forward

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// SDID is the SD-ID of the structured-data element that carries the
// indexed fields (RFC 5424 §6.3.2; 32473 is the enterprise number RFC 5612
// reserves for documentation and examples).
const SDID = "talos@32473"

// appName is the syslog APP-NAME of every message.
const appName = "talos"

// syslogFormat renders events as RFC 5424 messages.
type syslogFormat struct {
	facility int
	hostname string // "-" when the configured one is not printable ASCII
}

func newSyslogFormat(d Destination) syslogFormat {
	f, _ := facility(d.Facility)
	h := d.Hostname
	if h == "" || len(h) > 255 || !printableASCII(h) {
		h = "-"
	}
	return syslogFormat{facility: f, hostname: h}
}

// AppendFrame appends e as one octet-counted frame (RFC 6587 §3.4.1, the
// framing RFC 5425 prescribes for TLS): the message's length in bytes, a
// space, and the RFC 5424 message
//
//	<PRI>1 TIMESTAMP HOSTNAME talos - MSGID [talos@32473 id="…" …] CLOUDEVENT
//
// whose MSG is the stored record byte for byte. scratch is reused.
func (f syslogFormat) AppendFrame(dst, scratch []byte, e *Event) (frame, scratchOut []byte) {
	msg := f.appendMessage(scratch[:0], e)
	dst = strconv.AppendInt(dst, int64(len(msg)), 10)
	dst = append(dst, ' ')
	return append(dst, msg...), msg
}

func (f syslogFormat) appendMessage(b []byte, e *Event) []byte {
	sev := 6 // informational
	if e.Denied() {
		sev = 5 // notice
	}
	b = append(b, '<')
	b = strconv.AppendInt(b, int64(f.facility*8+sev), 10)
	b = append(b, ">1 "...)
	if t, err := time.Parse(time.RFC3339Nano, e.Time); err == nil {
		b = t.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
	} else {
		b = append(b, '-')
	}
	b = append(b, ' ')
	b = append(b, f.hostname...)
	b = append(b, ' ')
	b = append(b, appName...)
	b = append(b, " - "...)
	b = append(b, e.Kind()...)
	b = append(b, " ["...)
	b = append(b, SDID...)
	b = appendParam(b, "id", e.ID)
	b = appendParam(b, "type", e.Type)
	b = appendParam(b, "receipt_id", e.ReceiptID)
	b = appendParam(b, "agent", e.Agent)
	b = appendParam(b, "tool", e.Tool)
	b = appendParam(b, "decision", e.Decision)
	b = appendParam(b, "reason_codes", strings.Join(e.Reasons, ","))
	b = appendParam(b, "stream_seq", strconv.FormatUint(e.StreamSeq, 10))
	b = append(b, "] "...)
	return append(b, e.Raw...)
}

// appendParam appends ` name="value"` with RFC 5424's escapes (", \ and ]),
// or nothing for an empty value.
func appendParam(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	b = append(b, ' ')
	b = append(b, name...)
	b = append(b, `="`...)
	for i := 0; i < len(value); i++ {
		switch c := value[i]; c {
		case '"', '\\', ']':
			b = append(b, '\\', c)
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// syslogSender writes frames to one TCP or TLS connection at a time. It
// is used by one goroutine (the destination's loop).
//
// TCP tells the writer nothing of what the receiver did with the bytes,
// so a write that returned is not yet a delivery: each connection has a
// reader that notices at once when the receiver closes or resets it (a
// receiver that dies with unread data resets it), and a batch counts as
// delivered only while the connection it was written on is still open
// ConfirmAfter later (Lost).
type syslogSender struct {
	addr    string
	tls     *tls.Config // nil: plain TCP
	timeout time.Duration
	format  syslogFormat

	cur     *syslogConn
	gen     uint64 // connections opened so far; cur is number gen
	frame   []byte
	scratch []byte
}

// syslogConn is one connection and its reader. Shutdown: Close the conn,
// then wait for dead (the reader returns on the closed conn).
type syslogConn struct {
	c    net.Conn
	w    *bufio.Writer
	gen  uint64
	dead chan struct{} // closed when the reader saw EOF or an error
}

func newSyslogSender(d Destination) (*syslogSender, error) {
	s := &syslogSender{addr: d.Address, timeout: time.Duration(d.Timeout), format: newSyslogFormat(d)}
	if d.TLS != nil {
		host, _, _ := net.SplitHostPort(d.Address)
		cfg, err := d.TLS.tlsConfig(host)
		if err != nil {
			return nil, fmt.Errorf("destination %s: %w", d.Name, err)
		}
		s.tls = cfg
	}
	return s, nil
}

// Send writes events in order on the current connection (a new one if it
// has none or the receiver closed it) and flushes them. It returns the
// connection's number for Lost. On error the connection is dropped; the
// batch is to be sent again whole (duplicates carry the same id).
func (s *syslogSender) Send(ctx context.Context, events []Event) (uint64, error) {
	if s.cur != nil && s.Lost(s.cur.gen) {
		s.drop()
	}
	if s.cur == nil {
		if err := s.dial(ctx); err != nil {
			return 0, err
		}
	}
	c := s.cur
	if err := c.c.SetWriteDeadline(time.Now().Add(s.timeout)); err != nil {
		s.drop()
		return 0, err
	}
	for i := range events {
		s.frame, s.scratch = s.format.AppendFrame(s.frame[:0], s.scratch, &events[i])
		if _, err := c.w.Write(s.frame); err != nil {
			s.drop()
			return 0, fmt.Errorf("syslog write to %s: %w", s.addr, err)
		}
	}
	if err := c.w.Flush(); err != nil {
		s.drop()
		return 0, fmt.Errorf("syslog write to %s: %w", s.addr, err)
	}
	return c.gen, nil
}

// Lost reports whether connection gen has failed or been replaced: what
// was written on it may not have reached the receiver.
func (s *syslogSender) Lost(gen uint64) bool {
	if s.cur == nil || s.cur.gen != gen {
		return true
	}
	select {
	case <-s.cur.dead:
		return true
	default:
		return false
	}
}

func (s *syslogSender) dial(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	nd := &net.Dialer{Timeout: s.timeout}
	var (
		c   net.Conn
		err error
	)
	if s.tls != nil {
		c, err = (&tls.Dialer{NetDialer: nd, Config: s.tls}).DialContext(ctx, "tcp", s.addr)
	} else {
		c, err = nd.DialContext(ctx, "tcp", s.addr)
	}
	if err != nil {
		return fmt.Errorf("syslog connect %s: %w", s.addr, err)
	}
	s.gen++
	sc := &syslogConn{c: c, w: bufio.NewWriterSize(c, 64<<10), gen: s.gen, dead: make(chan struct{})}
	go func() {
		defer close(sc.dead)
		_, _ = io.Copy(io.Discard, c) // a syslog receiver sends nothing: this ends at its close
	}()
	s.cur = sc
	return nil
}

// drop closes the current connection and waits for its reader.
func (s *syslogSender) drop() {
	if s.cur == nil {
		return
	}
	_ = s.cur.c.Close()
	<-s.cur.dead
	s.cur = nil
}

// Close drops the connection.
func (s *syslogSender) Close() error {
	s.drop()
	return nil
}
