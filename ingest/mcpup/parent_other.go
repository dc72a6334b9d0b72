//go:build !linux

package mcpup

import "os/exec"

// dieWithParent does nothing where the kernel cannot signal a child when
// its parent dies: closing the session still ends the process.
func dieWithParent(*exec.Cmd) {}
