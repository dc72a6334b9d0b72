package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
)

type benchCmd struct {
	Calls        int           `name:"calls" default:"20000" help:"Total calls to send."`
	Concurrency  int           `name:"concurrency" default:"100" help:"Concurrent enforcement points (each its own ep_id)."`
	Rate         int           `name:"rate" default:"2000" help:"Offered calls/s across all enforcement points; 0 sends as fast as decisions come back."`
	Inflight     int           `name:"inflight" default:"1" help:"Calls each enforcement point keeps in flight when --rate is 0."`
	PayloadBytes int           `name:"payload-bytes" default:"2048" help:"Approximate envelope size."`
	Server       string        `name:"server" default:"files" help:"server_id to call."`
	Tool         string        `name:"tool" default:"list_directory" help:"Tool to call (a read tool of the registry)."`
	Connections  int           `name:"connections" default:"4" help:"NATS connections the enforcement points share."`
	ClickHouse   bool          `name:"clickhouse" default:"true" negatable:"" help:"Also measure end to end: until every receipt is in ClickHouse."`
	Timeout      time.Duration `name:"timeout" default:"10s" help:"Decision timeout per call (none in time counts as a deny)."`
	Post         bool          `name:"post" help:"After each allow, also send the call's post event (a small result): every call then yields two receipts and a ToolCallEvent with redacted, hashed payloads."`
	Capability   string        `name:"capability" type:"existingfile" help:"Sign every call with this capability chain (seed 002), as its holder (--agent-key); needed when talosd requires capabilities."`
	AgentKey     string        `name:"agent-key" type:"path" help:"The chain holder's key (.key) for --capability."`
	KillSwitch   int           `name:"killswitch" help:"Also measure kill-switch propagation: this many set/clear rounds (each waits until every live worker enforces it), during the call load; with --calls 0, on an idle stack."`
	PrepareAhead int           `name:"prepare-ahead" help:"Envelopes (pre and post) are built and signed before their send, off the measured path. 0: all of them before the clock starts (about 3 KB of heap per call, 6 KB with --post). N: about N kept ready (at least one per enforcement point), the rest built during the run on the same CPU (and counted in the load generator's CPU)."`
	JSONOut      string        `name:"json-out" type:"path" help:"Also write the JSON result (as --json prints it) to this file."`
	CPUProfile   string        `name:"cpu-profile" type:"path" help:"Write a CPU profile of this process over the timed part (go tool pprof reads it)."`
	StartedFile  string        `name:"started-file" type:"path" help:"Create this file when the timed part starts (the envelopes are ready): lets a script line a profiler up with the load."`
	signerFlags
}

func (b *benchCmd) Run(g *Globals) error {
	if b.Calls < 0 || b.Concurrency <= 0 || b.Connections <= 0 || b.KillSwitch < 0 || b.PrepareAhead < 0 {
		return usage("--calls, --killswitch and --prepare-ahead must not be negative; --concurrency and --connections must be positive")
	}
	if b.Calls == 0 && b.KillSwitch == 0 {
		return usage("nothing to measure: --calls 0 needs --killswitch N")
	}
	var ks *ctlSession
	if b.KillSwitch > 0 {
		var err error
		if ks, err = (&ctlFlags{signerFlags: b.signerFlags, Timeout: b.Timeout}).open(g); err != nil {
			return err
		}
		defer ks.close()
		if b.Calls == 0 {
			return b.killswitchOnly(g, ks)
		}
	}
	// The load generator shares the machine with the pipeline it measures:
	// keep its collector from taking CPU the pipeline could use.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	run := "bench-" + uuid.NewString()[:8]
	conns := make([]*nats.Conn, b.Connections)
	for i := range conns {
		// One NATS user for every simulated enforcement point: the worker
		// user may read all their decision subjects.
		nc, err := g.connect(schemas.NATSRoleWorker, "")
		if err != nil {
			return err
		}
		defer nc.Close()
		conns[i] = nc
	}
	var ch driver.Conn
	if b.ClickHouse {
		c, err := query.Open(context.Background(), g.ClickhouseAddr, g.ClickhouseDatabase)
		if err != nil {
			return failed("clickhouse %s: %v (use --no-clickhouse to measure decisions only)", g.ClickhouseAddr, err)
		}
		defer c.Close()
		ch = c
	}
	maker, err := b.maker(run)
	if err != nil {
		return err
	}
	clients, err := b.clients(conns, run)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	if err != nil {
		return err
	}
	prep, err := loadgen.Prepare(maker, clients, b.Calls, b.PrepareAhead)
	if err != nil {
		return failed("building the envelopes: %v", err)
	}
	defer prep.Stop()
	res, err := b.measure(g, prep, clients, ks, ch, run)
	if err != nil {
		return err
	}
	if err := writeJSONFile(b.JSONOut, res); err != nil {
		return err
	}
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	b.print(os.Stdout, res, ch != nil)
	if res.KillSwitch != nil {
		return printKillswitch(g, res.KillSwitch)
	}
	return nil
}

// killswitchOnly measures kill-switch propagation on an idle stack.
func (b *benchCmd) killswitchOnly(g *Globals, ks *ctlSession) error {
	res, err := loadgen.KillSwitchRounds(ks.client, b.KillSwitch, b.Timeout)
	if err != nil {
		return failed("%v", err)
	}
	if err := writeJSONFile(b.JSONOut, map[string]any{"killswitch": res}); err != nil {
		return err
	}
	return printKillswitch(g, res)
}

// clients makes the simulated enforcement points, spread over conns;
// each subscribes to its decisions before the clock starts. It returns
// those made so far also on error.
func (b *benchCmd) clients(conns []*nats.Conn, run string) ([]*ingest.Client, error) {
	var clients []*ingest.Client
	for e := range b.Concurrency {
		nc := conns[e%len(conns)]
		js, err := jetstream.New(nc)
		if err != nil {
			return clients, err
		}
		client, err := ingest.NewClient(nc, js, fmt.Sprintf("%s-%d", run, e))
		if err != nil {
			return clients, err
		}
		clients = append(clients, client)
	}
	return clients, nil
}

// maker reads the flags that shape the envelopes: size, tool, --post, and
// the capability to sign them with.
func (b *benchCmd) maker(run string) (*loadgen.Maker, error) {
	maker := &loadgen.Maker{Server: b.Server, Tool: b.Tool, Session: run, Post: b.Post}
	var err error
	if maker.Args, err = json.Marshal(map[string]any{"path": "bench/" + strings.Repeat("x", max(1, b.PayloadBytes-700))}); err != nil {
		return nil, err
	}
	if b.Capability == "" {
		return maker, nil
	}
	if b.AgentKey == "" {
		return nil, usage("--capability needs --agent-key")
	}
	if maker.Signer, err = ingest.LoadCallSigner(b.Capability, b.AgentKey); err != nil {
		return nil, usage("%v", err)
	}
	return maker, nil
}

// measure is the timed part: the calls (and kill-switch rounds, with ks)
// under the CPU profile, then, with ch, the wait until ClickHouse holds
// every receipt and ToolCallEvent of the run.
func (b *benchCmd) measure(g *Globals, prep *loadgen.Prepared, clients []*ingest.Client, ks *ctlSession, ch driver.Conn, run string) (*loadgen.Result, error) {
	stopProfile := func() {}
	if b.CPUProfile != "" {
		f, err := os.Create(b.CPUProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		stopProfile = sync.OnceFunc(pprof.StopCPUProfile)
		defer stopProfile()
	}
	if b.StartedFile != "" {
		if err := os.WriteFile(b.StartedFile, nil, 0o644); err != nil {
			return nil, err
		}
	}
	var (
		ksRes  *loadgen.KillSwitchResult
		ksErr  error
		ksDone = make(chan struct{})
	)
	if ks != nil {
		go func() {
			defer close(ksDone)
			ksRes, ksErr = loadgen.KillSwitchRounds(ks.client, b.KillSwitch, b.Timeout)
		}()
	} else {
		close(ksDone)
	}
	t := prep.Send(clients, loadgen.Pacing{Rate: b.Rate, Inflight: b.Inflight, Server: b.Server, Timeout: b.Timeout})
	stopProfile()
	end := loadgen.SampleCPU()
	<-ksDone
	if ksErr != nil {
		return nil, failed("%v", ksErr)
	}
	if t.BuildErr != nil {
		return nil, failed("building the envelopes: %v", t.BuildErr)
	}
	res := loadgen.NewResult(b.Concurrency, b.Rate, prep, t, end)
	res.KillSwitch = ksRes
	if ch != nil {
		if err := waitEndToEnd(g, ch, run, t, &res); err != nil {
			return nil, err
		}
	}
	return &res, nil
}

// waitEndToEnd waits until every decided envelope has its receipt and
// every post its ToolCallEvent in ClickHouse, and records how long the run
// took end to end.
func waitEndToEnd(g *Globals, ch driver.Conn, run string, t *loadgen.Tally, res *loadgen.Result) error {
	want := uint64(len(t.Latency)) - uint64(t.None) + uint64(res.Posts)
	wantEvents := uint64(res.Posts)
	count := func(ctx context.Context) (n, m uint64, err error) {
		n, err = query.CountSessionReceipts(ctx, ch, g.ClickhouseDatabase, run)
		if err == nil && wantEvents > 0 {
			m, err = query.CountSessionToolCalls(ctx, ch, g.ClickhouseDatabase, run)
		}
		return n, m, err
	}
	n, m, ok := loadgen.WaitStored(context.Background(), count, want, wantEvents, time.Now().Add(2*time.Minute))
	if !ok {
		return failed("only %d of %d receipts and %d of %d ToolCallEvents reached ClickHouse within 2 minutes", n, want, m, wantEvents)
	}
	e2e := time.Since(t.Start)
	res.E2ESeconds = e2e.Seconds()
	res.EventsPerSec = float64(want+wantEvents) / e2e.Seconds()
	return nil
}

// print writes the human-readable result. scripts/bench.sh reads these
// lines: keep their wording.
func (b *benchCmd) print(w io.Writer, res *loadgen.Result, e2e bool) {
	fmt.Fprintf(w, "calls %d from %d enforcement points, offered %d/s: allowed %d, denied %d, no decision %d\n",
		res.Calls, res.Concurrency, res.OfferedRate, res.Allowed, res.Denied, res.NoDecision)
	if b.Post {
		fmt.Fprintf(w, "post events sent and decided: %d (latency figures are of the pre decisions)\n", res.Posts)
	}
	fmt.Fprintf(w, "decisions: %.0f/s; latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
		res.DecisionsPerSec, res.P50ms, res.P90ms, res.P99ms, res.MaxMs)
	if e2e {
		fmt.Fprintf(w, "end to end (publish → signed receipts and ToolCallEvents in ClickHouse): %.2f s, %.0f events/s\n", res.E2ESeconds, res.EventsPerSec)
	}
	ahead := fmt.Sprintf("all %d envelopes built and signed before the clock started", res.Prepared)
	if res.Prepared < res.Calls {
		ahead = fmt.Sprintf("%d envelopes ready when the clock started, the rest built and signed during the run", res.Prepared)
	}
	if res.LoadGenCPUSeconds == 0 && res.PrepareCPUSeconds == 0 {
		fmt.Fprintf(w, "load generator: CPU not measured on this OS; %s (%.2f s)\n", ahead, res.PrepareSeconds)
		return
	}
	fmt.Fprintf(w, "load generator (this process) over the timed part: CPU %.2f s (user %.2f s, system %.2f s), %.0f µs per call, %.2f cores; peak RSS %.0f MiB\n",
		res.LoadGenCPUSeconds, res.LoadGenUserSeconds, res.LoadGenSystemSeconds, res.LoadGenCPUPerCallUs,
		res.LoadGenCPUSeconds/max(res.SendSeconds, 1e-9), res.LoadGenMaxRSSMiB)
	fmt.Fprintf(w, "load generator before the clock: %s in %.2f s (CPU %.2f s)\n", ahead, res.PrepareSeconds, res.PrepareCPUSeconds)
}

// writeJSONFile writes v as one JSON line to path; "" writes nothing.
func writeJSONFile(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
