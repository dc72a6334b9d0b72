package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// clusterReplicas is what talosd's --replicas says on a three-node cluster.
const clusterReplicas = 3

// talosCluster is Talos on a real three-node NATS cluster: R3 streams and
// buckets, an enforce role per node (each connected to its node), a control
// role and a sink into a database of the package's ClickHouse.
type talosCluster struct {
	nats    *testenv.NATSCluster
	conn    driver.Conn
	db      string
	reg     *enforce.Registry
	key     *receipts.PrivateKey
	keys    verify.KeySet
	ctl     *control.ControlClient
	ctlKey  *receipts.PrivateKey
	ledger  kv.LedgerOptions
	workers []*clusterWorker
}

type clusterWorker struct {
	id     string
	node   int
	nc     *nats.Conn
	role   *ingest.EnforceRole
	cancel context.CancelFunc
	done   chan struct{}
}

func newTalosCluster(t *testing.T) *talosCluster {
	t.Helper()
	addr, db := testenv.NewDatabase(t)
	conn, err := query.Open(context.Background(), addr, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := query.Migrate(context.Background(), conn, db); err != nil {
		t.Fatal(err)
	}
	return newTalosClusterOn(t, conn, db)
}

// newTalosClusterOn is newTalosCluster with its sink writing to database
// db, already migrated, through conn.
func newTalosClusterOn(t *testing.T, conn driver.Conn, db string) *talosCluster {
	t.Helper()
	c := &talosCluster{nats: testenv.NATSClusterForTest(t, testenv.NATSClusterOptions{}),
		ledger: kv.LedgerOptions{Replicas: clusterReplicas}, conn: conn, db: db}
	ctx, run := background(t)
	var err error
	nc := c.connect(t, 0, true)
	js, _ := jetstream.New(nc)
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{Replicas: clusterReplicas}); err != nil {
		t.Fatal(err)
	}
	if c.reg, err = enforce.LoadRegistry(demoRegistry); err != nil {
		t.Fatal(err)
	}
	c.key, c.keys = newSigner(t)
	responder, responders := newSigner(t)
	runControl, err := ingest.NewControlRole(ctx, nc, js, ingest.ControlRoleOptions{
		Instance: "control-0", Key: c.key, Engine: mustEngine(t, c.reg), Signers: c.keys, ResponderKeys: responders,
		Ledger: c.ledger, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	sinkNC := c.connect(t, 1, true)
	sinkJS, _ := jetstream.New(sinkNC)
	sink, err := ingest.NewSink(sinkJS, query.NewSinkWriter(c.conn, db), ingest.SinkOptions{BatchAge: 50 * time.Millisecond, AckWait: 3 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run(runControl, sink.Run)
	c.ctl, c.ctlKey = control.NewControlClient(c.connect(t, 0, true), responder, "alice@test"), responder
	return c
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// connect opens a connection to node, reconnecting for ever as talosd
// does, closed when the test ends. With failover it may reconnect to the
// others, in order, as a client given every URL; without, it knows node
// alone (not even the nodes the cluster announces), as a client cut off
// from the rest of the cluster would.
func (c *talosCluster) connect(t *testing.T, node int, failover bool) *nats.Conn {
	t.Helper()
	urls := c.nats.NodeURL(node)
	opts := append(ingest.DaemonConnOptions(fmt.Sprintf("test node %d", node), quietLogger()), nats.DontRandomize())
	if failover {
		all := strings.Split(c.nats.URLs(), ",")
		urls = strings.Join(append(all[node:], all[:node]...), ",")
	} else {
		opts = append(opts, nats.IgnoreDiscoveredServers())
	}
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if got := nc.ConnectedServerName(); got != c.nats.Name(node) {
		t.Fatalf("connected to %s, want %s", got, c.nats.Name(node))
	}
	return nc
}

// startWorker starts enforce role id (ingest.NewEnforceRole, as talosd's)
// on node, and returns once it has caught up with TALOS_CONTROL.
func (c *talosCluster) startWorker(t *testing.T, id string, node int, failover bool) *clusterWorker {
	t.Helper()
	nc := c.connect(t, node, failover)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	role, err := ingest.NewEnforceRole(ctx, nc, js, ingest.EnforceRoleOptions{
		Instance: id, Key: c.key, Engine: mustEngine(t, c.reg), Chains: 2, Ledger: c.ledger,
		AckWait: 3 * time.Second, Checkpoints: checkpoint.Options{Every: 100}, Signers: c.keys,
		HeartbeatInterval: 200 * time.Millisecond, Logger: quietLogger(),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &clusterWorker{id: id, node: node, nc: nc, role: role, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(w.done); _ = role.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-w.done })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := role.Follower().WaitCaughtUp(wctx); err != nil {
		t.Fatalf("worker %s did not catch up: %v", id, err)
	}
	c.workers = append(c.workers, w)
	return w
}

// client is an enforcement point connected to node only.
func (c *talosCluster) client(t *testing.T, node int) *ep.Client {
	t.Helper()
	nc := c.connect(t, node, false)
	js, _ := jetstream.New(nc)
	cl, err := ep.NewClient(nc, js, "test-ep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// verify waits until session has want calls in v_decisions and checks
// there is exactly one receipt per call (in the view and in the raw
// table), and that the whole database verifies: no chain has a gap, every
// signature and checkpoint holds.
func (c *talosCluster) verify(t *testing.T, session string, want uint64) {
	t.Helper()
	c.verifyOn(t, c.conn, session, want)
}

// waitDecisions waits up to 120 s until conn's v_decisions holds want
// decisions of session.
func (c *talosCluster) waitDecisions(t *testing.T, conn driver.Conn, session string, want uint64) {
	t.Helper()
	testenv.WaitFor(t, 120*time.Second, func() bool {
		var n uint64
		err := conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count() FROM %s.v_decisions WHERE session_id = ?", c.db), session).Scan(&n)
		return err == nil && n >= want
	})
}

// verifyOn is verify reading through conn.
func (c *talosCluster) verifyOn(t *testing.T, conn driver.Conn, session string, want uint64) {
	t.Helper()
	ctx := context.Background()
	c.waitDecisions(t, conn, session, want)
	var n, distinct, ids uint64
	if err := conn.QueryRow(ctx, fmt.Sprintf(
		"SELECT count(), uniqExact(tool_call_id) FROM %s.v_decisions WHERE session_id = ?", c.db), session).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != want || distinct != want {
		t.Fatalf("v_decisions: %d rows for %d calls, want %d", n, distinct, want)
	}
	if err := conn.QueryRow(ctx, fmt.Sprintf(
		"SELECT uniqExact(receipt_id) FROM %s.receipts WHERE session_id = ? AND kind = 'decision'", c.db), session).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if ids != want {
		t.Fatalf("%d distinct decision receipts stored for %d calls", ids, want)
	}
	rep, err := query.VerifyDatabase(ctx, conn, c.db, c.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify: %v", rep.Problems)
	}
}

// decisionTimes records when each decision for test-ep arrives, on a
// connection to node.
type decisionTimes struct {
	mu    sync.Mutex
	times []time.Time
	seen  map[string]bool
}

func (c *talosCluster) watchDecisions(t *testing.T, node int) *decisionTimes {
	t.Helper()
	d := &decisionTimes{seen: map[string]bool{}}
	nc := c.connect(t, node, false)
	sub, err := nc.Subscribe(schemas.DecisionSubjects("test-ep"), func(m *nats.Msg) {
		var dec struct {
			ToolCallID string `json:"tool_call_id"`
		}
		if json.Unmarshal(m.Data, &dec) != nil {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.seen[dec.ToolCallID] {
			d.seen[dec.ToolCallID] = true
			d.times = append(d.times, time.Now())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *decisionTimes) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.times)
}

// longestGap is the longest time without a decision from since until the
// last decision, and how many decisions arrived between since and until.
func (d *decisionTimes) longestGap(since, until time.Time) (gap time.Duration, between int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	prev := since
	for _, at := range d.times {
		if at.Before(since) {
			continue
		}
		if at.Before(until) {
			between++
		}
		gap = max(gap, at.Sub(prev))
		prev = at
	}
	return gap, between
}

// publishCalls publishes calls from..to-1 of session through cl, from
// senders goroutines, each call retried (same bytes, same Nats-Msg-Id,
// 2 s an attempt) until TALOS_CALLS stores it, as an enforcement point's
// outbox does; with
// pace > 0 each sender waits pace between calls.
func publishCalls(cl *ep.Client, session string, from, to, senders int, pace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var g errgroup.Group
	for s := range senders {
		g.Go(func() error {
			for i := from + s; i < to; i += senders {
				if err := publishCall(ctx, cl, session, i); err != nil {
					return err
				}
				time.Sleep(pace)
			}
			return nil
		})
	}
	return g.Wait()
}

func publishCall(ctx context.Context, cl *ep.Client, session string, i int) error {
	c, err := ep.NewCall("test-ep", "files", "list_directory", map[string]any{"path": fmt.Sprintf("dir-%d", i)})
	if err != nil {
		return err
	}
	c.SessionID = session
	raw, _ := json.Marshal(c)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second) // one attempt
		err := cl.Publish(actx, schemas.PhasePre, "files", c.ToolCallID, raw)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeLoss stops the node leading stream while more than 2,000 calls are in
// flight (published, not yet decided) and more keep coming, restarts it,
// and checks that nothing was lost or doubled and that decisions went on.
func nodeLoss(t *testing.T, stream string) {
	if testing.Short() {
		t.Skip("stops a node of a NATS cluster under load")
	}
	const backlog, calls = 2500, 3000
	began := time.Now()
	c := newTalosCluster(t)
	js, _ := jetstream.New(c.connect(t, 0, true))
	leader := c.nats.StreamLeader(t, js, stream)
	other := (leader + 1) % c.nats.Size()
	decisions := c.watchDecisions(t, other)
	cl := c.client(t, other)
	session := "node-loss-" + strings.ToLower(stream)
	if err := publishCalls(cl, session, 0, backlog, 8, 0); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: %d calls queued", time.Since(began).Round(time.Millisecond), backlog)
	for i := range c.nats.Size() {
		c.startWorker(t, fmt.Sprintf("w%d", i), i, true)
	}
	published := make(chan error, 1)
	go func() { published <- publishCalls(cl, session, backlog, calls, 1, 4*time.Millisecond) }()
	testenv.WaitFor(t, 60*time.Second, func() bool { return decisions.count() >= 300 })
	stopped, atStop := time.Now(), decisions.count()
	c.nats.Stop(leader)
	if inFlight := backlog - atStop; inFlight < 2000 {
		t.Fatalf("only %d calls in flight at the stop, want at least 2,000", inFlight)
	}
	t.Logf("%v: stopped node %s (leader of %s) with %d calls decided, over %d in flight",
		time.Since(began).Round(time.Millisecond), c.nats.Name(leader), stream, atStop, backlog-atStop)
	now := c.nats.StreamLeader(t, js, stream)
	t.Logf("%s: new leader %s after %v", stream, c.nats.Name(now), time.Since(stopped).Round(time.Millisecond))
	testenv.WaitFor(t, 60*time.Second, func() bool { return decisions.count() >= atStop+1000 })
	time.Sleep(time.Until(stopped.Add(3 * time.Second))) // down for 3 s at least
	restarted := time.Now()
	c.nats.Restart(t, leader)
	t.Logf("restarted node %s after %v down", c.nats.Name(leader), restarted.Sub(stopped).Round(time.Millisecond))
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	c.verify(t, session, calls)
	gap, between := decisions.longestGap(stopped, restarted)
	t.Logf("%v: verified; longest stall without a decision after the stop: %v; %d decisions while the node was down; %d of %d decisions seen on node %s",
		time.Since(began).Round(time.Millisecond), gap.Round(time.Millisecond), between, decisions.count(), calls, c.nats.Name(other))
	if between == 0 {
		t.Fatal("no decision while the node was down")
	}
	testenv.WaitFor(t, 60*time.Second, func() bool {
		n, err := testenv.StreamReplicas(context.Background(), js, stream)
		return err == nil && n == clusterReplicas
	})
}

// Must-show 1 (issue 17): the node leading TALOS_AUDIT stops mid-traffic
// and comes back; every call has exactly one receipt, no chain has a gap,
// the database verifies, and decisions went on meanwhile.
func TestClusterAuditLeaderLoss(t *testing.T) { nodeLoss(t, schemas.StreamAudit) }

// Must-show 1, the other case: the node leading TALOS_CALLS.
func TestClusterCallsLeaderLoss(t *testing.T) { nodeLoss(t, schemas.StreamCalls) }

// onWorkers sends calls, the i-th made by send, until each of workers has
// decided one, within 30 s; every decision must pass check, and one made by
// a worker outside workers fails the test.
func onWorkers(t *testing.T, workers []string, send func(i int) (*ep.Client, *schemas.ToolCall), check func(*schemas.Decision) error) {
	t.Helper()
	seen := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; len(seen) < len(workers); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("in 30 s only workers %v decided, want %v", seen, workers)
		}
		cl, call := send(i)
		d := callOK(t, cl, call)
		by := decider(t, d)
		if !slices.Contains(workers, by) {
			t.Fatalf("call %d decided by %s, want only %v", i, by, workers)
		}
		if err := check(d); err != nil {
			t.Fatalf("call %d decided by %s: %v (decision %s %v)", i, by, err, d.Decision, d.ReasonCodes)
		}
		seen[by]++
	}
}

// killSwitch sets a kill switch on scope and waits up to 5 s for the live
// workers to apply it, as talosctl killswitch set --wait does.
func (c *talosCluster) killSwitch(t *testing.T, scope string) (*schemas.ControlReply, *control.Propagation, error) {
	t.Helper()
	cmd := c.ctl.NewCommand(schemas.VerbKillSwitchSet)
	cmd.Scope, cmd.Reason = scope, "node loss drill"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, prop, err := c.ctl.Send(ctx, cmd, 5*time.Second)
	if rep == nil || !rep.OK || prop == nil {
		t.Fatalf("kill switch %s: %+v %+v %v", scope, rep, prop, err)
	}
	return rep, prop, err
}

// live is the status of the workers the control service counts live.
func (c *talosCluster) live(t *testing.T) map[string]schemas.WorkerStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := c.ctl.Do(ctx, c.ctl.NewCommand(schemas.VerbStatus))
	if err != nil || !rep.OK {
		t.Fatalf("status: %+v %v", rep, err)
	}
	out := map[string]schemas.WorkerStatus{}
	for _, st := range rep.Status {
		out[st.WorkerID] = st
	}
	return out
}

// Must-show 3 (issue 17): three workers, each connected to its own node of
// the cluster. A replay sent through other nodes than the first use is
// denied by every worker; a kill switch set with --wait is applied and
// enforced by all three; when node 2 stops, the worker that knew only that
// node is reported as not enforcing the next kill switch and never counted,
// and once the node is back it decides nothing before it has caught up with
// the kill switch it missed.
func TestClusterControlAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a node of a NATS cluster")
	}
	c := newTalosCluster(t)
	all := []string{"w0", "w1", "w2"}
	for i, id := range all {
		c.startWorker(t, id, i, i != 2) // w2 knows only node 2
	}
	eps := []*ep.Client{c.client(t, 0), c.client(t, 1), c.client(t, 2)}
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(c.live(t)) == 3 })

	first := readCall(t, "s-replay", "")()
	if d := callOK(t, eps[0], first); d.Decision != schemas.DecisionAllow {
		t.Fatalf("first use: %s %v", d.Decision, d.ReasonCodes)
	}
	onWorkers(t, all, func(i int) (*ep.Client, *schemas.ToolCall) {
		replay := readCall(t, "s-replay", "")()
		replay.CorrelationID = first.CorrelationID
		return eps[1+i%2], replay
	}, denied(schemas.CodeReplay))

	_, prop, err := c.killSwitch(t, "session:s-ks1")
	if err != nil || len(prop.Applied) != 3 || len(prop.Missing) != 0 {
		t.Fatalf("kill switch on three live workers: applied %v, missing %v, %v", prop.Applied, prop.Missing, err)
	}
	t.Logf("kill switch applied by all three %v after its acknowledgement", prop.AfterAck().Round(time.Millisecond))
	onWorkers(t, all, func(i int) (*ep.Client, *schemas.ToolCall) { return eps[i%3], readCall(t, "s-ks1", "")() },
		denied(schemas.CodeKillSwitch))

	c.nats.Stop(2)
	w2 := c.workers[2].role.Follower()
	testenv.WaitFor(t, 5*time.Second, func() bool { return !w2.Current() }) // cut off: not deciding
	rep, prop, err := c.killSwitch(t, "session:s-ks2")
	if _, ok := prop.Applied["w2"]; ok || len(prop.Applied) != 2 {
		t.Fatalf("with node 2 down: applied by %v, want w0 and w1 only", prop.Applied)
	}
	var unconfirmed *control.UnconfirmedError
	switch {
	case slices.Contains(rep.Workers, "w2") && (!errors.As(err, &unconfirmed) || !slices.Equal(unconfirmed.Missing, []string{"w2"})):
		t.Fatalf("w2 was live when the command was accepted, so --wait must name it unconfirmed: %v", err)
	case !slices.Contains(rep.Workers, "w2") && err != nil:
		t.Fatalf("w2 was no longer live, yet: %v", err)
	}
	t.Logf("with node 2 down: applied by %v; reply's live workers %v; %v", slices.Sorted(maps.Keys(prop.Applied)), rep.Workers, err)
	testenv.WaitFor(t, 10*time.Second, func() bool { _, ok := c.live(t)["w2"]; return !ok })
	onWorkers(t, all[:2], func(i int) (*ep.Client, *schemas.ToolCall) { return eps[i%2], readCall(t, "s-ks2", "")() },
		denied(schemas.CodeKillSwitch))

	restarted := time.Now()
	c.nats.Restart(t, 2)
	// Current again only once it has the kill switch stored while it was away.
	testenv.WaitFor(t, 30*time.Second, w2.Current)
	if w2.Applied() < rep.Seq {
		t.Fatalf("w2 current again at control seq %d, before the kill switch at %d", w2.Applied(), rep.Seq)
	}
	// Calls from the moment the node is back: w2 takes some once it has
	// reconnected, and must deny them too.
	onWorkers(t, all, func(i int) (*ep.Client, *schemas.ToolCall) { return eps[i%2], readCall(t, "s-ks2", "")() },
		denied(schemas.CodeKillSwitch))
	// The status verb reports heartbeats, sent every 200 ms: the one in hand
	// may predate the moment w2 became current.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := c.live(t)["w2"]
		if st.AppliedSeq >= rep.Seq && st.CaughtUp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w2 after the restart: %+v, want applied ≥ %d and caught up", st, rep.Seq)
		}
	}
	t.Logf("w2 deciding again %v after node 2 restarted", time.Since(restarted).Round(time.Millisecond))
}
