//go:build unix

package testenv

import (
	"context"
	"os/exec"
	"syscall"
)

// Command is exec.Command for a process a test starts: on Linux the kernel
// kills it (SIGKILL) when the test binary dies first, as when go test's
// -timeout ends it, so that no talosd, gateway or browser outlives its
// test holding ports and data directories.
func Command(name string, arg ...string) *exec.Cmd {
	return owned(exec.Command(name, arg...))
}

// CommandContext is exec.CommandContext with Command's guarantee.
func CommandContext(ctx context.Context, name string, arg ...string) *exec.Cmd {
	return owned(exec.CommandContext(ctx, name, arg...))
}

func owned(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setPdeathsig(cmd.SysProcAttr)
	return cmd
}
