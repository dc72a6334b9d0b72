package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
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
}

func (b *benchCmd) Run(g *Globals) error {
	if b.Calls < 0 || b.Concurrency <= 0 || b.Connections <= 0 || b.KillSwitch < 0 {
		return usage("--calls and --killswitch must not be negative; --concurrency and --connections must be positive")
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
	// Arguments are marshalled once: the load generator shares the CPU with
	// the pipeline it measures, so it does as little per call as it can.
	args, err := json.Marshal(map[string]any{"path": "bench/" + strings.Repeat("x", max(1, b.PayloadBytes-700))})
	if err != nil {
		return err
	}
	var signer *ingest.CallSigner
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
		if signer, err = ingest.NewCallSigner(raw, key); err != nil {
			return usage("--capability: %v", err)
		}
	}
	lat := make([][]time.Duration, b.Concurrency)
	var allowed, denied, none, posted atomic.Int64
	var wg sync.WaitGroup
	perEP := (b.Calls + b.Concurrency - 1) / b.Concurrency
	var interval time.Duration
	if b.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(b.Concurrency) / float64(b.Rate))
	}
	start := time.Now()
	sent := atomic.Int64{}
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
	for e := 0; e < b.Concurrency; e++ {
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
			for k := 0; k < perEP; k++ {
				if sent.Add(1) > int64(b.Calls) {
					break
				}
				sched := time.Now()
				if interval > 0 {
					sched = start.Add(offset + time.Duration(k)*interval)
					time.Sleep(time.Until(sched))
				}
				sem <- struct{}{}
				iwg.Add(1)
				go func(sched time.Time) {
					defer func() { <-sem; iwg.Done() }()
					call, _ := ingest.NewCall(client.EPID(), b.Server, b.Tool, json.RawMessage(args))
					call.SessionID = run
					if signer != nil {
						call.Actor.AgentID = signer.Holder()
						if err := signer.Sign(call); err != nil {
							none.Add(1)
							return
						}
					}
					ctx, cancel := context.WithTimeout(context.Background(), b.Timeout)
					d, err := client.Call(ctx, call)
					cancel()
					// Latency counts from the scheduled send time, so a
					// stalled sender cannot hide queueing (no coordinated omission).
					l := time.Since(sched)
					switch {
					case err != nil:
						none.Add(1)
					case d.Decision == schemas.DecisionAllow:
						allowed.Add(1)
						if b.Post && b.sendPost(client, call, signer, sched) {
							posted.Add(1)
						}
					default:
						denied.Add(1)
					}
					mu.Lock()
					lat[e] = append(lat[e], l)
					mu.Unlock()
				}(sched)
			}
			iwg.Wait()
		}(e, client)
	}
	wg.Wait()
	sendDur := time.Since(start)
	<-ksDone
	if ksErr != nil {
		return ksErr
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
	}
	res.Posts = posted.Load()
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
	if g.JSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("calls %d from %d enforcement points, offered %d/s: allowed %d, denied %d, no decision %d\n",
		res.Calls, res.Concurrency, res.OfferedRate, res.Allowed, res.Denied, res.NoDecision)
	if b.Post {
		fmt.Printf("post events sent and decided: %d (latency figures are of the pre decisions)\n", res.Posts)
	}
	fmt.Printf("decisions: %.0f/s; latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
		res.DecisionsPerSec, res.P50ms, res.P90ms, res.P99ms, res.MaxMs)
	if ch != nil {
		fmt.Printf("end to end (publish → signed receipts and ToolCallEvents in ClickHouse): %.2f s, %.0f events/s\n", res.E2ESeconds, res.EventsPerSec)
	}
	if ksRes != nil {
		return printKillswitch(g, ksRes)
	}
	return nil
}

// benchResultText is the CallToolResult of every bench post event.
var benchResultText = json.RawMessage(`{"content":[{"type":"text","text":"bench: 3 entries"}]}`)

// sendPost sends the post event of an allowed call and reports whether it
// was decided.
func (b *benchCmd) sendPost(client *ingest.Client, pre *schemas.ToolCall, signer *ingest.CallSigner, started time.Time) bool {
	post, err := ingest.PostOf(pre, benchResultText, true, started, time.Now())
	if err != nil {
		return false
	}
	if signer != nil && signer.Sign(post) != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.Timeout)
	defer cancel()
	_, err = client.Call(ctx, post)
	return err == nil
}
