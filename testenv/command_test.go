//go:build linux

package testenv_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talos-audit/talos/testenv"
)

// TestCommandDiesWithTestBinary: a process started with testenv.Command
// does not outlive a test binary that is killed (as go test's -timeout
// kills it). This test runs itself again as that binary, which starts a
// long sleep, prints its pid and waits; then it kills that binary with
// SIGKILL and expects the sleep to be gone.
func TestCommandDiesWithTestBinary(t *testing.T) {
	if os.Getenv("TALOS_TEST_COMMAND_CHILD") == "1" {
		cmd := testenv.Command("sleep", "300")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("pid " + strconv.Itoa(cmd.Process.Pid) + "\n")
		time.Sleep(5 * time.Minute)
		return
	}
	bin := exec.Command(os.Args[0], "-test.run=^TestCommandDiesWithTestBinary$", "-test.v")
	bin.Env = append(os.Environ(), "TALOS_TEST_COMMAND_CHILD=1")
	out, err := bin.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := bin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bin.Process.Kill(); _ = bin.Wait() })
	sleep := 0
	for sc := bufio.NewScanner(out); sleep == 0 && sc.Scan(); {
		if p, ok := strings.CutPrefix(sc.Text(), "pid "); ok {
			sleep, _ = strconv.Atoi(p)
		}
	}
	if sleep == 0 {
		t.Fatal("the test binary printed no pid of its child")
	}
	if err := syscall.Kill(sleep, 0); err != nil {
		t.Fatalf("the child %d is not running before its test binary is killed: %v", sleep, err)
	}
	if err := bin.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = bin.Wait()
	// The child is not ours to reap: once killed, init reaps it.
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return errors.Is(syscall.Kill(sleep, 0), syscall.ESRCH) || zombie(sleep)
	})
}

// zombie reports whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}
