//go:build unix

package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"golang.org/x/sync/errgroup"

	"github.com/talos-audit/talos/query/chserver"
)

// ClickHouseClusterName is the cluster ClickHouseClusterForTest's servers
// form: the name --clickhouse-cluster and ON CLUSTER DDL give.
const ClickHouseClusterName = "talos_test"

// ClickHouseCluster is a replicated ClickHouse: a private ZooKeeper and
// clickhouse-server processes (query/chserver) forming one shard of
// replicas, each with the macros {shard} and {replica}, the cluster in
// its remote_servers and distributed DDL on. A replica can be killed and
// started again, one at a time, on the same ports and data; so can
// ZooKeeper. Replicas are numbered from 0. It is safe for concurrent use.
type ClickHouseCluster struct {
	zk *ZooKeeper

	mu       sync.Mutex // guards replicas' srv
	replicas []*chReplica
}

type chReplica struct {
	opts chserver.Options
	srv  *chserver.Server // nil while stopped
}

// ClickHouseClusterForTest starts ZooKeeper and n replicas (2 when n is
// 0 or less) in parallel, and stops them all when the test ends.
func ClickHouseClusterForTest(t testing.TB, n int) *ClickHouseCluster {
	t.Helper()
	if n <= 0 {
		n = 2
	}
	if _, err := FindClickHouse(); err != nil {
		t.Fatal(err)
	}
	c := &ClickHouseCluster{zk: StartZooKeeper(t)}
	ports := freePorts(t, 3*n)
	var addrs []string
	for i := range n {
		addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[3*i])))
	}
	for i := range n {
		c.replicas = append(c.replicas, &chReplica{opts: chserver.Options{
			Dir: t.TempDir(), TCPPort: ports[3*i], HTTPPort: ports[3*i+1], InterserverPort: ports[3*i+2],
			StopTimeout: 10 * time.Second,
			Replica: &chserver.Replica{ZooKeeper: []string{c.zk.Addr()}, Cluster: ClickHouseClusterName,
				Shard: "01", Name: fmt.Sprintf("r%d", i), Replicas: addrs},
		}})
	}
	t.Cleanup(func() { // before ZooKeeper's Stop: cleanups run last first
		c.shutdown()
		if t.Failed() {
			c.logTails(t)
		}
	})
	var g errgroup.Group
	for i := range n {
		g.Go(func() error { return c.start(i) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *ClickHouseCluster) start(i int) error {
	c.mu.Lock()
	r := c.replicas[i]
	running := r.srv != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("testenv: replica %d already runs", i)
	}
	srv, err := chserver.Start(context.Background(), r.opts)
	if err != nil {
		return fmt.Errorf("testenv: clickhouse replica %d: %w", i, err)
	}
	if err := ddlReady(srv); err != nil {
		_ = srv.Stop()
		return fmt.Errorf("testenv: clickhouse replica %d: %w", i, err)
	}
	c.mu.Lock()
	r.srv = srv
	c.mu.Unlock()
	return nil
}

// ddlReady waits until srv's distributed DDL worker has its ZooKeeper
// session. ClickHouse 18.16 answers queries before that, and an ON
// CLUSTER statement in between crashes it (a null ZooKeeper client; the
// worker's set-up takes about 100 ms after the server is ready). Nothing
// a server says marks that moment: once srv itself reads the DDL queue's
// node from ZooKeeper (which the first worker creates), its own worker
// is given a second more.
func ddlReady(srv *chserver.Server) error {
	conn, err := srv.Open("")
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n uint64
		err := conn.QueryRow(context.Background(),
			"SELECT count() FROM system.zookeeper WHERE path = '/clickhouse/task_queue' AND name = 'ddl'").Scan(&n)
		if err == nil && n == 1 {
			time.Sleep(time.Second)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its distributed DDL queue is not in ZooKeeper after 30 s (%d, %v)", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *ClickHouseCluster) shutdown() {
	var wg sync.WaitGroup
	for i := range c.replicas {
		wg.Add(1)
		go func() { defer wg.Done(); c.Stop(i) }()
	}
	wg.Wait()
}

// Name is the cluster's name (ClickHouseClusterName).
func (c *ClickHouseCluster) Name() string { return ClickHouseClusterName }

// Size is the number of replicas.
func (c *ClickHouseCluster) Size() int { return len(c.replicas) }

// ZooKeeper is the cluster's ZooKeeper.
func (c *ClickHouseCluster) ZooKeeper() *ZooKeeper { return c.zk }

// Addr is replica i's native address, the same whether or not it runs.
func (c *ClickHouseCluster) Addr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.replicas[i].opts.TCPPort))
}

// Addrs is every replica's address, comma-separated, in order: what
// --clickhouse-addr takes to reach whichever replica is up.
func (c *ClickHouseCluster) Addrs() string {
	addrs := make([]string, len(c.replicas))
	for i := range c.replicas {
		addrs[i] = c.Addr(i)
	}
	return strings.Join(addrs, ",")
}

// Kill stops replica i with SIGKILL, as a crash would; its data stays.
func (c *ClickHouseCluster) Kill(i int) {
	if srv := c.take(i); srv != nil {
		srv.Kill()
	}
}

// Stop stops replica i (SIGTERM, then SIGKILL after 10 s); its data
// stays. It does nothing when the replica is not running.
func (c *ClickHouseCluster) Stop(i int) {
	if srv := c.take(i); srv != nil {
		_ = srv.Stop()
	}
}

func (c *ClickHouseCluster) take(i int) *chserver.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	srv := c.replicas[i].srv
	c.replicas[i].srv = nil
	return srv
}

// Restart starts replica i again on its ports and data and waits until
// it answers.
func (c *ClickHouseCluster) Restart(t testing.TB, i int) {
	t.Helper()
	if err := c.start(i); err != nil {
		t.Fatal(err)
	}
}

// Open connects to replica i as the admin; the connection is closed when
// the test ends. It works while the replica is down (queries fail).
func (c *ClickHouseCluster) Open(t testing.TB, i int) driver.Conn {
	t.Helper()
	conn, err := chserver.OpenAddr(c.Addr(i), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// logTails logs the end of each replica's error log, for a failed test.
func (c *ClickHouseCluster) logTails(t testing.TB) {
	for i, r := range c.replicas {
		b, _ := os.ReadFile(filepath.Join(r.opts.Dir, "log", "server.err.log"))
		if len(b) > 4096 {
			b = b[len(b)-4096:]
		}
		t.Logf("replica %d: end of server.err.log:\n%s", i, b)
	}
}
