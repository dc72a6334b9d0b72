package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// plane is a real control plane: one embedded NATS, a control service, a
// sink into ClickHouse, and enforce workers started and stopped at will,
// each with its own decider, follower and heartbeat, over the shared call
// ledger.
type plane struct {
	url    string
	nc     *nats.Conn
	js     jetstream.JetStream
	conn   driver.Conn
	db     string
	reg    *enforce.Registry
	key    *receipts.PrivateKey // talosd
	keys   verify.KeySet
	ctl    *control.ControlClient
	client *ep.Client

	mu      sync.Mutex
	workers map[string]*planeWorker
}

type planeWorker struct {
	dec    *enforce.Decider
	cancel context.CancelFunc
	done   chan struct{}
}

func newPlane(t *testing.T) *plane {
	t.Helper()
	addr, db := testenv.NewDatabase(t)
	ctx, run := background(t)
	p := &plane{url: testenv.NATSForTest(t).URL(), db: db, workers: map[string]*planeWorker{}}
	t.Cleanup(p.stopAll)
	var err error
	if p.conn, err = query.Open(ctx, addr, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	if err := query.Migrate(ctx, p.conn, db); err != nil {
		t.Fatal(err)
	}
	p.nc, p.js = testenv.ConnectJS(t, p.url)
	if err := ingest.EnsureStreams(ctx, p.js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	if p.reg, err = enforce.LoadRegistry(demoRegistry); err != nil {
		t.Fatal(err)
	}
	p.key, p.keys = newSigner(t)
	responder, responders := newSigner(t)

	// The control role (NewControlPlane without an enforce worker): its own
	// state follower (list/show, precheck), the call ledger (replay
	// administration), and the live-worker watcher.
	store := newLedger(t, p.js)
	runControl, err := control.NewControlPlane(p.nc, p.js, control.ControlPlaneOptions{
		Chain: receipts.NewChain("plane-control", p.key), Source: "talos://control/test", ResponderKeys: responders,
		Ledger: store, Engine: mustEngine(t, p.reg), Signers: p.keys,
	})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := ingest.NewSink(p.js, query.NewSinkWriter(p.conn, db), ingest.SinkOptions{BatchAge: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(runControl, sink.Run)
	p.ctl = control.NewControlClient(p.nc, responder, "alice@test")
	if p.client, err = ep.NewClient(p.nc, p.js, "test-ep"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.client.Close() })
	return p
}

func mustEngine(t *testing.T, reg *enforce.Registry) *enforce.Engine {
	t.Helper()
	e, err := enforce.New(enforce.Config{Mode: enforce.ModeProd, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// startWorker starts enforce worker id on its own NATS connection, as a
// separate talosd would, and returns once it decides (caught up).
func (p *plane) startWorker(t *testing.T, id string) *enforce.Decider {
	t.Helper()
	nc, js := testenv.ConnectJS(t, p.url)
	ctx, cancel := context.WithCancel(context.Background())
	ledger := newLedger(t, js)
	dec, err := enforce.NewDecider(mustEngine(t, p.reg), enforce.DeciderOptions{Ledger: ledger})
	if err != nil {
		t.Fatal(err)
	}
	e, err := ingest.NewEnforcer(nc, js, dec, ingest.EnforcerOptions{
		WorkerID: id,
		Worker: ingest.WorkerOptions{
			Chains:  []*receipts.Chain{receipts.NewChain(id+"-"+fmt.Sprint(time.Now().UnixNano()), p.key)},
			Source:  "talos://enforce/" + id,
			AckWait: 3 * time.Second,
		},
		Keys:              p.keys,
		HeartbeatInterval: 200 * time.Millisecond,
		RegistryDigest:    func() string { return dec.State().Registry().Digest() },
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &planeWorker{dec: dec, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(w.done); _ = e.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := e.Follower().WaitCaughtUp(wctx); err != nil {
		t.Fatalf("worker %s did not catch up: %v", id, err)
	}
	p.mu.Lock()
	p.workers[id] = w
	p.mu.Unlock()
	// Wait until the control service sees it live, so --wait covers it.
	testenv.WaitFor(t, 10*time.Second, func() bool {
		rep, err := p.ctl.Do(context.Background(), p.ctl.NewCommand(schemas.VerbStatus))
		if err != nil || !rep.OK {
			return false
		}
		for _, s := range rep.Status {
			if s.WorkerID == id && s.CaughtUp {
				return true
			}
		}
		return false
	})
	return dec
}

func (p *plane) stopWorker(id string) {
	p.mu.Lock()
	w := p.workers[id]
	delete(p.workers, id)
	p.mu.Unlock()
	if w != nil {
		w.cancel()
		<-w.done
	}
}

func (p *plane) stopAll() {
	p.mu.Lock()
	ids := make([]string, 0, len(p.workers))
	for id := range p.workers {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		p.stopWorker(id)
	}
}

// command sends a mutating command with --wait semantics and requires that
// every live worker applied it.
func (p *plane) command(t *testing.T, verb string, fill func(*schemas.ControlCommand)) *schemas.ControlReply {
	t.Helper()
	cmd := p.ctl.NewCommand(verb)
	fill(cmd)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	rep, prop, err := p.ctl.DoAndWait(ctx, cmd, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", verb, err)
	}
	if !rep.OK {
		t.Fatalf("%s refused: %s %s", verb, rep.Code, rep.Error)
	}
	p.mu.Lock()
	n := len(p.workers)
	p.mu.Unlock()
	if prop == nil || len(prop.Missing) > 0 || len(prop.Applied) != n {
		t.Fatalf("%s: propagation %+v, want all %d workers applied", verb, prop, n)
	}
	return rep
}

// decider names the worker that decided d (its receipt's source).
func decider(t *testing.T, d *schemas.Decision) string {
	t.Helper()
	var ev struct {
		Source string `json:"source"`
	}
	if err := json.Unmarshal(d.Receipt, &ev); err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(ev.Source, "talos://enforce/")
}

// onEveryWorker sends calls made by mk one at a time until each running
// worker has decided at least one, checks every decision, and returns them.
func (p *plane) onEveryWorker(t *testing.T, mk func() *schemas.ToolCall, check func(*schemas.Decision) error) []*schemas.Decision {
	t.Helper()
	p.mu.Lock()
	want := len(p.workers)
	p.mu.Unlock()
	seen := map[string]bool{}
	var out []*schemas.Decision
	for i := 0; i < 200 && len(seen) < want; i++ {
		d := callOK(t, p.client, mk())
		if err := check(d); err != nil {
			t.Fatalf("call %d decided by %s: %v (decision %s %v)", i, decider(t, d), err, d.Decision, d.ReasonCodes)
		}
		seen[decider(t, d)] = true
		out = append(out, d)
	}
	if len(seen) < want {
		t.Fatalf("only workers %v decided calls in 200 tries, want %d", seen, want)
	}
	return out
}

func callOK(t *testing.T, c *ep.Client, call *schemas.ToolCall) *schemas.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	d, err := c.Call(ctx, call)
	if err != nil {
		t.Fatalf("call %s/%s: %v", call.ServerID, call.ToolName, err)
	}
	checkDecision(t, d)
	return d
}

func denied(code string) func(*schemas.Decision) error {
	return func(d *schemas.Decision) error {
		if d.Decision != schemas.DecisionDeny || !slices.Contains(d.ReasonCodes, code) {
			return fmt.Errorf("want deny with %s", code)
		}
		return nil
	}
}

func allowed(d *schemas.Decision) error {
	if d.Decision != schemas.DecisionAllow {
		return fmt.Errorf("want allow")
	}
	return nil
}

func readCall(t *testing.T, session, agent string) func() *schemas.ToolCall {
	return func() *schemas.ToolCall {
		c := newCall(t, "files", "read_file", map[string]any{"path": "README.md"})
		if session != "" {
			c.SessionID = session
		}
		if agent != "" {
			c.Actor.AgentID = agent
		}
		return c
	}
}

// Every kill-switch scope denies the next call on both workers, and only
// calls in its scope; clearing restores; a quarantine likewise; every
// decision names the control seq it was made under.
func TestKillSwitchAndQuarantineOnTwoWorkers(t *testing.T) {
	p := newPlane(t)
	p.startWorker(t, "w1")
	p.startWorker(t, "w2")

	p.onEveryWorker(t, readCall(t, "", ""), allowed)
	cases := []struct {
		scope   string
		inside  func() *schemas.ToolCall
		outside func() *schemas.ToolCall // nil: nothing is outside
	}{
		{"global", readCall(t, "", ""), nil},
		{"server:files", readCall(t, "", ""), func() *schemas.ToolCall {
			return newCall(t, "github", "github", map[string]any{"action": "list_prs"})
		}},
		{"tool:files/read_file", readCall(t, "", ""), func() *schemas.ToolCall {
			return newCall(t, "files", "list_directory", map[string]any{"path": "/"})
		}},
		{"agent:agent-x", readCall(t, "", "agent-x"), readCall(t, "", "agent-y")},
		{"session:s-incident", readCall(t, "s-incident", ""), readCall(t, "s-other", "")},
	}
	for _, c := range cases {
		t.Run(c.scope, func(t *testing.T) {
			rep := p.command(t, schemas.VerbKillSwitchSet, func(cmd *schemas.ControlCommand) {
				cmd.Scope, cmd.Reason = c.scope, "incident drill"
			})
			for _, d := range p.onEveryWorker(t, c.inside, denied(schemas.CodeKillSwitch)) {
				var ev struct {
					Data schemas.Receipt `json:"data"`
				}
				if err := json.Unmarshal(d.Receipt, &ev); err != nil {
					t.Fatal(err)
				}
				if ev.Data.ControlSeq < rep.Seq {
					t.Errorf("receipt control_seq %d, want ≥ %d (the kill switch)", ev.Data.ControlSeq, rep.Seq)
				}
			}
			if c.outside != nil {
				p.onEveryWorker(t, c.outside, func(d *schemas.Decision) error {
					if slices.Contains(d.ReasonCodes, schemas.CodeKillSwitch) {
						return fmt.Errorf("kill switch %s stopped a call outside its scope", c.scope)
					}
					return nil
				})
			}
			p.command(t, schemas.VerbKillSwitchClear, func(cmd *schemas.ControlCommand) {
				cmd.Scope, cmd.Reason = c.scope, "drill over"
			})
			p.onEveryWorker(t, c.inside, allowed)
		})
	}

	p.command(t, schemas.VerbQuarantineSet, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.Reason = "s-compromised", "prompt injection suspected"
	})
	p.onEveryWorker(t, readCall(t, "s-compromised", ""), denied(schemas.CodeSessionQuarantined))
	p.onEveryWorker(t, readCall(t, "s-clean", ""), allowed)
	rep, err := p.ctl.Do(context.Background(), p.ctl.NewCommand(schemas.VerbQuarantineList))
	if err != nil || !rep.OK || rep.State == nil || len(rep.State.Quarantines) != 1 || rep.State.Quarantines[0].Target != "s-compromised" ||
		rep.State.Quarantines[0].Actor != "alice@test" {
		t.Fatalf("quarantine list = %+v, %v", rep, err)
	}
	p.command(t, schemas.VerbQuarantineClear, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.Reason = "s-compromised", "cleaned"
	})
	p.onEveryWorker(t, readCall(t, "s-compromised", ""), allowed)

	// Both workers hold the same state, as of the same seq.
	v1, v2 := p.workers["w1"].dec.State().View(), p.workers["w2"].dec.State().View()
	if b1, b2 := mustJSON(t, v1), mustJSON(t, v2); string(b1) != string(b2) {
		t.Errorf("workers disagree:\n%s\n%s", b1, b2)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A replayed correlation_id is denied REPLAY on both workers and after both
// restart; a second delivery of the same call is not a replay: it gets the
// same decision and no second receipt.
func TestReplayAcrossWorkersAndRestart(t *testing.T) {
	p := newPlane(t)
	p.startWorker(t, "w1")
	p.startWorker(t, "w2")

	first := readCall(t, "s-replay", "")()
	if d := callOK(t, p.client, first); d.Decision != schemas.DecisionAllow {
		t.Fatalf("first use: %s %v", d.Decision, d.ReasonCodes)
	}
	replay := func() *schemas.ToolCall {
		c := readCall(t, "s-replay", "")()
		c.CorrelationID = first.CorrelationID // a new call reusing the id
		return c
	}
	p.onEveryWorker(t, replay, denied(schemas.CodeReplay))
	// The same correlation_id in another session is not a replay.
	other := readCall(t, "s-elsewhere", "")()
	other.CorrelationID = first.CorrelationID
	if d := callOK(t, p.client, other); d.Decision != schemas.DecisionAllow {
		t.Fatalf("same id, other session: %s %v", d.Decision, d.ReasonCodes)
	}

	// Restart both workers: their local caches are gone, the shared store is not.
	p.stopWorker("w1")
	p.stopWorker("w2")
	p.startWorker(t, "w3")
	p.startWorker(t, "w4")
	p.onEveryWorker(t, replay, denied(schemas.CodeReplay))

	// The same call delivered twice (published under two message ids, so
	// TALOS_CALLS keeps both, as after a worker crash before its ack): the
	// second is not a replay and yields the first receipt.
	dup := readCall(t, "s-dup", "")()
	raw := mustJSON(t, dup)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	decisions := make(chan *nats.Msg, 8)
	sub, err := p.nc.ChanSubscribe(schemas.DecisionSubjects("test-ep"), decisions)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for _, id := range []string{"delivery-1", "delivery-2"} {
		m := &nats.Msg{Subject: schemas.CallSubject(schemas.PhasePre, dup.EPID, dup.ServerID), Data: raw, Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := p.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var got []schemas.Decision
	for len(got) < 2 {
		select {
		case m := <-decisions:
			var d schemas.Decision
			if err := json.Unmarshal(m.Data, &d); err != nil {
				t.Fatal(err)
			}
			if d.ToolCallID == dup.ToolCallID {
				got = append(got, d)
			}
		case <-ctx.Done():
			t.Fatalf("%d decisions for the twice-delivered call, want 2", len(got))
		}
	}
	if d1, d2 := got[0], got[1]; d1.Decision != schemas.DecisionAllow || d2.Decision != d1.Decision || d2.ReceiptID != d1.ReceiptID {
		t.Fatalf("redelivery: first %s %v %s, second %s %v %s", d1.Decision, d1.ReasonCodes, d1.ReceiptID, d2.Decision, d2.ReasonCodes, d2.ReceiptID)
	}
	var n uint64
	testenv.WaitFor(t, 30*time.Second, func() bool {
		err := p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".receipts WHERE tool_call_id = ?", dup.ToolCallID).Scan(&n)
		return err == nil && n >= 1
	})
	time.Sleep(300 * time.Millisecond) // a second receipt, if any, would land in the same sink batch window
	if err := p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".receipts WHERE tool_call_id = ?", dup.ToolCallID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d receipts for the twice-delivered call, want 1 (%v)", n, err)
	}

	// replay.check sees it; a flush lets the id be used again.
	rep, err := p.ctl.Do(ctx, func() *schemas.ControlCommand {
		c := p.ctl.NewCommand(schemas.VerbReplayCheck)
		c.SessionID, c.CorrelationID = "s-replay", first.CorrelationID
		return c
	}())
	if err != nil || !rep.OK || rep.Replay == nil || rep.Replay.Seen == nil || !*rep.Replay.Seen || rep.Replay.ToolCall != schemas.EPCallID(first.EPID, first.ToolCallID) {
		t.Fatalf("replay check = %+v, %v", rep, err)
	}
	p.command(t, schemas.VerbReplayFlush, func(c *schemas.ControlCommand) { c.SessionID, c.Reason = "s-replay", "test reset" })
	if d := callOK(t, p.client, replay()); d.Decision != schemas.DecisionAllow {
		t.Fatalf("after flush: %s %v", d.Decision, d.ReasonCodes)
	}
}

// A worker started after 1,000 control events enforces exactly what the
// worker that saw them live enforces; and every control command, accepted
// or refused, has a signed receipt in ClickHouse that the verifier covers.
func TestLateWorkerReplaysThousandEvents(t *testing.T) {
	p := newPlane(t)
	early := p.startWorker(t, "early")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// A second registry bundle (the demo's files server only) to publish and pin.
	files, err := readFileJSON(demoRegistry + "/files.json")
	if err != nil {
		t.Fatal(err)
	}
	const total = 1000
	sent := 0
	send := func(verb string, fill func(*schemas.ControlCommand)) *schemas.ControlReply {
		cmd := p.ctl.NewCommand(verb)
		fill(cmd)
		rep, err := p.ctl.Do(ctx, cmd)
		if err != nil || !rep.OK {
			t.Fatalf("command %d %s: %+v %v", sent, verb, rep, err)
		}
		sent++
		return rep
	}
	var pinDigest string
	for sent < total {
		i := sent
		switch {
		case i == 500:
			send(schemas.VerbRegistryPublish, func(c *schemas.ControlCommand) { c.Manifests, c.Reason = []json.RawMessage{files}, "files only" })
		case i == 501:
			digest, err := enforce.BundleDigest([]json.RawMessage{files})
			if err != nil {
				t.Fatal(err)
			}
			pinDigest = digest
			send(schemas.VerbRegistryPin, func(c *schemas.ControlCommand) { c.Digest, c.Reason = digest, "rollout" })
		case i%10 == 0:
			send(schemas.VerbQuarantineSet, func(c *schemas.ControlCommand) { c.SessionID, c.Reason = fmt.Sprintf("s-%d", i%70), "drill" })
		case i%10 == 1:
			send(schemas.VerbRevoke, func(c *schemas.ControlCommand) { c.Target, c.Reason = fmt.Sprintf("agent:a-%d", i), "drill" })
		case i%3 == 0:
			send(schemas.VerbKillSwitchClear, func(c *schemas.ControlCommand) { c.Scope, c.Reason = fmt.Sprintf("agent:a-%d", i%50), "drill" })
		default:
			send(schemas.VerbKillSwitchSet, func(c *schemas.ControlCommand) { c.Scope, c.Reason = fmt.Sprintf("agent:a-%d", i%50), "drill" })
		}
	}
	// And refused ones: unsigned, and signed by a key talosd does not trust.
	unsigned := p.ctl.NewCommand(schemas.VerbKillSwitchSet)
	unsigned.Scope, unsigned.Reason = "global", "no key"
	msg, err := p.nc.RequestWithContext(ctx, schemas.CtlSubject(unsigned.Verb), mustJSON(t, unsigned))
	if err != nil {
		t.Fatal(err)
	}
	var refused schemas.ControlReply
	if err := json.Unmarshal(msg.Data, &refused); err != nil || refused.OK || refused.Code != schemas.CtlUnsigned {
		t.Fatalf("unsigned command: %s (%v)", msg.Data, err)
	}
	stranger, _ := receipts.GenerateKey()
	mallory := control.NewControlClient(p.nc, stranger, "mallory")
	forged, err := mallory.Do(ctx, func() *schemas.ControlCommand {
		c := mallory.NewCommand(schemas.VerbKillSwitchClear)
		c.Scope, c.Reason = "global", "forged"
		return c
	}())
	if err != nil || forged.OK || forged.Code != schemas.CtlUntrustedKey {
		t.Fatalf("forged command: %+v %v", forged, err)
	}

	testenv.WaitFor(t, 30*time.Second, func() bool { return early.State().Seq() == total })
	late := p.startWorker(t, "late")
	if late.State().Seq() != total {
		t.Fatalf("late worker at seq %d after catching up, want %d", late.State().Seq(), total)
	}
	ve, vl := mustJSON(t, early.State().View()), mustJSON(t, late.State().View())
	if string(ve) != string(vl) {
		t.Fatalf("late worker state differs:\nearly %s\nlate  %s", ve, vl)
	}
	if got := late.State().Registry().Digest(); got != pinDigest {
		t.Fatalf("late worker registry %s, want the pinned %s", got, pinDigest)
	}
	// Both deny what the state says: a set kill switch, a quarantine, and a
	// server that the pinned registry dropped.
	agent := ""
	var view schemas.IncidentView
	_ = json.Unmarshal(vl, &view)
	if len(view.KillSwitches) == 0 || len(view.Quarantines) == 0 {
		t.Fatalf("expected kill switches and quarantines in the replayed state: %s", vl)
	}
	agent = strings.TrimPrefix(view.KillSwitches[0].Target, "agent:")
	p.onEveryWorker(t, readCall(t, "", agent), denied(schemas.CodeKillSwitch))
	p.onEveryWorker(t, readCall(t, view.Quarantines[0].Target, ""), denied(schemas.CodeSessionQuarantined))
	p.onEveryWorker(t, func() *schemas.ToolCall { return newCall(t, "github", "github", map[string]any{"action": "list_prs"}) },
		denied(schemas.CodeToolUnclassifiedDenied))
	withOld := readCall(t, "", "")()
	withOld.RegistryDigest = p.reg.Digest()
	if d := callOK(t, p.client, withOld); !slices.Contains(d.ReasonCodes, schemas.CodeRegistryVersionMismatch) || d.RegistryDigest != pinDigest {
		t.Fatalf("call with the old digest: %s %v under %s", d.Decision, d.ReasonCodes, d.RegistryDigest)
	}

	// ClickHouse: one control receipt per command, accepted and refused,
	// with who/what/why, and the whole database verifies.
	var accepted, refusedRows uint64
	testenv.WaitFor(t, 60*time.Second, func() bool {
		err := p.conn.QueryRow(ctx, "SELECT countIf(accepted = 1), countIf(accepted = 0) FROM "+p.db+".v_control_events WHERE verb NOT IN ('status')").Scan(&accepted, &refusedRows)
		return err == nil && accepted >= total && refusedRows >= 2
	})
	if accepted != total {
		t.Errorf("%d accepted control receipts in ClickHouse, want %d", accepted, total)
	}
	var code, actor string
	if err := p.conn.QueryRow(ctx, "SELECT code, actor FROM "+p.db+".v_control_events WHERE accepted = 0 AND code = ?", schemas.CtlUntrustedKey).Scan(&code, &actor); err != nil || actor != "mallory" {
		t.Errorf("refused forged command row: code %q actor %q (%v)", code, actor, err)
	}
	var seqs uint64
	if err := p.conn.QueryRow(ctx, "SELECT uniqExact(stream_seq) FROM "+p.db+".v_control_events WHERE accepted = 1 AND stream_seq > 0").Scan(&seqs); err != nil || seqs != total {
		t.Errorf("%d distinct control seqs in ClickHouse, want %d (%v)", seqs, total, err)
	}
	testenv.WaitFor(t, 60*time.Second, func() bool {
		var rows uint64
		_ = p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".v_receipts WHERE kind = 'control'").Scan(&rows)
		var ctlRows uint64
		_ = p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".v_control_events").Scan(&ctlRows)
		return rows == ctlRows && rows > 0
	})
	rep, err := query.VerifyDatabase(ctx, p.conn, p.db, p.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("database does not verify: %v", rep.Problems)
	}
}

func readFileJSON(path string) (json.RawMessage, error) { return os.ReadFile(path) }

// TestControlPlaneNeedsLedger: approve, reject and replay administration
// need the shared call ledger; a control plane without one is refused.
func TestControlPlaneNeedsLedger(t *testing.T) {
	if _, err := control.NewControlPlane(nil, nil, control.ControlPlaneOptions{}); err == nil || !strings.Contains(err.Error(), "ledger") {
		t.Fatalf("no ledger: %v", err)
	}
}
