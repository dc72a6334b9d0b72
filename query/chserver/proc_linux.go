package chserver

import "syscall"

// sysProcAttr puts the server in its own process group (so Stop can signal
// everything it forks) and asks the kernel to SIGKILL it if the thread that
// started it dies. Go keeps its OS threads for the life of the process unless
// a goroutine exits while locked to one, so in practice this means "if this
// process dies".
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
