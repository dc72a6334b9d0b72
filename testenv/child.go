//go:build unix

package testenv

import (
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// child is a server process a test owns (rsyslogd, the OpenTelemetry
// Collector): started in a process group of its own with its output
// appended to a log file, reaped in the background, stopped by a signal
// to its group.
type child struct {
	name string // for messages: "rsyslogd"
	log  string // its output, appended across restarts

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited and been reaped
}

// start runs bin with args and waits until every one of addrs accepts a
// TCP connection, within timeout; the test fails, with the end of the
// child's output, when it exits first or does not listen in time.
func (c *child) start(t testing.TB, timeout time.Duration, addrs []string, bin string, args ...string) {
	t.Helper()
	logf, err := os.OpenFile(c.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.name, err)
	}
	c.cmd, c.done = cmd, make(chan struct{})
	done := c.done
	go func() { // the reaper, owned by c: signal waits for done
		_ = cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(timeout)
	for _, addr := range addrs {
		for {
			select {
			case <-done:
				t.Fatalf("%s exited at start:\n%s", c.name, c.tail())
			default:
			}
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not listen on %s after %v:\n%s", c.name, addr, timeout, c.tail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// signal sends sig to the child's group and waits for it to exit; after
// grace (if not 0) it is killed. Nothing happens when it is not running.
func (c *child) signal(sig syscall.Signal, grace time.Duration) {
	if c.cmd == nil {
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, sig)
	if grace > 0 {
		select {
		case <-c.done:
			return
		case <-time.After(grace):
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	<-c.done
}

// tail is the end of the child's output, for failure messages.
func (c *child) tail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
