//go:build unix && !linux

package chserver

import "syscall"

// sysProcAttr puts the server in its own process group so Stop can signal it
// and everything it forks. (No parent-death signal outside Linux.)
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
