package ingest

import (
	"os"
	"runtime/debug"
)

// TuneGC trades memory a Talos daemon does not need for CPU it does: unless
// GOGC or GOMEMLIMIT are set, the collector runs at 400% with a soft memory
// limit, so the heap stays bounded: 100 MiB for a process that only
// enforces (its live heap is a few tens of MiB: the replay and capability
// caches are bounded; its RSS then stays within the 128 MiB goal of
// DESIGN.md §5), 256 MiB (the budget) when it also embeds NATS, sinks or
// serves control.
func TuneGC(enforceOnly bool) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		limit := int64(256 << 20)
		if enforceOnly {
			limit = 100 << 20
		}
		debug.SetMemoryLimit(limit)
	}
}
