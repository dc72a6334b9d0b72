package ingest

import (
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// GC settings by what a process does (TuneGC).
const (
	gcPercent      = 400       // GOGC unless set, for a process that embeds no nats-server
	gcLimitEnforce = 100 << 20 // only enforces: a live heap of a few tens of MiB
	gcLimitDefault = 256 << 20 // sinks, serves control or forwards
	// gcLimitEmbeddedMin is the least a process that embeds nats-server
	// gets; it gets half the memory available to it when that is more.
	gcLimitEmbeddedMin = 1 << 30
)

// TuneGC trades memory a Talos daemon does not need for CPU it does: unless
// GOGC or GOMEMLIMIT are set, its collector runs under a soft memory limit,
// at 400% with 100 MiB for a process that only enforces (its live heap is a
// few tens of MiB: the replay and capability caches are bounded; its RSS
// then stays within the 128 MiB goal of DESIGN.md §5) and with 256 MiB for
// one that sinks, serves control or forwards.
//
// A process that embeds nats-server keeps Go's default GOGC (100) and gets
// half the memory available to it (its cgroup's limit, else the machine's),
// at least 1 GiB. Its live heap is not bounded by Talos: JetStream keeps
// each stream's newest message block in memory and an index entry for every
// subject, and TALOS_LEDGER has a subject per call for --replay-window. A
// limit close to the live heap would collect over and over: a fixed 1 GiB
// cost a third of the throughput after 560,000 calls (bash scripts/bench.sh
// sustained). At 400% that process's heap grew to five times a live heap
// of hundreds of MiB, and every page it grew into is a page fault: on a
// machine that charges 12 µs a fault, that cost more than the collections
// it saved (BENCHMARKS.md, "The NATS process collects at Go's default").
//
// It returns the limit it set, 0 when GOMEMLIMIT was set.
func TuneGC(enforceOnly, embedsNATS bool) int64 {
	if os.Getenv("GOGC") == "" && !embedsNATS {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := int64(gcLimitDefault)
	switch {
	case embedsNATS:
		limit = embeddedLimit(memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem))
	case enforceOnly:
		limit = gcLimitEnforce
	}
	debug.SetMemoryLimit(limit)
	return limit
}

// embeddedLimit is half of the memory available reports, at least
// gcLimitEmbeddedMin (also when it reports none).
func embeddedLimit(available memlimit.Provider) int64 {
	n, err := available()
	if err != nil || n/2 < gcLimitEmbeddedMin {
		return gcLimitEmbeddedMin
	}
	return int64(n / 2) // at most 2^63 - 1
}
