package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// checkExactlyOnce waits until session has want decisions in v_decisions,
// then checks there is exactly one per call and the database verifies.
func (s *stack) checkExactlyOnce(t *testing.T, session string, want uint64) {
	t.Helper()
	s.waitRows(t, query.ViewDecisions, fmt.Sprintf("session_id = '%s'", session), want)
	var n, distinct uint64
	if err := s.conn.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT count(), uniqExact(tool_call_id) FROM %s.v_decisions WHERE session_id = '%s'", s.db, session)).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != want || distinct != want {
		t.Fatalf("v_decisions: %d rows for %d calls, want %d", n, distinct, want)
	}
	rep, err := query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify: %v", rep.Problems)
	}
}

// TestClickHouseOutage kills the real ClickHouse server while calls keep
// coming: decisions keep flowing (the audit trail is in TALOS_AUDIT), the
// sink retries, and after the server is back every receipt is there once.
func TestClickHouseOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a ClickHouse server")
	}
	dir := t.TempDir()
	port := testenv.FreePort(t)
	ctx := context.Background()
	ch, err := testenv.StartClickHouse(ctx, testenv.ClickHouseOptions{Dir: dir, TCPPort: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.Kill)
	s := newStack(t, stackOptions{chAddr: ch.Addr()})
	session := "ch-outage"
	send := func(n int) {
		for i := 0; i < n; i++ {
			c := newCall(t, "files", "list_directory", map[string]any{"path": fmt.Sprintf("dir-%d", i)})
			c.SessionID = session
			if d := s.call(t, c); d.Decision != "allow" {
				t.Fatalf("%s %v", d.Decision, d.ReasonCodes)
			}
		}
	}
	start := time.Now()
	send(100)
	s.waitRows(t, query.ViewDecisions, "session_id = 'ch-outage'", 100)
	t.Logf("%v: first 100 in ClickHouse", time.Since(start))

	ch.Kill()
	t.Logf("%v: ClickHouse killed", time.Since(start))
	send(100) // decided and receipted while ClickHouse is down
	t.Logf("%v: 100 more decided without ClickHouse", time.Since(start))
	time.Sleep(time.Second)

	ch2, err := testenv.StartClickHouse(ctx, testenv.ClickHouseOptions{Dir: dir, TCPPort: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch2.Kill) // its data dir is the test's to remove
	t.Logf("%v: ClickHouse restarted", time.Since(start))
	s.checkExactlyOnce(t, session, 200)
	t.Logf("%v: all 200 there once", time.Since(start))
}

// TestNATSOutage restarts the NATS server (same store, same port) while
// 1,000 calls are queued: workers and the sink reconnect, and every call
// ends with exactly one receipt in ClickHouse.
func TestNATSOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts NATS")
	}
	dir := t.TempDir()
	port := testenv.FreePort(t)
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			ns.Shutdown()
		}
	})
	s := newStack(t, stackOptions{natsURL: ns.URL()})
	const calls = 1000
	session := "nats-outage"
	ctx := context.Background()
	for i := 0; i < calls; i++ {
		c := newCall(t, "files", "list_directory", map[string]any{"path": fmt.Sprintf("dir-%d", i)})
		c.SessionID = session
		raw, _ := json.Marshal(c)
		if err := s.client.Publish(ctx, schemas.PhasePre, "files", c.ToolCallID, raw); err != nil {
			t.Fatal(err)
		}
	}
	audit, err := s.js.Stream(ctx, schemas.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := audit.Info(ctx)
		if err == nil && info.State.Msgs >= 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no progress before the outage")
		}
		time.Sleep(time.Millisecond)
	}
	ns.Shutdown()
	stopped = true
	time.Sleep(500 * time.Millisecond)
	ns2, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns2.Shutdown)
	s.checkExactlyOnce(t, session, calls)
}
