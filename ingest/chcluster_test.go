package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/testenv"
)

// Must-show 2 (issue 17): Talos on a replicated ClickHouse (ZooKeeper, two
// replicas of one shard, the database migrated in cluster mode as talosd's
// sink does, the sink given both addresses). One replica is killed
// mid-traffic and started again; then ZooKeeper is restarted mid-traffic.
// Each time, with over 2,000 calls not yet stored: nothing is lost or
// doubled in the views, the sink goes on (through the other replica) or
// catches up (once ZooKeeper is back), both replicas end with the same
// rows, and the database verifies on either replica.
func TestClickHouseClusterLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a ClickHouse replica and restarts ZooKeeper under load")
	}
	ch := testenv.ClickHouseClusterForTest(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const db = "talos"
	at := func(user string) query.Endpoint { return query.Endpoint{Addr: ch.Addrs(), User: user} }
	sinkConn, err := query.OpenMigrated(ctx, query.Logins{Admin: at(query.AdminUser), Writer: at(query.WriterUser),
		Reader: at(query.ReaderUser)}, db, query.Cluster{Name: ch.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sinkConn.Close() })
	c := newTalosClusterOn(t, sinkConn, db)
	replicas := []driver.Conn{ch.Open(t, 0), ch.Open(t, 1)}

	t.Run("replica", func(t *testing.T) {
		// Replica 0 is first in the sink's addresses: its connections go
		// there until it dies.
		c.storeLoss(t, "ch-replica", replicas, replicas[1], "replica 0 killed",
			func() { ch.Kill(0) }, func() { ch.Restart(t, 0) }, true)
	})
	t.Run("zookeeper", func(t *testing.T) {
		zk := ch.ZooKeeper()
		c.storeLoss(t, "ch-zookeeper", replicas, replicas[0], "ZooKeeper stopped",
			zk.Stop, func() { zk.Start(t) }, false)
	})
	// talosctl query's reader gets the same answer from either replica.
	for i := range ch.Size() {
		reader, err := query.Endpoint{Addr: ch.Addr(i), User: query.ReaderUser}.Open(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		res, err := query.RunCanned(ctx, reader, db, "calls-over-time", query.Params{})
		reader.Close()
		if err != nil {
			t.Fatal(err)
		}
		var calls uint64
		for _, row := range res.Rows {
			calls += row[1].(uint64)
		}
		if calls != 6000 {
			t.Errorf("replica %d: calls-over-time counts %d calls, want the 6,000 sent", i, calls)
		}
	}
}

// storeLoss sends 3,000 calls of session (2,700 queued before two
// workers start), calls stop once 100 are stored (as seen through watch),
// restarts after 3 s at least, and checks every replica: one decision
// per call in the views, one stored receipt per decision, the whole
// database verifying, and the same receipts and checkpoints on each. With goesOn, the sink must
// store 500 more calls (through another replica) before the restart.
func (c *talosCluster) storeLoss(t *testing.T, session string, replicas []driver.Conn, watch driver.Conn,
	what string, stop, restart func(), goesOn bool) {
	const backlog, calls = 2700, 3000
	began := time.Now()
	stored := func() uint64 {
		var n uint64
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = watch.QueryRow(ctx, fmt.Sprintf("SELECT uniqExact(tool_call_id) FROM %s.receipts WHERE session_id = ? AND kind = 'decision'", c.db),
			session).Scan(&n)
		return n
	}
	cl := c.client(t, 0)
	if err := publishCalls(cl, session, 0, backlog, 8, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c.startWorker(t, fmt.Sprintf("%s-w%d", session, i), i, true)
	}
	published := make(chan error, 1)
	go func() { published <- publishCalls(cl, session, backlog, calls, 1, 4*time.Millisecond) }()
	testenv.WaitFor(t, 60*time.Second, func() bool { return stored() >= 100 })
	atStop := stored()
	stop()
	stopped := time.Now()
	if inFlight := backlog - int(atStop); inFlight < 2000 {
		t.Fatalf("only %d calls not yet stored at the stop, want at least 2,000", inFlight)
	}
	t.Logf("%v: %s with %d of %d calls stored", time.Since(began).Round(time.Millisecond), what, atStop, calls)
	if goesOn {
		testenv.WaitFor(t, 60*time.Second, func() bool { return stored() > atStop })
		t.Logf("the sink stored again %v after the stop", time.Since(stopped).Round(time.Millisecond))
		testenv.WaitFor(t, 60*time.Second, func() bool { return stored() >= atStop+500 })
	}
	time.Sleep(time.Until(stopped.Add(3 * time.Second)))
	atRestart := stored()
	restart()
	restarted := time.Now()
	t.Logf("%v: back after %v down; %d calls stored meanwhile", time.Since(began).Round(time.Millisecond),
		restarted.Sub(stopped).Round(time.Millisecond), atRestart-atStop)
	if !goesOn {
		testenv.WaitFor(t, 90*time.Second, func() bool { return stored() > atRestart })
		t.Logf("the sink stored again %v after the restart", time.Since(restarted).Round(time.Millisecond))
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	// A replica that came back catches up table by table: it may hold
	// every decision of the session before a checkpoint cut while it was
	// down. Verify once every replica holds every decision and they agree
	// on every receipt and checkpoint.
	for _, conn := range replicas {
		c.waitDecisions(t, conn, session, calls)
	}
	c.sameRows(t, replicas)
	for _, conn := range replicas {
		c.verifyOn(t, conn, session, calls)
	}
	t.Logf("%v: both replicas hold every call once and verify", time.Since(began).Round(time.Millisecond))
}

// sameRows waits up to 30 s until every replica holds the same records:
// as many distinct receipts and checkpoints.
func (c *talosCluster) sameRows(t *testing.T, replicas []driver.Conn) {
	t.Helper()
	q := fmt.Sprintf("SELECT (SELECT uniqExact(receipt_id) FROM %[1]s.receipts), (SELECT uniqExact(checkpoint_id) FROM %[1]s.checkpoints)", c.db)
	var last []string
	testenv.WaitFor(t, 30*time.Second, func() bool {
		last = last[:0]
		for _, conn := range replicas {
			var r, cp uint64
			if err := conn.QueryRow(context.Background(), q).Scan(&r, &cp); err != nil {
				return false
			}
			last = append(last, fmt.Sprintf("%d receipts, %d checkpoints", r, cp))
		}
		for _, l := range last {
			if l != last[0] {
				return false
			}
		}
		return true
	})
	t.Logf("every replica: %s", last[0])
}
