package natsserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/natstls"
)

func TestStartTempDirRemoved(t *testing.T) {
	n, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := n.tempDir
	if dir == "" {
		t.Fatal("no temp dir recorded")
	}
	n.Shutdown()
	n.Shutdown() // idempotent
	if _, err := nats.Connect(n.URL(), nats.Timeout(time.Second)); err == nil {
		t.Fatal("server still accepts connections after Shutdown")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("store dir %s not removed", dir)
	}
}

// busyPort listens on a loopback port until the test ends (or it is
// closed), as another process holding it would.
func busyPort(t *testing.T) net.Listener {
	t.Helper()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	return busy
}

func TestStartAddrInUse(t *testing.T) {
	busy := busyPort(t)
	host, port, err := ParseAddr(busy.Addr().String())
	if err != nil || host != "127.0.0.1" || port == 0 {
		t.Fatalf("ParseAddr(%s) = %q, %d, %v", busy.Addr(), host, port, err)
	}
	start := time.Now()
	if _, err := Start(Options{Host: host, Port: port}); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("Start on a busy port: %v, want ErrAddrInUse", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Start on a busy port took %s; it should fail at once", d)
	}
	for _, bad := range []string{"4222", "host:port", ""} {
		if _, _, err := ParseAddr(bad); err == nil {
			t.Errorf("ParseAddr(%q): no error", bad)
		}
	}
}

// TestTakenPorts: when a server is not ready, the fixed ports it does not
// listen on and something else holds are named (a port taken between
// Start's check and the server's listen); the ports it listens on are not.
func TestTakenPorts(t *testing.T) {
	busy := busyPort(t)
	_, held, _ := ParseAddr(busy.Addr().String())
	n, err := Start(Options{Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	_, own, _ := ParseAddr(n.srv.Addr().String())
	got := takenPorts(n.srv, Options{Port: own, Cluster: &ClusterOptions{Name: "c", Port: held}})
	if want := []string{busy.Addr().String()}; !slices.Equal(got, want) {
		t.Fatalf("taken ports %v, want %v", got, want)
	}
	busy.Close()
	if got := takenPorts(n.srv, Options{Port: own, Cluster: &ClusterOptions{Name: "c", Port: held}}); len(got) != 0 {
		t.Fatalf("taken ports %v once the other listener closed, want none", got)
	}
}

// TestTLSRequired: with TLS set, the server presents the generated
// certificate and admits only clients that verify it. A plaintext client is
// refused, and so is a TLS client that does not trust the CA or trusts
// another one. Across a restart the certificates are reused, so a client
// keeps trusting the same ca.pem.
func TestTLSRequired(t *testing.T) {
	tlsDir := filepath.Join(t.TempDir(), "nats-tls")
	opts := Options{Dir: t.TempDir(), TLS: &natstls.Server{Dir: tlsDir}}
	n, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n.Shutdown() }()
	if !strings.HasPrefix(n.URL(), "tls://127.0.0.1:") {
		t.Fatalf("URL %q, want tls://127.0.0.1:…", n.URL())
	}
	ca := opts.TLS.CA()
	hostPort := strings.TrimPrefix(n.URL(), "tls://")

	// A plaintext client: reads INFO, sends CONNECT and PING in clear.
	conn, err := net.DialTimeout("tcp", hostPort, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	info, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(info, `"tls_required":true`) {
		t.Fatalf("INFO %q (%v): want tls_required", info, err)
	}
	if _, err := conn.Write([]byte("CONNECT {\"verbose\":false}\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(conn) // until the server closes it (or the deadline)
	conn.Close()
	if strings.Contains(string(rest), "PONG") {
		t.Fatalf("a plaintext client got an answer: %q", rest)
	}
	other := natstls.Layout(t.TempDir())
	if _, err := natstls.Ensure(filepath.Dir(other.CA), nil); err != nil {
		t.Fatal(err)
	}
	refused := map[string][]nats.Option{
		"no CA (system roots)": nil,
		"another CA":           {nats.RootCAs(other.CA)},
	}
	for name, o := range refused {
		nc, err := nats.Connect(n.URL(), append(o, nats.Timeout(5*time.Second))...)
		if err == nil {
			nc.Close()
			t.Fatalf("%s: connected", name)
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: %v, want a certificate error", name, err)
		}
	}

	// The process that embeds the server reaches it in process, without
	// TLS, even with the CA option a network client would have.
	inproc, err := nats.Connect(n.URL(), nats.RootCAs(ca), nats.InProcessServer(n.NATS()), NoTLS)
	if err != nil {
		t.Fatalf("in process: %v", err)
	}
	if _, err := inproc.TLSConnectionState(); err == nil {
		t.Error("the in-process connection started TLS")
	}
	if err := inproc.Publish("x", nil); err != nil || inproc.Flush() != nil {
		t.Fatalf("in process: publish: %v", err)
	}
	inproc.Close()

	use := func() {
		t.Helper()
		// nats:// on purpose: the client upgrades because the server
		// requires TLS, and verifies it against the CA.
		nc, err := nats.Connect(strings.Replace(n.URL(), "tls://", "nats://", 1), nats.RootCAs(ca))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if st, err := nc.TLSConnectionState(); err != nil || !st.HandshakeComplete {
			t.Fatalf("connection is not TLS: %v", err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "t.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	use()
	files := natstls.Layout(tlsDir)
	before := map[string][]byte{}
	for _, p := range []string{files.CA, files.CAKey, files.Cert, files.Key} {
		before[p], _ = os.ReadFile(p)
	}
	n.Shutdown()
	if n, err = Start(opts); err != nil {
		t.Fatal(err)
	}
	for p, b := range before {
		if after, _ := os.ReadFile(p); len(b) == 0 || !bytes.Equal(after, b) {
			t.Errorf("restart rewrote %s", p)
		}
	}
	use()
}

// TestURLUnspecifiedHost: a server listening on every address is reached
// on the loopback address its certificate names.
func TestURLUnspecifiedHost(t *testing.T) {
	n, err := Start(Options{Host: "0.0.0.0", TLS: &natstls.Server{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	if !strings.HasPrefix(n.URL(), "tls://127.0.0.1:") {
		t.Fatalf("URL %q", n.URL())
	}
}
