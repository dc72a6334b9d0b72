//go:build unix

package loadgen

import (
	"runtime"
	"syscall"
	"time"
)

// processCPU is this process's CPU time so far (all threads, user and
// system) and its peak resident set size; ok is false where the OS does
// not say.
func processCPU() (user, system time.Duration, maxRSSBytes int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, 0, false
	}
	maxRSSBytes = int64(ru.Maxrss) * 1024 // KiB on Linux and the BSDs
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		maxRSSBytes = int64(ru.Maxrss) // bytes on Darwin
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano()), maxRSSBytes, true
}
