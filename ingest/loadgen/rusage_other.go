//go:build !unix

package loadgen

import "time"

// processCPU is not measured on this OS.
func processCPU() (user, system time.Duration, maxRSSBytes int64, ok bool) { return 0, 0, 0, false }
