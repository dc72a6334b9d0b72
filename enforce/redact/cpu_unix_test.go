//go:build unix

package redact

import "syscall"

// processCPU returns the CPU time this process has used, in nanoseconds:
// benchmarks report it next to wall time because the machine they run on
// is often shared.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
