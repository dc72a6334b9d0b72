//go:build unix

package chserver

import "syscall"

// signal sends sig to the server's process group.
func (c *Server) signal(sig syscall.Signal) {
	if c.cmd.Process == nil {
		return
	}
	if err := syscall.Kill(-c.cmd.Process.Pid, sig); err != nil {
		c.cmd.Process.Signal(sig)
	}
}
