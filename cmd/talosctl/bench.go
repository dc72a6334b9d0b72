package main

import (
	"context"
	"encoding/json"
	"os"
	"runtime/debug"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
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
	Traced       bool          `name:"traced" help:"Each call names a sampled parent span of its own trace (trace_id, parent_span_id), as a traced enforcement point's would: a worker with traces on (OTEL_* variables) records a decision span per envelope."`
	Capability   string        `name:"capability" type:"existingfile" help:"Sign every call with this capability chain (CP-PA1), as its holder (--agent-key); needed when talosd requires capabilities."`
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
	var ks *control.ControlClient
	if b.KillSwitch > 0 {
		client, closeCtl, err := (&ctlFlags{signerFlags: b.signerFlags, Timeout: b.Timeout}).open(g)
		if err != nil {
			return err
		}
		defer closeCtl()
		if ks = client; b.Calls == 0 {
			return b.killswitchOnly(g, ks)
		}
	}
	// The load generator shares the machine with the pipeline it measures:
	// keep its collector from taking CPU the pipeline could use.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	run := "bench-" + uuid.NewString()[:8]
	// One NATS user for every simulated enforcement point: the worker user
	// may read all their decision subjects.
	clients, closeAll, err := loadgen.Connect(b.Connections, b.Concurrency, run,
		func() (*nats.Conn, error) { return g.connect(schemas.NATSRoleWorker, "") })
	defer closeAll()
	if err != nil {
		return err
	}
	var ch driver.Conn
	if b.ClickHouse {
		c, err := g.Endpoint().Open(context.Background(), g.ClickhouseDatabase)
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
	prep, err := loadgen.Prepare(maker, clients, b.Calls, b.PrepareAhead)
	if err != nil {
		return failed("building the envelopes: %v", err)
	}
	defer prep.Stop()
	res, err := b.measure(g, prep, clients, ks, ch, run)
	if err != nil {
		return err
	}
	if err := loadgen.WriteJSONFile(b.JSONOut, res); err != nil {
		return err
	}
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	if err := res.WriteText(os.Stdout, b.Post, ch != nil); err != nil {
		return err
	}
	if res.KillSwitch != nil {
		return printKillswitch(g, res.KillSwitch)
	}
	return nil
}

// killswitchOnly measures kill-switch propagation on an idle stack.
func (b *benchCmd) killswitchOnly(g *Globals, ks *control.ControlClient) error {
	res, err := loadgen.KillSwitchRounds(ks, b.KillSwitch, b.Timeout)
	if err != nil {
		return failed("%v", err)
	}
	if err := loadgen.WriteJSONFile(b.JSONOut, map[string]any{"killswitch": res}); err != nil {
		return err
	}
	return printKillswitch(g, res)
}

// maker reads the flags that shape the envelopes: size, tool, --post, and
// the capability to sign them with.
func (b *benchCmd) maker(run string) (*loadgen.Maker, error) {
	maker, err := loadgen.NewMaker(b.Server, b.Tool, run, b.PayloadBytes, b.Post)
	if maker != nil {
		maker.Traced = b.Traced
	}
	if err != nil || b.Capability == "" {
		return maker, err
	}
	if b.AgentKey == "" {
		return nil, usage("--capability needs --agent-key")
	}
	if maker.Signer, err = ep.LoadCallSigner(b.Capability, b.AgentKey); err != nil {
		return nil, usage("%v", err)
	}
	return maker, nil
}

// measure is the timed part: the calls (and kill-switch rounds, with ks)
// under the CPU profile, then, with ch, the wait until ClickHouse holds
// every receipt and ToolCallEvent of the run.
func (b *benchCmd) measure(g *Globals, prep *loadgen.Prepared, clients []*ep.Client, ks *control.ControlClient, ch driver.Conn, run string) (*loadgen.Result, error) {
	stopProfile, err := loadgen.Profile{CPUProfile: b.CPUProfile, StartedFile: b.StartedFile}.Start()
	defer stopProfile()
	if err != nil {
		return nil, err
	}
	pace := loadgen.Pacing{Rate: b.Rate, Inflight: b.Inflight, Server: b.Server, Timeout: b.Timeout}
	res, t, err := prep.Run(clients, pace, ks, b.KillSwitch, stopProfile)
	if err != nil {
		return nil, failed("%v", err)
	}
	if ch != nil {
		count := query.SessionCounter(ch, g.ClickhouseDatabase, run, res.Posts > 0)
		if err := loadgen.WaitEndToEnd(context.Background(), &res, t, count); err != nil {
			return nil, failed("%v", err)
		}
	}
	return &res, nil
}

func printKillswitch(g *Globals, r *loadgen.KillSwitchResult) error {
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"killswitch": r})
	}
	if err := r.WriteText(os.Stdout); err != nil {
		return err
	}
	if r.Missing > 0 {
		return failed("%d worker confirmations missing", r.Missing)
	}
	return nil
}
