package ingest

import (
	"os"
	"runtime/debug"
)

// GC memory limits by what a process does (TuneGC).
const (
	gcLimitEnforce  = 100 << 20 // only enforces: a live heap of a few tens of MiB
	gcLimitDefault  = 256 << 20 // sinks, serves control, forwards
	gcLimitEmbedded = 1 << 30   // embeds nats-server: its stores' block caches
)

// TuneGC trades memory a Talos daemon does not need for CPU it does: unless
// GOGC or GOMEMLIMIT are set, the collector runs at 400% with a soft memory
// limit, so the heap stays bounded: 100 MiB for a process that only
// enforces (its live heap is a few tens of MiB: the replay and capability
// caches are bounded; its RSS then stays within the 128 MiB goal of
// DESIGN.md §5), 1 GiB for one that embeds nats-server (JetStream keeps
// each stream's newest message block in memory, 4 or 8 MiB apiece: about
// 250 MiB live under load, which a lower limit would collect over and over),
// 256 MiB otherwise.
func TuneGC(enforceOnly, embedsNATS bool) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		limit := int64(gcLimitDefault)
		switch {
		case embedsNATS:
			limit = gcLimitEmbedded
		case enforceOnly:
			limit = gcLimitEnforce
		}
		debug.SetMemoryLimit(limit)
	}
}
