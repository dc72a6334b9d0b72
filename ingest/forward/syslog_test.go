package forward

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/testenv"
)

const sampleReceipt = `{"data":{"agent_id":"agent-\"7]","decision":"deny","reason_codes":["KILL_SWITCH","REPLAY"],"tool_id":"files/read_file"},` +
	`"id":"0190a3c2-0000-7000-8000-000000000001","time":"2026-03-01T10:20:30.456Z","type":"dev.talos.receipt.decision.v1"}`

// AppendFrame: an octet count that is the message's length in bytes, an
// RFC 5424 header with the event's time, kind and indexed fields escaped
// as RFC 5424 asks, and the record unchanged as MSG.
func TestAppendFrame(t *testing.T) {
	cases := []struct {
		name, facility, raw string
		want                string // the message after the octet count
	}{
		{"deny receipt, audit facility", "", sampleReceipt,
			`<109>1 2026-03-01T10:20:30.456Z host-1 talos - receipt.decision [talos@32473 id="0190a3c2-0000-7000-8000-000000000001" ` +
				`type="dev.talos.receipt.decision.v1" receipt_id="0190a3c2-0000-7000-8000-000000000001" agent="agent-\"7\]" ` +
				`tool="files/read_file" decision="deny" reason_codes="KILL_SWITCH,REPLAY" stream_seq="42"] ` + sampleReceipt},
		{"checkpoint, local3", "local3", `{"id":"c1","type":"dev.talos.checkpoint.v1","time":"2026-03-01T10:20:30Z","data":{"chain_id":"w-1"}}`,
			`<158>1 2026-03-01T10:20:30.000Z host-1 talos - checkpoint [talos@32473 id="c1" type="dev.talos.checkpoint.v1" stream_seq="42"] ` +
				`{"id":"c1","type":"dev.talos.checkpoint.v1","time":"2026-03-01T10:20:30Z","data":{"chain_id":"w-1"}}`},
		{"not a CloudEvent", "7", "not json\n", `<62>1 - host-1 talos - - [talos@32473 id="stream-seq-42" stream_seq="42"] not json` + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newSyslogFormat(Destination{Hostname: "host-1", Facility: c.facility})
			e := ParseEvent("talos.audit.x", []byte(c.raw), 42)
			frame, _ := f.AppendFrame(nil, nil, &e)
			n, msg, ok := bytes.Cut(frame, []byte(" "))
			if !ok || string(n) != strconv.Itoa(len(msg)) {
				t.Fatalf("octet count %q for a message of %d bytes", n, len(msg))
			}
			if string(msg) != c.want {
				t.Fatalf("message\n got %s\nwant %s", msg, c.want)
			}
		})
	}
}

// A receiver whose certificate comes from a CA the destination does not
// name is refused at the handshake, and nothing reaches it; the same
// sender with the right CA delivers.
func TestSyslogTLSUnknownCA(t *testing.T) {
	served := testenv.NewTLSFiles(t, t.TempDir())
	other := testenv.NewTLSFiles(t, t.TempDir())
	rs := testenv.StartRsyslog(t, testenv.RsyslogOptions{TLS: served})
	e := ParseEvent("talos.audit.receipt.decision.files", []byte(sampleReceipt), 1)
	send := func(ca string) error {
		d, err := Destination{Name: "siem", Type: TypeSyslog, Address: rs.Addr(), TLS: &TLSFiles{CAFile: ca}}.withDefaults("host-1")
		if err != nil {
			t.Fatal(err)
		}
		s, err := newSyslogSender(d)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		_, err = s.Send(context.Background(), []Event{e})
		return err
	}
	err := send(other.CAFile)
	if !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Fatalf("a certificate from an unknown CA: %v, want x509.UnknownAuthorityError", err)
	}
	time.Sleep(200 * time.Millisecond)
	if lines := rs.Lines(t); len(lines) != 0 {
		t.Fatalf("the refused receiver got %q", lines)
	}
	if err := send(served.CAFile); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(rs.Lines(t)) == 1 })
	if line := string(rs.Lines(t)[0]); !strings.HasPrefix(line, "109 2026-03-01T10:20:30.456") ||
		!strings.Contains(line, " host-1 talos - receipt.decision [talos@32473 id=") || !strings.HasSuffix(line, "] "+sampleReceipt) {
		t.Fatalf("rsyslog parsed the frame as %q", line)
	}
}

// A receiver that dies makes the connection its batches were written on
// Lost at once; the next Send connects anew to the restarted receiver.
func TestSyslogLostWhenReceiverDies(t *testing.T) {
	rs := testenv.StartRsyslog(t, testenv.RsyslogOptions{})
	d, err := Destination{Name: "siem", Type: TypeSyslog, Address: rs.Addr()}.withDefaults("host-1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSyslogSender(d)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := ParseEvent("talos.audit.receipt.decision.files", []byte(sampleReceipt), 1)
	tok, err := s.Send(context.Background(), []Event{e})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if s.Lost(tok) {
		t.Fatal("a healthy connection reported lost")
	}
	rs.Kill()
	testenv.WaitFor(t, 5*time.Second, func() bool { return s.Lost(tok) })
	if _, err := s.Send(context.Background(), []Event{e}); err == nil {
		t.Fatal("Send to a dead receiver succeeded")
	}
	rs.Start(t)
	tok2, err := s.Send(context.Background(), []Event{e})
	if err != nil || tok2 == tok || s.Lost(tok2) {
		t.Fatalf("after the restart: token %d (was %d), %v", tok2, tok, err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(rs.Lines(t)) == 2 })
}
