package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/jspub"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/ingest/natstls"
)

// The embedded NATS server of package natsserver, under the names the tests
// use.
type (
	NATS        = natsserver.Server
	NATSOptions = natsserver.Options
)

// DefaultNATSMaxPayload is the largest message the embedded server accepts.
const DefaultNATSMaxPayload = natsserver.DefaultMaxPayload

// StartNATS starts an embedded nats-server with JetStream (natsserver.Start).
func StartNATS(opts NATSOptions) (*NATS, error) { return natsserver.Start(opts) }

// NATSForTest starts an embedded server stored in t.TempDir() and shuts it
// down when the test ends.
func NATSForTest(t testing.TB) *NATS {
	t.Helper()
	n, err := StartNATS(NATSOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n
}

// NATSTLSForTest is a TLS setting for NATSOptions.TLS: a CA and a server
// certificate generated in t.TempDir() (kept across restarts of servers
// given the same setting), and the CA file clients must trust (nats.RootCAs,
// --nats-ca, TALOS_NATS_CA). The embedded servers of the tests run without
// TLS unless a test asks for it; talosd's own embedded server runs with it.
func NATSTLSForTest(t testing.TB) (tls *natstls.Server, ca string) {
	t.Helper()
	s := &natstls.Server{Dir: t.TempDir()}
	return s, s.CA()
}

// ConnectJS connects to url (reconnecting for ever, so a test may restart
// the server) and closes the connection when the test ends.
func ConnectJS(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jspub.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// WaitFor polls ok every 20 ms and fails the test if it is not true within d.
func WaitFor(t testing.TB, d time.Duration, ok func() bool) {
	t.Helper()
	WaitUntil(t, d, 20*time.Millisecond, "a condition", ok)
}

// WaitUntil polls ok every "every" (longer for a check that costs a query)
// and fails the test, naming what it waited for, if ok is not true within d.
func WaitUntil(t testing.TB, d, every time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(every)
	}
}

// StreamMsgs reads every message stream name holds, oldest first (deleted
// ones skipped).
func StreamMsgs(t testing.TB, js jetstream.JetStream, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}
