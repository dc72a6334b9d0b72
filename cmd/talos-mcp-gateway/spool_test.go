package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestGatewaySpoolSurvivesKill: the gateway binary queues post events
// while NATS is down (a call that ran across the outage and calls it
// refused for want of Talos), each in its --spool-dir when the call
// returns; killed with SIGKILL and started again once NATS is back, it
// sends them first, and every one reaches ClickHouse exactly once: one
// ToolCallEvent and one post-phase receipt per call in the views.
func TestGatewaySpoolSurvivesKill(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ep = "gw-spool"
	spool := filepath.Join(t.TempDir(), "spool")
	args := []string{"--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", s.registry, "--log-level", "debug",
		"--ep-id", ep, "--spool-dir", spool, "--upstream", "everything=" + testenv.MCPBin(t, testenv.MCPServerEverything)}
	first := testenv.Command(s.gateway, args...)
	gw := s.connectGateway(ctx, first)
	gw.call(ctx, "echo", map[string]any{"message": "before the outage"}).mustAllow(t, "echo before the outage")

	// A long call is decided (the test hears its decision too), then NATS
	// stops while it runs: its post event is queued with NATS down.
	nc, err := nats.Connect(s.natsURL(), nats.RootCAs(s.natsTLS.CA()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	decided := make(chan struct{}, 1)
	if _, err := nc.Subscribe(schemas.DecisionSubjects(ep), func(*nats.Msg) {
		select {
		case decided <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	long := make(chan result, 1)
	go func() {
		long <- gw.call(ctx, "trigger-long-running-operation", map[string]any{"duration": 3, "steps": 1})
	}()
	select {
	case <-decided:
	case <-time.After(60 * time.Second):
		t.Fatal("no decision for the long call")
	}
	s.stopNATS()
	res := (<-long).mustAllow(t, "the call that ran across the outage")
	queued := []string{res.Meta[gateway.MetaToolCallID].(string)}
	for i := range 4 {
		d := gw.call(ctx, "get-sum", map[string]any{"a": i, "b": 1}).mustDeny(t, "get-sum with NATS down")
		queued = append(queued, d.ToolCallID)
	}
	posts := filepath.Join(spool, gateway.SpoolPosts)
	// The spool holds the post event of each call above, and may hold one
	// more: the server's roots/list request, recorded (and refused) like a
	// call when it comes while NATS is down.
	held := spooledCalls(t, posts)
	if !holdsAll(held, queued) || len(held) > len(queued)+1 {
		t.Fatalf("the spool holds post events of %v after the calls returned, want %v", held, queued)
	}

	if err := first.Process.Kill(); err != nil { // SIGKILL: no drain, no exit path
		t.Fatal(err)
	}
	_ = gw.cs.Close() // reaps it
	if again := spooledCalls(t, posts); !slices.Equal(again, held) {
		t.Fatalf("the spool holds post events of %v after the kill, want %v", again, held)
	}

	s.startNATS()
	again := s.connectGateway(ctx, testenv.Command(s.gateway, args...))
	conn, err := query.Open(ctx, s.chAddr, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	count := rowCounter(ctx, t, conn)
	const (
		events   = "SELECT count() FROM " + query.ViewToolCalls + " WHERE tool_call_id = ?"
		receipts = "SELECT count() FROM " + query.ViewReceipts + " WHERE tool_call_id = ? AND phase = 'post'"
	)
	for _, id := range queued {
		testenv.WaitFor(t, 90*time.Second, func() bool { return count(events, id) > 0 && count(receipts, id) > 0 })
	}
	testenv.WaitFor(t, 30*time.Second, func() bool { return countSpooled(t, posts) == 0 })
	for _, id := range queued {
		if e, r := count(events, id), count(receipts, id); e != 1 || r != 1 {
			t.Fatalf("call %s: %d ToolCallEvents and %d post receipts in ClickHouse, want 1 and 1", id, e, r)
		}
	}
	var code string
	if err := conn.QueryRow(ctx, "SELECT error_code FROM "+query.ViewToolCalls+" WHERE tool_call_id = ?", queued[0]).Scan(&code); err != nil || code != "" {
		t.Fatalf("the call that ran: error_code %q (%v), want none", code, err)
	}
	log, err := os.ReadFile(again.log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "spooled events from a previous run queued first") {
		t.Fatal("the restarted gateway did not report replaying its spool")
	}
	again.call(ctx, "echo", map[string]any{"message": "after the restart"}).mustAllow(t, "echo after the restart")
}

// countSpooled is how many events wait in the spool directory dir.
// spooledCalls are the tool_call_ids of the post events spooled in dir,
// sorted.
func spooledCalls(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var post struct {
			ToolCallID string `json:"tool_call_id"`
		}
		if err := json.Unmarshal(raw, &post); err != nil || post.ToolCallID == "" {
			t.Fatalf("spooled %s is no post event: %v", f, err)
		}
		ids = append(ids, post.ToolCallID)
	}
	slices.Sort(ids)
	return ids
}

func holdsAll(held, want []string) bool {
	for _, id := range want {
		if !slices.Contains(held, id) {
			return false
		}
	}
	return true
}

func countSpooled(t *testing.T, dir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return len(files)
}
