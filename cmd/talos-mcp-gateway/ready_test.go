package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/testenv"
)

// TestNoAnswerBeforeTalos (issue 21, "ready means ready"): a gateway
// started while NATS is down answers no request, the handshake included:
// the client's initialize waits. Once NATS is back and the gateway has
// subscribed to its decisions, the handshake completes and the very first
// call is decided and forwarded, never refused ENFORCEMENT_UNAVAILABLE.
func TestNoAnswerBeforeTalos(t *testing.T) {
	s := startStack(t)
	s.stopNATS()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logPath := filepath.Join(s.dir, "gateway-ready.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := testenv.Command(s.gateway, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", s.registry,
		"--trusted-keys", filepath.Join(s.dir, "worker.pub"), "--ep-id", "gw-ready",
		"--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"))
	cmd.Stderr = logf
	type connected struct {
		cs  *mcp.ClientSession
		err error
	}
	done := make(chan connected, 1)
	go func() {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "ready-test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		done <- connected{cs, err}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("gateway log (tail):\n%s", tail(string(b), 3000))
		}
	})
	// The gateway is up (its upstream listed) long before this ends; an
	// answered handshake would arrive within it. It says it waits, and
	// why, and does not claim to be ready.
	waitLog(t, logPath, `msg="talos-mcp-gateway waiting for Talos`)
	waitLog(t, logPath, "connection refused")
	select {
	case c := <-done:
		if c.cs != nil {
			c.cs.Close()
		}
		t.Fatalf("the handshake was answered while Talos was unreachable (err %v)", c.err)
	case <-time.After(3 * time.Second):
	}
	if b, _ := os.ReadFile(logPath); strings.Contains(string(b), readyLine) {
		t.Fatalf("the gateway logged %s while Talos was unreachable", readyLine)
	}
	s.startNATS()
	var c connected
	select {
	case c = <-done:
	case <-ctx.Done():
		t.Fatal("the handshake never completed after NATS came back")
	}
	if c.err != nil {
		t.Fatal(c.err)
	}
	defer c.cs.Close()
	waitLog(t, logPath, readyLine)
	gw := &gatewaySession{cs: c.cs, log: logPath}
	if got := text(gw.call(ctx, "echo", map[string]any{"message": "first"}).mustAllow(t, "the first call")); got != "Echo: first" {
		t.Fatalf("echo: %q", got)
	}
}

// readyLine is the gateway's log line once it answers requests.
const readyLine = `msg="talos-mcp-gateway ready"`

// waitLog waits up to 60 s for the log file at path to hold want.
func waitLog(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log never held %q:\n%s", want, tail(string(b), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
