package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
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

type benchResult struct {
	Calls           int       `json:"calls"`
	Concurrency     int       `json:"concurrency"`
	OfferedRate     int       `json:"offered_rate"`
	Allowed         int64     `json:"allowed"`
	Denied          int64     `json:"denied"`
	NoDecision      int64     `json:"no_decision"`
	SendSeconds     float64   `json:"send_seconds"`
	DecisionsPerSec float64   `json:"decisions_per_sec"`
	P50ms           float64   `json:"decision_p50_ms"`
	P90ms           float64   `json:"decision_p90_ms"`
	P99ms           float64   `json:"decision_p99_ms"`
	MaxMs           float64   `json:"decision_max_ms"`
	E2ESeconds      float64   `json:"e2e_seconds,omitempty"`
	EventsPerSec    float64   `json:"e2e_events_per_sec,omitempty"`
	Posts           int64     `json:"posts,omitempty"`
	KillSwitch      *ksResult `json:"killswitch,omitempty"`

	// Envelopes ready when the clock started (all of them unless
	// --prepare-ahead), and what building and signing those took.
	Prepared          int     `json:"prepared_ahead"`
	PrepareSeconds    float64 `json:"prepare_seconds"`
	PrepareCPUSeconds float64 `json:"prepare_cpu_seconds,omitempty"`
	// The load generator's own CPU (this process, every thread) over the
	// timed part, from the first scheduled send until the last decision,
	// kill-switch rounds included; absent where the OS does not report it.
	LoadGenCPUSeconds    float64 `json:"loadgen_cpu_seconds,omitempty"`
	LoadGenUserSeconds   float64 `json:"loadgen_user_seconds,omitempty"`
	LoadGenSystemSeconds float64 `json:"loadgen_system_seconds,omitempty"`
	LoadGenCPUPerCallUs  float64 `json:"loadgen_cpu_us_per_call,omitempty"`
	LoadGenMaxRSSMiB     float64 `json:"loadgen_max_rss_mib,omitempty"`
}

func (b *benchCmd) Run(g *Globals) error {
	if b.Calls < 0 || b.Concurrency <= 0 || b.Connections <= 0 || b.KillSwitch < 0 || b.PrepareAhead < 0 {
		return usage("--calls, --killswitch and --prepare-ahead must not be negative; --concurrency and --connections must be positive")
	}
	if b.Calls == 0 && b.KillSwitch == 0 {
		return usage("nothing to measure: --calls 0 needs --killswitch N")
	}
	var ks *killswitchBench
	if b.KillSwitch > 0 {
		var err error
		if ks, err = newKillswitchBench(g, &ctlFlags{signerFlags: b.signerFlags, Timeout: b.Timeout}, b.KillSwitch); err != nil {
			return err
		}
		defer ks.close()
		if b.Calls == 0 {
			res, err := ks.run()
			if err != nil {
				return err
			}
			if err := writeJSONFile(b.JSONOut, map[string]any{"killswitch": res}); err != nil {
				return err
			}
			return printKillswitch(g, res)
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
	maker := &envelopeMaker{server: b.Server, tool: b.Tool, session: run, post: b.Post}
	var err error
	if maker.args, err = json.Marshal(map[string]any{"path": "bench/" + strings.Repeat("x", max(1, b.PayloadBytes-700))}); err != nil {
		return err
	}
	if b.Capability != "" {
		if b.AgentKey == "" {
			return usage("--capability needs --agent-key")
		}
		key, err := receipts.LoadPrivateKey(b.AgentKey)
		if err != nil {
			return usage("--agent-key: %v", err)
		}
		raw, err := os.ReadFile(b.Capability)
		if err != nil {
			return usage("--capability: %v", err)
		}
		if maker.signer, err = ingest.NewCallSigner(raw, key); err != nil {
			return usage("--capability: %v", err)
		}
	}
	// Every enforcement point subscribes to its decisions before the clock
	// starts.
	clients := make([]*ingest.Client, b.Concurrency)
	epIDs := make([]string, b.Concurrency)
	for e := range clients {
		nc := conns[e%len(conns)]
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		client, err := ingest.NewClient(nc, js, fmt.Sprintf("%s-%d", run, e))
		if err != nil {
			return err
		}
		defer client.Close()
		clients[e], epIDs[e] = client, client.EPID()
	}

	// Build and sign the envelopes ahead (all of them, by default), then
	// collect the garbage that made, so neither is on the measured path.
	counts := splitCalls(b.Calls, b.Concurrency)
	depth := slices.Max(counts)
	if b.PrepareAhead > 0 {
		depth = max(1, (b.PrepareAhead+b.Concurrency-1)/b.Concurrency)
	}
	cpu0 := sampleCPU()
	prepStart := time.Now()
	envs := startEnvelopes(maker, epIDs, counts, depth)
	defer envs.stop()
	prepared, err := envs.ready()
	if err != nil {
		return failed("building the envelopes: %v", err)
	}
	runtime.GC()
	prepDur := time.Since(prepStart)
	cpu1 := sampleCPU()

	stopProfile := func() {}
	if b.CPUProfile != "" {
		f, err := os.Create(b.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		stopProfile = sync.OnceFunc(pprof.StopCPUProfile)
		defer stopProfile()
	}
	if b.StartedFile != "" {
		if err := os.WriteFile(b.StartedFile, nil, 0o644); err != nil {
			return err
		}
	}

	lat := make([][]time.Duration, b.Concurrency)
	var allowed, denied, none, posted atomic.Int64
	var wg sync.WaitGroup
	var interval time.Duration
	if b.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(b.Concurrency) / float64(b.Rate))
	}
	start := time.Now()
	var (
		ksRes  *ksResult
		ksErr  error
		ksDone = make(chan struct{})
	)
	if ks != nil {
		go func() { defer close(ksDone); ksRes, ksErr = ks.run() }()
	} else {
		close(ksDone)
	}
	for e, client := range clients {
		wg.Add(1)
		go func(e int, client *ingest.Client) {
			defer wg.Done()
			inflight := b.Inflight
			if b.Rate > 0 || inflight < 1 {
				inflight = 1
			}
			// Stagger the enforcement points across one interval.
			offset := time.Duration(0)
			if interval > 0 {
				offset = interval * time.Duration(e) / time.Duration(b.Concurrency)
			}
			sem := make(chan struct{}, inflight)
			var mu sync.Mutex
			var iwg sync.WaitGroup
			k := 0
			for env := range envs.q[e] {
				sched := time.Now()
				if interval > 0 {
					sched = start.Add(offset + time.Duration(k)*interval)
					time.Sleep(time.Until(sched))
				}
				k++
				sem <- struct{}{}
				iwg.Add(1)
				go func(env *benchEnvelope, sched time.Time) {
					defer func() { <-sem; iwg.Done() }()
					d, err := sendBenchCall(client, schemas.PhasePre, b.Server, env, env.pre, b.Timeout)
					// Latency counts from the scheduled send time, so a
					// stalled sender cannot hide queueing (no coordinated omission).
					l := time.Since(sched)
					switch {
					case err != nil:
						none.Add(1)
					case d.Decision == schemas.DecisionAllow:
						allowed.Add(1)
						if env.post != nil {
							if _, err := sendBenchCall(client, schemas.PhasePost, b.Server, env, env.post, b.Timeout); err == nil {
								posted.Add(1)
							}
						}
					default:
						denied.Add(1)
					}
					mu.Lock()
					lat[e] = append(lat[e], l)
					mu.Unlock()
				}(env, sched)
			}
			iwg.Wait()
		}(e, client)
	}
	wg.Wait()
	sendDur := time.Since(start)
	stopProfile()
	cpu2 := sampleCPU()
	<-ksDone
	if ksErr != nil {
		return ksErr
	}
	if err := envs.failed(); err != nil {
		return failed("building the envelopes: %v", err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := int(p * float64(len(all)-1))
		return float64(all[i].Microseconds()) / 1000
	}
	res := benchResult{
		Calls: len(all), Concurrency: b.Concurrency, OfferedRate: b.Rate,
		Allowed: allowed.Load(), Denied: denied.Load(), NoDecision: none.Load(),
		SendSeconds: sendDur.Seconds(), DecisionsPerSec: float64(len(all)) / sendDur.Seconds(),
		P50ms: pct(0.50), P90ms: pct(0.90), P99ms: pct(0.99), MaxMs: pct(1),
		KillSwitch: ksRes,
		Prepared:   prepared, PrepareSeconds: prepDur.Seconds(),
	}
	res.Posts = posted.Load()
	if cpu0.ok {
		res.PrepareCPUSeconds = cpu1.sub(cpu0).Seconds()
		timed := cpu2.sub(cpu1)
		res.LoadGenCPUSeconds = timed.Seconds()
		res.LoadGenUserSeconds = (cpu2.user - cpu1.user).Seconds()
		res.LoadGenSystemSeconds = (cpu2.system - cpu1.system).Seconds()
		if len(all) > 0 {
			res.LoadGenCPUPerCallUs = float64(timed.Microseconds()) / float64(len(all))
		}
		res.LoadGenMaxRSSMiB = float64(cpu2.maxRSS) / (1 << 20)
	}
	if ch != nil {
		deadline := time.Now().Add(2 * time.Minute)
		// Every decided envelope has a receipt; every post a ToolCallEvent.
		want := uint64(len(all)) - uint64(none.Load()) + uint64(res.Posts)
		wantEvents := uint64(res.Posts)
		for {
			n, err := query.CountSessionReceipts(context.Background(), ch, g.ClickhouseDatabase, run)
			var m uint64
			if err == nil && wantEvents > 0 {
				m, err = query.CountSessionToolCalls(context.Background(), ch, g.ClickhouseDatabase, run)
			}
			if err == nil && n >= want && m >= wantEvents {
				break
			}
			if time.Now().After(deadline) {
				return failed("only %d of %d receipts and %d of %d ToolCallEvents reached ClickHouse within 2 minutes", n, want, m, wantEvents)
			}
			time.Sleep(20 * time.Millisecond)
		}
		e2e := time.Since(start)
		res.E2ESeconds = e2e.Seconds()
		res.EventsPerSec = float64(want+wantEvents) / e2e.Seconds()
	}
	if err := writeJSONFile(b.JSONOut, res); err != nil {
		return err
	}
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	b.print(os.Stdout, &res, ch != nil)
	if ksRes != nil {
		return printKillswitch(g, ksRes)
	}
	return nil
}

// print writes the human-readable result. scripts/bench.sh reads these
// lines: keep their wording.
func (b *benchCmd) print(w io.Writer, res *benchResult, e2e bool) {
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

// cpuSample is this process's CPU time at one instant.
type cpuSample struct {
	user, system time.Duration
	maxRSS       int64
	ok           bool
}

func sampleCPU() cpuSample {
	u, s, rss, ok := processCPU()
	return cpuSample{user: u, system: s, maxRSS: rss, ok: ok}
}

// sub is the CPU time (user + system) from earlier to s.
func (s cpuSample) sub(earlier cpuSample) time.Duration {
	return s.user + s.system - earlier.user - earlier.system
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
