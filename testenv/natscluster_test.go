package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNATSCluster: three nodes with JetStream clustered; an R3 stream keeps
// taking messages when its leader stops (another node leads), and the node
// restarted on its ports with its store catches up with what it missed.
func TestNATSCluster(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			o := NATSClusterOptions{}
			var opts []nats.Option
			if withTLS {
				srv, ca := NATSTLSForTest(t)
				o.TLS = srv
				opts = append(opts, nats.RootCAs(ca))
			}
			c := NATSClusterForTest(t, o)
			if c.Size() != 3 || len(strings.Split(c.URLs(), ",")) != 3 {
				t.Fatalf("%d nodes, URLs %q", c.Size(), c.URLs())
			}
			if withTLS && !strings.HasPrefix(c.NodeURL(0), "tls://") {
				t.Fatalf("node URL %q, want tls://", c.NodeURL(0))
			}
			checkClusterFailover(t, c, opts)
		})
	}
}

func checkClusterFailover(t *testing.T, c *NATSCluster, opts []nats.Option) {
	nc, err := nats.Connect(c.URLs(), append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	sent := 0 // the message id of a resent publish stays the same
	publish := func(n int) {
		for range n {
			sent++
			for {
				// Each attempt waits 2 s at most: a request lost with
				// the old leader gets no reply, and must not use up ctx.
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, "t.x", []byte("m"), jetstream.WithMsgID(fmt.Sprintf("m-%d", sent)))
				pcancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond) // an election under way
			}
		}
	}
	publish(10)
	leader := c.StreamLeader(t, js, "T")
	c.Stop(leader)
	if c.Node(leader) != nil {
		t.Fatal("a stopped node is still there")
	}
	publish(10)
	if now := c.StreamLeader(t, js, "T"); now == leader {
		t.Fatalf("node %d still leads after it stopped", leader)
	}
	c.Restart(t, leader)
	WaitFor(t, 30*time.Second, func() bool {
		n, err := StreamReplicas(ctx, js, "T")
		return err == nil && n == 3
	})
	// The restarted node holds all 20 messages: read them there alone.
	direct, err := nats.Connect(c.NodeURL(leader), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if got := direct.ConnectedServerName(); got != c.Name(leader) {
		t.Fatalf("connected to %q, want %q", got, c.Name(leader))
	}
	djs, _ := jetstream.New(direct)
	st, err := djs.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().State.Msgs != 20 {
		t.Fatalf("%d messages after the restart, want 20", st.CachedInfo().State.Msgs)
	}
}

// The routes of a TLS cluster are mutual TLS: a route client without a
// certificate is refused.
func TestNATSClusterRoutesRequireCertificate(t *testing.T) {
	srv, ca := NATSTLSForTest(t)
	c := NATSClusterForTest(t, NATSClusterOptions{TLS: srv})
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	addr := c.Node(0).NATS().ClusterAddr().String()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("route without a client certificate: %v, want a certificate error", err)
	}
}
