package mcpup

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill cmd's process (SIGKILL) when the
// process that started it dies, even by SIGKILL, so that a stdio server
// never outlives the program that owns its session. The signal follows
// the OS thread that forks; the Go runtime ends a thread only when a
// goroutine locked to it exits, which this package never does.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
