package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// WriteText writes res for a person: the calls and their decisions, the
// post events with post, latency, the end-to-end figure with e2e, and the
// load generator's own CPU. scripts/bench.sh reads these lines: keep their
// wording.
func (res *Result) WriteText(w io.Writer, post, e2e bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "calls %d from %d enforcement points, offered %d/s: allowed %d, denied %d, no decision %d\n",
		res.Calls, res.Concurrency, res.OfferedRate, res.Allowed, res.Denied, res.NoDecision)
	if post {
		fmt.Fprintf(&b, "post events sent and decided: %d (latency figures are of the pre decisions)\n", res.Posts)
	}
	fmt.Fprintf(&b, "decisions: %.0f/s; latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
		res.DecisionsPerSec, res.P50ms, res.P90ms, res.P99ms, res.MaxMs)
	if e2e {
		fmt.Fprintf(&b, "end to end (publish → signed receipts and ToolCallEvents in ClickHouse): %.2f s, %.0f events/s\n", res.E2ESeconds, res.EventsPerSec)
	}
	ahead := fmt.Sprintf("all %d envelopes built and signed before the clock started", res.Prepared)
	if res.Prepared < res.Calls {
		ahead = fmt.Sprintf("%d envelopes ready when the clock started, the rest built and signed during the run", res.Prepared)
	}
	if res.LoadGenCPUSeconds == 0 && res.PrepareCPUSeconds == 0 {
		fmt.Fprintf(&b, "load generator: CPU not measured on this OS; %s (%.2f s)\n", ahead, res.PrepareSeconds)
	} else {
		fmt.Fprintf(&b, "load generator (this process) over the timed part: CPU %.2f s (user %.2f s, system %.2f s), %.0f µs per call, %.2f cores; peak RSS %.0f MiB\n",
			res.LoadGenCPUSeconds, res.LoadGenUserSeconds, res.LoadGenSystemSeconds, res.LoadGenCPUPerCallUs,
			res.LoadGenCPUSeconds/max(res.SendSeconds, 1e-9), res.LoadGenMaxRSSMiB)
		fmt.Fprintf(&b, "load generator before the clock: %s in %.2f s (CPU %.2f s)\n", ahead, res.PrepareSeconds, res.PrepareCPUSeconds)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteText writes r's propagation figures on one line.
func (r *KillSwitchResult) WriteText(w io.Writer) error {
	_, err := fmt.Fprintf(w, "kill switch: %d commands, %d live workers; ack → every worker enforcing: p50 %.2f ms, p99 %.2f ms, max %.2f ms (send → enforcing: p50 %.2f ms, p99 %.2f ms)\n",
		r.Commands, r.Workers, r.AfterAckP50, r.AfterAckP99, r.AfterAckMax, r.AfterSendP50, r.AfterSendP99)
	return err
}

// WriteText writes res for a person: what was compared, a latency table
// (direct, via, and what via adds) and the per-round difference.
func (res *MCPResult) WriteText(w io.Writer) error {
	var b strings.Builder
	what := res.Tool // a tool's name, or a request named by its method (NewMCPOp)
	if !strings.Contains(what, "/") {
		what = "tools/call " + what
	}
	fmt.Fprintf(&b, "%s, %d calls per side after %d warm-up, one in flight, sides interleaved; every result checked equal\n",
		what, res.D.Calls, res.Warmup)
	fmt.Fprintf(&b, "direct: %s\nvia:    %s\n", res.Direct, res.Via)
	fmt.Fprintf(&b, "%-22s %9s %9s %9s %9s %9s\n", "latency, ms", "p50", "p90", "p99", "max", "mean")
	row := func(name string, s LatencySummary) {
		fmt.Fprintf(&b, "%-22s %9.3f %9.3f %9.3f %9.3f %9.3f\n", name, s.P50ms, s.P90ms, s.P99ms, s.MaxMs, s.MeanMs)
	}
	row("direct", res.D)
	row("via", res.V)
	a := res.Added
	fmt.Fprintf(&b, "%-22s %9.3f %9.3f %9.3f %9s %9.3f\n", "added (via − direct)", a.P50ms, a.P90ms, a.P99ms, "", a.MeanMs)
	fmt.Fprintf(&b, "added per round (via − direct of the same round): p50 %.3f ms, p99 %.3f ms\n", a.PairedP50ms, a.PairedP99ms)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSONFile writes v as one JSON line to path, as `talosctl bench
// --json-out` keeps a result; "" writes nothing.
func WriteJSONFile(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
