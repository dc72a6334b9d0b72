package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/testenv"
)

// talosctl bench against a worker that requires capabilities: unsigned
// calls are denied; prepared, signed calls (pre and post) are all allowed
// and recorded end to end; the load generator reports its own CPU, writes
// its JSON and CPU profile, and marks when the timed part starts; with
// --prepare-ahead it builds the rest during the run.
func TestBenchSignedCalls(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	genKeys(t, talosctl, dir, "worker", "issuer", "agent")
	if out, code := run(t, talosctl, "cap", "issue", "--issuer-key", p("issuer.key"), "--subject", "bench-agent",
		"--subject-key", p("agent.pub"), "--scope", "tool:files:*", "--ttl", "1h", "--out", p("cap.json")); code != 0 {
		t.Fatalf("cap issue: exit %d\n%s", code, out)
	}
	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "../talosd/demo/registry", "--signing-key", p("worker.key"), "--capability-issuers", p("issuer.pub"),
		"--http-addr", "", "--chains", "2", "--instance", "bench-worker")
	g := []string{"--nats-url", ns.URL(), "--nats-auth", "none", "--clickhouse-addr", addr, "--clickhouse-database", db}
	bench := func(args ...string) loadgen.Result {
		t.Helper()
		out, code := run(t, talosctl, append(append(slices.Clone(g), "--json", "bench", "--concurrency", "5"), args...)...)
		var r loadgen.Result
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
			lb, _ := os.ReadFile(p("talosd.log"))
			t.Fatalf("bench %v: exit %d %v\n%s\ntalosd log:\n%s", args, code, err, out, lb)
		}
		return r
	}

	if r := bench("--calls", "20", "--rate", "0", "--no-clickhouse"); r.Denied != 20 || r.Allowed != 0 {
		t.Fatalf("unsigned calls with capabilities required: %+v", r)
	}

	r := bench("--calls", "200", "--rate", "0", "--inflight", "2", "--post", "--capability", p("cap.json"), "--agent-key", p("agent.key"),
		"--json-out", p("bench.json"), "--cpu-profile", p("bench.pprof"), "--started-file", p("started"))
	if r.Calls != 200 || r.Allowed != 200 || r.Posts != 200 || r.NoDecision != 0 || r.Prepared != 200 || r.EventsPerSec <= 0 {
		t.Fatalf("signed run: %+v", r)
	}
	if r.LoadGenCPUSeconds <= 0 || r.LoadGenCPUPerCallUs <= 0 || r.PrepareCPUSeconds <= 0 || r.LoadGenMaxRSSMiB <= 0 ||
		r.LoadGenUserSeconds+r.LoadGenSystemSeconds < r.LoadGenCPUSeconds*0.99 {
		t.Fatalf("load generator CPU: %+v", r)
	}
	var fromFile loadgen.Result
	if b, err := os.ReadFile(p("bench.json")); err != nil || json.Unmarshal(b, &fromFile) != nil || fromFile != r {
		t.Fatalf("--json-out: %v\n%s", err, b)
	}
	if st, err := os.Stat(p("bench.pprof")); err != nil || st.Size() == 0 {
		t.Fatalf("--cpu-profile: %v", err)
	}
	if _, err := os.Stat(p("started")); err != nil {
		t.Fatalf("--started-file: %v", err)
	}

	out, code := run(t, talosctl, append(slices.Clone(g), "bench", "--concurrency", "5", "--calls", "100", "--rate", "500",
		"--prepare-ahead", "10", "--capability", p("cap.json"), "--agent-key", p("agent.key"))...)
	for _, want := range []string{"allowed 100, denied 0, no decision 0", "decisions: ", "end to end",
		"load generator (this process) over the timed part: CPU ", "10 envelopes ready when the clock started"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("bench --prepare-ahead 10: exit %d, want %q in\n%s", code, want, out)
		}
	}
}
