//go:build unix && !linux

package testenv

import "syscall"

func setPdeathsig(*syscall.SysProcAttr) {}
