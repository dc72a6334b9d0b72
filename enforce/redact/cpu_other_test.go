//go:build !unix

package redact

// processCPU is unavailable here; benchmarks then report no CPU figure.
func processCPU() int64 { return 0 }
