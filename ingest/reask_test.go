package ingest_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// signedClient is enforcement point test-ep connected to node first,
// taking only decisions whose receipts the cluster's key signed. With
// failover it knows every node and reconnects to another when first goes;
// without, it waits for first to come back.
func (c *talosCluster) signedClient(t *testing.T, first int, failover bool) *ep.Client {
	t.Helper()
	nc := c.connect(t, first, failover)
	js, _ := jetstream.New(nc)
	cl, err := ep.NewClientWithOptions(nc, js, "test-ep", ep.ClientOptions{Keys: c.keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// epResults are the outcomes enforcement points saw, by tool_call_id.
type epResults struct {
	mu      sync.Mutex
	got     map[string]*schemas.Decision
	failed  map[string]error
	decided atomic.Int64
}

// sendWaiting sends calls 0..n-1 of session through cl at once, each
// waiting up to wait for its decision as an enforcement point does; every
// fourth names a tool the registry lacks (a deny), the others read a file
// (an allow). done is closed once every call has its outcome.
func (r *epResults) sendWaiting(cl *ep.Client, session string, n int, wait time.Duration) (done chan struct{}) {
	done = make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tool := "read_file"
			if i%4 == 0 {
				tool = "no_such_tool"
			}
			call, err := ep.NewCall("test-ep", "files", tool, map[string]any{"path": fmt.Sprintf("f-%d", i)})
			var d *schemas.Decision
			if err == nil {
				call.SessionID = session
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				d, err = cl.Call(ctx, call)
				cancel()
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if err != nil {
				r.failed[fmt.Sprintf("%s #%d", session, i)] = err
				return
			}
			r.got[call.ToolCallID] = d
			r.decided.Add(1)
		}()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// streamState is stream's state as its leader reports it now.
func streamState(js jetstream.JetStream, stream string) (jetstream.StreamState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	return s.CachedInfo().State, nil
}

// waitStream waits until stream's state, once it answers, satisfies ok.
func waitStream(t *testing.T, js jetstream.JetStream, stream string, ok func(jetstream.StreamState) bool) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, func() bool {
		st, err := streamState(js, stream)
		return err == nil && ok(st)
	})
}

// callsStored waits until TALOS_CALLS holds at least n calls.
func callsStored(t *testing.T, js jetstream.JetStream, n uint64) {
	t.Helper()
	waitStream(t, js, schemas.StreamCalls, func(st jetstream.StreamState) bool { return st.Msgs >= n })
}

// decisionSeq is TALOS_DECISIONS's last sequence number, asked for until
// the stream answers (it may be electing a leader).
func decisionSeq(t *testing.T, js jetstream.JetStream) (seq uint64) {
	t.Helper()
	waitStream(t, js, schemas.StreamDecisions, func(st jetstream.StreamState) bool { seq = st.LastSeq; return true })
	return seq
}

// stopWorkers stops every worker started so far and forgets them.
func (c *talosCluster) stopWorkers() {
	for _, w := range c.workers {
		w.cancel()
		<-w.done
	}
	c.workers = nil
}

// Must-show 1 (issue 24): with more than 2,000 calls in flight, the node
// leading TALOS_CALLS, then the one leading TALOS_AUDIT, then the node an
// enforcement point is connected to are stopped; every call's enforcement
// point receives a decision (none is left undecided), and it is exactly
// the one its receipt in ClickHouse records: the same receipt id, the same
// decision and reason codes, the same signed bytes.
//
// Whether a live reply is lost in those three stops depends on where the
// streams' leaders were and on how fast the enforcement point reconnects
// (on a fast machine none is). A fourth stop loses replies for certain: the
// enforcement point knows only its node, and that node comes back only
// once the other nodes' workers have decided every call, at least 200 of
// them after it went offline; it must obtain those by asking again.
func TestClusterEveryDecisionReachesItsEnforcementPoint(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a node of a NATS cluster four times under load")
	}
	const calls, before = 2700, 200
	began := time.Now()
	c := newTalosCluster(t)
	js, _ := jetstream.New(c.connect(t, 0, true))
	leaderOf := func(stream string) func() int {
		return func() int { return c.nats.StreamLeader(t, js, stream) }
	}
	phases := []struct {
		name    string
		victim  func() int
		epThere bool // the enforcement point is connected to the victim
		// the enforcement point knows no other node: it is offline until
		// the victim is back, which is once lostAtLeast decisions are
		// stored without it and every call is decided
		onlyItsNode bool
		session     string
	}{
		{"TALOS_CALLS leader", leaderOf(schemas.StreamCalls), false, false, "reask-calls"},
		{"TALOS_AUDIT leader", leaderOf(schemas.StreamAudit), false, false, "reask-audit"},
		{"enforcement point's node", func() int { return 1 }, true, false, "reask-ep"},
		{"enforcement point's only node", func() int { return 2 }, true, true, "reask-offline"},
	}
	const lostAtLeast = 200
	res := &epResults{got: map[string]*schemas.Decision{}, failed: map[string]error{}}
	for k, ph := range phases {
		victim := ph.victim()
		epNode := (victim + 1) % c.nats.Size()
		if ph.epThere {
			epNode = victim
		}
		cl := c.signedClient(t, epNode, !ph.onlyItsNode)
		already, seqBefore := res.decided.Load(), decisionSeq(t, js)
		done := res.sendWaiting(cl, ph.session, calls, 120*time.Second)
		callsStored(t, js, calls)
		for i := range c.nats.Size() {
			c.startWorker(t, fmt.Sprintf("p%d-w%d", k, i), i, true)
		}
		testenv.WaitFor(t, 60*time.Second, func() bool { return res.decided.Load()-already >= before })
		stopped := time.Now()
		c.nats.Stop(victim)
		inFlight := calls - int(res.decided.Load()-already)
		t.Logf("%v: stopped node %s (%s; the enforcement point on %s) with %d calls in flight",
			time.Since(began).Round(time.Millisecond), c.nats.Name(victim), ph.name, c.nats.Name(epNode), inFlight)
		if inFlight < 2000 {
			t.Fatalf("only %d calls in flight at the stop, want at least 2,000", inFlight)
		}
		if ph.onlyItsNode {
			// Its node is down, so it receives no more decisions: wait
			// until the cluster has stored lostAtLeast of this phase's
			// decisions that it has not received.
			waitStream(t, js, schemas.StreamDecisions, func(st jetstream.StreamState) bool {
				return st.LastSeq-seqBefore >= uint64(res.decided.Load()-already)+lostAtLeast
			})
			// The node comes back once every call is decided and the
			// workers are stopped, as in the other stops: the enforcement
			// point then has every missed decision to ask for again.
			waitStream(t, js, schemas.StreamCalls, func(st jetstream.StreamState) bool { return st.Msgs == 0 })
			c.stopWorkers()
			c.nats.Restart(t, victim)
			t.Logf("%v: at least %d decisions stored that the enforcement point did not receive, every call decided; node %s back",
				time.Since(began).Round(time.Millisecond), lostAtLeast, c.nats.Name(victim))
		}
		<-done
		t.Logf("%v: every call of %s answered %v after the stop; %d decisions obtained by asking again",
			time.Since(began).Round(time.Millisecond), ph.session, time.Since(stopped).Round(time.Millisecond), cl.Reasked())
		if ph.onlyItsNode && cl.Reasked() == 0 {
			t.Errorf("%s: decisions were stored while the enforcement point was offline, yet it asked for none again", ph.session)
		}
		c.stopWorkers()
		if !ph.onlyItsNode {
			c.nats.Restart(t, victim)
		}
		for _, stream := range []string{schemas.StreamCalls, schemas.StreamAudit, schemas.StreamDecisions} {
			testenv.WaitFor(t, 60*time.Second, func() bool {
				n, err := testenv.StreamReplicas(context.Background(), js, stream)
				return err == nil && n == clusterReplicas
			})
		}
	}
	if len(res.failed) > 0 {
		for call, err := range res.failed {
			t.Errorf("call %s: no decision: %v", call, err)
		}
		t.Fatalf("%d of %d calls left without a decision", len(res.failed), len(phases)*calls)
	}
	for _, ph := range phases {
		c.verify(t, ph.session, calls)
	}
	sessions := make([]string, len(phases))
	for i, ph := range phases {
		sessions[i] = ph.session
	}
	c.compareReceipts(t, res, sessions...)
	t.Logf("%v: %d decisions compared with their receipts", time.Since(began).Round(time.Millisecond), len(res.got))
}

// compareReceipts checks that every decision an enforcement point received
// is its call's decision receipt in ClickHouse, byte for byte, and that
// every such receipt was received.
func (c *talosCluster) compareReceipts(t *testing.T, res *epResults, sessions ...string) {
	t.Helper()
	in := strings.TrimSuffix(strings.Repeat("?, ", len(sessions)), ", ")
	args := make([]any, len(sessions))
	for i, s := range sessions {
		args[i] = s
	}
	rows, err := c.conn.Query(context.Background(), fmt.Sprintf(
		`SELECT tool_call_id, any(receipt_id), any(decision), any(reason_codes), any(cloudevent)
		 FROM %s.receipts WHERE session_id IN (%s) AND kind = 'decision' GROUP BY tool_call_id`, c.db, in), args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id, receiptID, decision, event string
		var codes []string
		if err := rows.Scan(&id, &receiptID, &decision, &codes, &event); err != nil {
			t.Fatal(err)
		}
		seen++
		d := res.got[id]
		switch {
		case d == nil:
			t.Errorf("call %s: receipt %s (%s) stored, no decision received", id, receiptID, decision)
		case d.ReceiptID != receiptID || d.Decision != decision || !slices.Equal(d.ReasonCodes, codes):
			t.Errorf("call %s: received %s %s %v, its receipt records %s %s %v", id, d.ReceiptID, d.Decision, d.ReasonCodes, receiptID, decision, codes)
		case string(d.Receipt) != event:
			t.Errorf("call %s: the receipt received is not the one stored", id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(res.got) {
		t.Fatalf("%d receipts for %d decisions received", seen, len(res.got))
	}
}

// Must-show 2 (issue 24): the node leading TALOS_CONTROL (and whatever
// else it leads) stops, and so does a second node, so that no stream can
// elect a leader until that second node is back 5 s later, longer than a
// leader election takes (4-9 s seen). A kill switch sent meanwhile with
// talosctl's default deadline (30 s) is retried, same command_id, until
// the control service can append it; it is applied by every live worker
// and reported so. Sent again, it is answered with the same seq and receipt
// and applied no second time, and every worker enforces it.
func TestClusterKillSwitchDuringFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("stops two nodes of a NATS cluster")
	}
	const outage = 5 * time.Second
	c := newTalosCluster(t)
	all := []string{"w0", "w1", "w2"}
	for i, id := range all {
		c.startWorker(t, id, i, true)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return len(c.live(t)) == 3 })
	js, _ := jetstream.New(c.connect(t, 0, true))
	victim := c.nats.StreamLeader(t, js, schemas.StreamControl)
	led := []string{schemas.StreamControl}
	for _, s := range []string{schemas.StreamCalls, schemas.StreamAudit, schemas.StreamDecisions} {
		if c.nats.StreamLeader(t, js, s) == victim {
			led = append(led, s)
		}
	}
	second := (victim + 2) % c.nats.Size()
	// The responder is connected to the node that stops, as talosctl on a
	// machine whose node dies.
	responder := control.NewControlClient(c.connect(t, victim, true), c.ctlKey, "alice@test")
	c.nats.Stop(victim)
	c.nats.Stop(second)
	stopped := time.Now()
	cmd := c.ctl.NewCommand(schemas.VerbKillSwitchSet)
	cmd.Scope, cmd.Reason = "session:s-failover", "failover drill"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // talosctl's default --timeout
	defer cancel()
	var (
		rep  *schemas.ControlReply
		prop *control.Propagation
		err  error
	)
	sent := make(chan struct{})
	go func() { defer close(sent); rep, prop, err = responder.Send(ctx, cmd, 30*time.Second) }()
	time.Sleep(outage)
	c.nats.Restart(t, second)
	restarted := time.Now()
	<-sent
	if err != nil || rep == nil || !rep.OK || prop == nil {
		t.Fatalf("kill switch with node %s (leader of %v) down: %+v %+v %v", c.nats.Name(victim), led, rep, prop, err)
	}
	t.Logf("nodes %s (leader of %v) and %s stopped; %s back after %v; kill switch acknowledged %v after the stop (seq %d), applied by %d workers %v after the stop",
		c.nats.Name(victim), led, c.nats.Name(second), c.nats.Name(second), restarted.Sub(stopped).Round(time.Millisecond),
		prop.Acked.Sub(stopped).Round(time.Millisecond), rep.Seq, len(prop.Applied), (prop.AfterSend() + prop.Sent.Sub(stopped)).Round(time.Millisecond))
	if prop.Acked.Before(stopped.Add(outage)) {
		t.Fatalf("acknowledged %v after the stop, while TALOS_CONTROL could elect no leader", prop.Acked.Sub(stopped))
	}
	if len(prop.Applied) != 3 || len(prop.Missing) != 0 {
		t.Fatalf("applied by %v, missing %v: want all three live workers", prop.Applied, prop.Missing)
	}

	again, err := responder.Do(ctx, cmd) // a client's retry: same bytes, same command_id
	if err != nil || !again.OK || again.Seq != rep.Seq || again.ReceiptID != rep.ReceiptID {
		t.Fatalf("the command sent again: %+v %v, want seq %d receipt %s", again, err, rep.Seq, rep.ReceiptID)
	}
	ctl, err := js.Stream(ctx, schemas.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	if last := ctl.CachedInfo().State.LastSeq; last != rep.Seq {
		t.Fatalf("TALOS_CONTROL ends at seq %d, want %d: the command was appended again", last, rep.Seq)
	}
	for _, w := range c.workers {
		if got := w.role.Follower().Applied(); got != rep.Seq {
			t.Fatalf("worker %s applied seq %d, want %d", w.id, got, rep.Seq)
		}
	}
	eps := []*ep.Client{c.signedClient(t, (victim+1)%3, true), c.signedClient(t, (victim+2)%3, true)}
	onWorkers(t, all, func(i int) (*ep.Client, *schemas.ToolCall) { return eps[i%2], readCall(t, "s-failover", "")() },
		denied(schemas.CodeKillSwitch))
	c.nats.Restart(t, victim)
}

// Must-show 3 (issue 24): three talosd instances (their roles in this
// process: streams, the call ledger, an enforce and a control role each,
// R3) started at the same instant on a fresh three-node cluster whose
// JetStream is still forming all come up and decide, ten times over, each
// time on a new cluster (three clusters at a time).
func TestClusterColdStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ten NATS clusters")
	}
	reg, err := enforce.LoadRegistry(demoRegistry)
	if err != nil {
		t.Fatal(err)
	}
	key, keys := newSigner(t)
	// Three repetitions at a time: each mostly waits for its cluster.
	slots := make(chan struct{}, 3)
	for rep := range 10 {
		t.Run(fmt.Sprintf("start-%02d", rep+1), func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			cluster := testenv.NATSClusterForTest(t, testenv.NATSClusterOptions{Cold: true})
			began := time.Now()
			start := make(chan struct{})
			up := make(chan error, cluster.Size())
			waits := &lineCounter{word: "JetStream not ready"}
			for i := range cluster.Size() {
				go func() {
					<-start
					up <- startTalosd(t, cluster, i, reg, key, keys, waits)
				}()
			}
			close(start)
			for range cluster.Size() {
				if err := <-up; err != nil {
					t.Fatal(err)
				}
			}
			nc, js := testenv.ConnectJS(t, cluster.NodeURL(rep%cluster.Size()))
			cl, err := ep.NewClient(nc, js, "test-ep")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cl.Close() }()
			if d := callOK(t, cl, readCall(t, "", "")()); d.Decision != schemas.DecisionAllow {
				t.Fatalf("first call: %s %v", d.Decision, d.ReasonCodes)
			}
			t.Logf("three instances up and deciding %v after the cluster started; they waited for JetStream %d times",
				time.Since(began).Round(time.Millisecond), waits.count())
		})
	}
}

// startTalosd does what talosd --replicas 3 --roles enforce,control does at
// start, connected to node i (and the others as failover): the streams, an
// enforce role and a control role, run until the test ends. It returns
// once the enforce role has caught up with TALOS_CONTROL, or why it could
// not start.
func startTalosd(t *testing.T, cluster *testenv.NATSCluster, i int, reg *enforce.Registry, key *receipts.PrivateKey, keys verify.KeySet, waits *lineCounter) error {
	log := slog.New(slog.NewTextHandler(waits, nil))
	ledger := kv.LedgerOptions{Replicas: clusterReplicas, Logger: log}
	id := fmt.Sprintf("talosd-%d", i)
	urls := strings.Split(cluster.URLs(), ",")
	nc, err := nats.Connect(strings.Join(append(urls[i:], urls[:i]...), ","),
		append(ingest.DaemonConnOptions(id, quietLogger()), nats.DontRandomize())...)
	if err != nil {
		return err
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
	defer scancel()
	if err := ingest.EnsureStreams(sctx, js, ingest.StreamOptions{Replicas: clusterReplicas, Setup: retry.SetupOptions{Log: log}}); err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	engine, err := enforce.New(enforce.Config{Mode: enforce.ModeProd, Registry: reg})
	if err != nil {
		return err
	}
	role, err := ingest.NewEnforceRole(sctx, nc, js, ingest.EnforceRoleOptions{
		Instance: id, Key: key, Engine: engine, Chains: 1, Ledger: ledger, Checkpoints: checkpoint.Options{Every: 100},
		Signers: keys, HeartbeatInterval: 200 * time.Millisecond, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("%s: enforce role: %w", id, err)
	}
	runControl, err := ingest.NewControlRole(sctx, nc, js, ingest.ControlRoleOptions{
		Instance: id, Key: key, Engine: engine, Signers: keys, ResponderKeys: keys, Ledger: ledger, Enforce: role, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("%s: control role: %w", id, err)
	}
	for _, run := range []func(context.Context) error{role.Run, runControl} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = run(ctx) }()
	}
	if err := role.Follower().WaitCaughtUp(sctx); err != nil {
		return fmt.Errorf("%s: not caught up: %w", id, err)
	}
	return nil
}

// lineCounter counts the log lines that contain word, and drops them all.
type lineCounter struct {
	word string
	n    atomic.Int64
}

func (c *lineCounter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.word) {
		c.n.Add(1)
	}
	return len(p), nil
}

func (c *lineCounter) count() int64 { return c.n.Load() }
