package testenv

import "syscall"

// setPdeathsig asks the kernel to SIGKILL the child if the thread that
// started it dies (in practice: if the test binary dies).
func setPdeathsig(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
