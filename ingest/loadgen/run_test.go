package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/mcpup"
)

// NewMaker's envelopes are about the asked size, whatever it is.
func TestNewMaker(t *testing.T) {
	for _, size := range []int{0, 2048, 8192} {
		m, err := NewMaker("files", "list_directory", "bench-x", size, true)
		if err != nil {
			t.Fatal(err)
		}
		var args struct{ Path string }
		if err := json.Unmarshal(m.Args, &args); err != nil || !strings.HasPrefix(args.Path, "bench/x") ||
			len(args.Path) != len("bench/")+max(1, size-700) || !m.Post || m.Session != "bench-x" {
			t.Fatalf("size %d: %+v (%v)", size, m, err)
		}
		env, err := m.make("ep-1")
		if err != nil {
			t.Fatal(err)
		}
		if size > 700 && (len(env.pre) < size-500 || len(env.pre) > size+500) {
			t.Errorf("size %d: the envelope is %d bytes", size, len(env.pre))
		}
	}
}

// WaitEndToEnd waits for a receipt per decided call and per post, and an
// event per post; it fills the end-to-end figures only then.
func TestWaitEndToEnd(t *testing.T) {
	tally := &Tally{Start: time.Now().Add(-time.Second), Latency: make([]time.Duration, 10), None: 2}
	res := &Result{Posts: 3}
	calls := 0
	count := func(context.Context) (uint64, uint64, error) {
		calls++
		if calls < 3 {
			return 10, 3, nil // the posts' receipts are not all there yet
		}
		return 11, 3, nil
	}
	if err := WaitEndToEnd(context.Background(), res, tally, count); err != nil {
		t.Fatal(err)
	}
	if calls != 3 || res.E2ESeconds < 1 || res.EventsPerSec <= 0 || res.EventsPerSec > 14 {
		t.Fatalf("after %d counts: %+v", calls, res)
	}
}

func TestParseCallArgs(t *testing.T) {
	args, err := ParseCallArgs(`{"message":"hi","n":12345678901234567890}`)
	if err != nil || args["message"] != "hi" || args["n"] != json.Number("12345678901234567890") {
		t.Fatalf("ParseCallArgs = %v, %v", args, err)
	}
	for _, bad := range []string{``, `null`, `[]`, `{} {}`, `{"a":`, `"x"`} {
		if _, err := ParseCallArgs(bad); err == nil {
			t.Errorf("ParseCallArgs(%q) accepted", bad)
		}
	}
}

// The text forms of the results carry the figures scripts/bench.sh and a
// person read.
func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	res := &Result{Calls: 10, Concurrency: 2, OfferedRate: 100, Allowed: 9, Denied: 1, DecisionsPerSec: 99.6, P50ms: 1.5,
		Prepared: 10, PrepareSeconds: 0.25, E2ESeconds: 2, EventsPerSec: 5, Posts: 9}
	if err := res.WriteText(&b, true, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"calls 10 from 2 enforcement points, offered 100/s: allowed 9, denied 1, no decision 0\n",
		"post events sent and decided: 9", "decisions: 100/s; latency p50 1.50 ms", "end to end", "2.00 s, 5 events/s",
		"load generator: CPU not measured on this OS; all 10 envelopes built and signed before the clock started (0.25 s)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("bench text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	ks := &KillSwitchResult{Commands: 4, Workers: 2, AfterAckP50: 1.25}
	if err := ks.WriteText(&b); err != nil || !strings.HasPrefix(b.String(), "kill switch: 4 commands, 2 live workers; ack → every worker enforcing: p50 1.25 ms") {
		t.Errorf("kill switch text: %q, %v", b.String(), err)
	}
	b.Reset()
	ms := func(v ...float64) []time.Duration { return msList(v...) }
	specs := [2]mcpup.Spec{{ServerID: "d", Command: []string{"srv"}}, {ServerID: "gw", Command: []string{"gateway"}}}
	mr := NewMCPResult("echo", 5, specs, ms(1, 3, 2), ms(2, 5, 3))
	if mr.Added.PairedP50ms != 1 || mr.D.Calls != 3 || mr.Direct != specs[0].String() {
		t.Fatalf("NewMCPResult = %+v", mr)
	}
	if err := mr.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tools/call echo, 3 calls per side after 5 warm-up", "direct: " + specs[0].String() + "\nvia:    ",
		"added per round (via − direct of the same round): p50 1.000 ms"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("bench-mcp text lacks %q:\n%s", want, b.String())
		}
	}
}
