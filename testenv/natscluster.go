package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/ingest/natstls"
)

// NATSClusterOptions configure NATSClusterForTest. The zero value is a
// cluster of three nodes without TLS or authentication.
type NATSClusterOptions struct {
	// Nodes is the number of nodes (default 3).
	Nodes int
	// TLS is every node's certificate (NATSTLSForTest): clients must speak
	// TLS, and the routes between the nodes are mutual TLS. Nil: plaintext.
	TLS *natstls.Server
	// Users are the users every node admits (natsserver.Users); nil admits
	// anyone.
	Users []*server.User
	// Logs sends the nodes' logs to stderr.
	Logs bool
	// Cold returns as soon as every node listens, without waiting for
	// JetStream: the cluster is still forming its meta group, as one whose
	// nodes and clients all start at once (docker-compose) is.
	Cold bool
}

// NATSCluster is a NATS cluster of embedded nats-servers in this process,
// on loopback ports, with JetStream clustered over their routes: each node
// has its own store directory, and streams and buckets may have up to one
// replica per node. A node can be stopped and started again, one at a
// time, on the same ports with the same store, as an operator restarts a
// machine. Nodes are numbered from 0. It is safe for concurrent use.
type NATSCluster struct {
	t    testing.TB
	name string

	mu    sync.Mutex // guards nodes' srv
	nodes []*clusterNode
}

type clusterNode struct {
	opts natsserver.Options
	srv  *natsserver.Server // nil while stopped
}

// NATSClusterForTest starts a cluster (three nodes by default), waits until
// JetStream has elected its meta leader and every node is current (unless
// Cold), and shuts every node down when the test ends.
func NATSClusterForTest(t testing.TB, o NATSClusterOptions) *NATSCluster {
	t.Helper()
	n := o.Nodes
	if n <= 0 {
		n = 3
	}
	c := &NATSCluster{t: t, name: "talos-test"}
	// The ports are free when picked and taken when a node listens: a
	// server another test starts in between may take one. The cluster then
	// starts over on other ports (every node names every route).
	for attempt := 1; ; attempt++ {
		err := c.startOn(t, n, o)
		if err == nil {
			break
		}
		c.shutdown()
		if !errors.Is(err, natsserver.ErrAddrInUse) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("%v; starting the cluster again on other ports", err)
	}
	// Registered after the nodes' store directories (t.TempDir), so that
	// it runs before they are removed: a running node still writes there.
	t.Cleanup(c.shutdown)
	if !o.Cold {
		c.WaitJetStream(t)
	}
	return c
}

// startOn configures n nodes on fresh ports and store directories and
// starts them.
func (c *NATSCluster) startOn(t testing.TB, n int, o NATSClusterOptions) error {
	ports := freePorts(t, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	nodes := make([]*clusterNode, 0, n)
	for i := range n {
		nodes = append(nodes, &clusterNode{opts: natsserver.Options{
			Dir:        t.TempDir(),
			Port:       ports[i],
			ServerName: fmt.Sprintf("n%d", i),
			Logs:       o.Logs,
			Users:      o.Users,
			TLS:        o.TLS,
			Cluster:    &natsserver.ClusterOptions{Name: c.name, Port: ports[n+i], Routes: routes},
		}})
	}
	c.mu.Lock()
	c.nodes = nodes
	c.mu.Unlock()
	for i := range nodes {
		if err := c.start(i); err != nil {
			return err
		}
	}
	return nil
}

func (c *NATSCluster) start(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.srv != nil {
		return fmt.Errorf("testenv: cluster node %d already runs", i)
	}
	srv, err := natsserver.Start(nd.opts)
	if err != nil {
		return fmt.Errorf("testenv: cluster node %d: %w", i, err)
	}
	nd.srv = srv
	return nil
}

func (c *NATSCluster) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nd := range c.nodes {
		if nd.srv != nil {
			nd.srv.Shutdown()
			nd.srv = nil
		}
	}
}

// Size is the number of nodes.
func (c *NATSCluster) Size() int { return len(c.nodes) }

// Name is node i's server name, as stream and consumer info name their
// leader and replicas.
func (c *NATSCluster) Name(i int) string { return c.nodes[i].opts.ServerName }

// Index is the number of the node whose server name is name, or -1.
func (c *NATSCluster) Index(name string) int {
	for i, nd := range c.nodes {
		if nd.opts.ServerName == name {
			return i
		}
	}
	return -1
}

// NodeURL is node i's client URL (nats://, or tls:// with TLS), the same
// whether or not it runs.
func (c *NATSCluster) NodeURL(i int) string {
	scheme := "nats"
	if c.nodes[i].opts.TLS != nil {
		scheme = "tls"
	}
	return fmt.Sprintf("%s://127.0.0.1:%d", scheme, c.nodes[i].opts.Port)
}

// URLs is every node's client URL, comma-separated: what nats.Connect and
// --nats-url take to reach whichever node is up.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.NodeURL(i)
	}
	return strings.Join(urls, ",")
}

// Node is node i's server, nil while it is stopped.
func (c *NATSCluster) Node(i int) *NATS {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// Stop shuts node i down (its clients are disconnected; its store stays).
func (c *NATSCluster) Stop(i int) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
	}
}

// Restart starts node i again on its ports with its store and waits until
// it has rejoined: JetStream current on every running node.
func (c *NATSCluster) Restart(t testing.TB, i int) {
	t.Helper()
	if err := c.start(i); err != nil {
		t.Fatal(err)
	}
	c.WaitJetStream(t)
}

// running is every running node's server.
func (c *NATSCluster) running() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*server.Server
	for _, nd := range c.nodes {
		if nd.srv != nil {
			out = append(out, nd.srv.NATS())
		}
	}
	return out
}

// WaitJetStream waits up to 30 s until JetStream has a meta leader that
// has heard from every running node (it can place a stream on any), and
// every running node is current with it and routed to every other.
func (c *NATSCluster) WaitJetStream(t testing.TB) {
	t.Helper()
	WaitFor(t, 30*time.Second, func() bool {
		srvs := c.running()
		leader := false
		for _, s := range srvs {
			if !s.JetStreamIsCurrent() || s.NumRoutes() < len(srvs)-1 {
				return false
			}
			// The meta leader places streams only on peers it has
			// stats from ("no suitable peers for placement" before).
			if s.JetStreamIsLeader() {
				leader = len(s.JetStreamClusterPeers()) >= len(srvs)
			}
		}
		return leader
	})
}

// StreamLeader is the node that leads stream, waiting up to 30 s for the
// stream to have a leader (during an election it has none).
func (c *NATSCluster) StreamLeader(t testing.TB, js jetstream.JetStream, stream string) int {
	t.Helper()
	leader := -1
	WaitFor(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info := s.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		leader = c.Index(info.Cluster.Leader)
		return leader >= 0
	})
	return leader
}

// StreamReplicas is the number of replicas of stream that are current
// (the leader and every current follower), for a test to wait until a
// restarted node has caught up.
func StreamReplicas(ctx context.Context, js jetstream.JetStream, stream string) (current int, err error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return 1, nil
	}
	if info.Cluster.Leader != "" {
		current++
	}
	for _, p := range info.Cluster.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	return current, nil
}
