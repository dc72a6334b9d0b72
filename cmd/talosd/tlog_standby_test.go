package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	tlogpkg "github.com/talos-audit/talos/ingest/tlog"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestLogStandbyTakesOver (issue 22, must-show 4): two log roles share the
// log (one data directory, one NATS); one appends while it holds the
// appender lease, the other stands by. The appender is SIGKILLed
// mid-traffic, the standby takes over; the killed one comes back as the
// standby; the one that took over is SIGKILLed in turn. The log then holds
// every record of TALOS_AUDIT's logged subjects exactly once, in stream
// order, and its checkpoint verifies with the log key.
func TestLogStandbyTakesOver(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	ns := testenv.NATSForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, js := connectStreams(t, ctx, ns.URL())
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	var procs []*exec.Cmd
	start := func(name string) *exec.Cmd {
		logf, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer logf.Close()
		cmd := testenv.Command(bin, "--roles", "log", "--data-dir", data, "--nats-url", ns.URL(), "--http-addr", "", "--instance", name,
			"--log-origin", "audit.example.com/talos", "--log-lease-ttl", "1s", "--log-checkpoint-interval", "200ms")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		procs = append(procs, cmd)
		return cmd
	}
	holds := func(name string) func() string {
		return func() string {
			b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			if !bytes.Contains(b, []byte("holds the appender lease")) {
				return name + " does not hold the appender lease"
			}
			return ""
		}
	}
	kill := func(c *exec.Cmd) { _ = c.Process.Signal(syscall.SIGKILL); _ = c.Wait() }

	a := start("log-a")
	waitFor(t, 30*time.Second, holds("log-a"))
	b := start("log-b")

	const n = 3000
	var sent atomic.Int64
	records := make([][]byte, n)
	done := make(chan error, 1)
	go func() { // about 300 records a second: the kills fall inside the run
		for i := range n {
			records[i] = []byte(fmt.Sprintf(`{"id":"0190a3c2-0000-7000-8000-%012d","type":"dev.talos.receipt.decision.v1","data":{"n":%d}}`, i, i))
			if _, err := js.Publish(ctx, schemas.ReceiptSubject(schemas.KindDecision, "files"), records[i]); err != nil {
				done <- err
				return
			}
			sent.Add(1)
			time.Sleep(3 * time.Millisecond)
		}
		done <- nil
	}()
	testenv.WaitFor(t, time.Minute, func() bool { return sent.Load() > n/3 })
	kill(a)
	waitFor(t, 30*time.Second, holds("log-b"))
	start("log-a") // back, as the standby
	testenv.WaitFor(t, time.Minute, func() bool { return sent.Load() > 2*n/3 })
	kill(b)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Once the log holds n entries, stop everything and read it.
	dirLog := tlogpkg.Dir(data)
	waitFor(t, time.Minute, func() string {
		size, err := tlogpkg.PublishedSize(dirLog)
		if err != nil || size < n {
			return fmt.Sprintf("the published log has %d of %d entries (%v)", size, n, err)
		}
		return ""
	})
	key, err := tlogpkg.LoadOrCreateKey(filepath.Join(data, "keys", "log.key"), "", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range procs { // the last appender holds the directory's lock
		kill(c)
	}
	l, err := tlogpkg.Open(tlogpkg.Options{Dir: dirLog, Key: key})
	if err != nil {
		t.Fatalf("the log does not open (its checkpoint must verify with the log key): %v", err)
	}
	defer l.Close(5 * time.Second)
	size, err := l.Size(context.Background())
	if err != nil || size != n {
		t.Fatalf("the log has %d entries (%v), want exactly the %d records", size, err, n)
	}
	i := 0
	err = l.LeafHashes(context.Background(), 0, size, func(index uint64, h [32]byte) {
		if want := tlog.RecordHash(records[index]); tlog.Hash(h) != want && i < 5 {
			t.Errorf("entry %d is not record %d", index, index)
			i++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
