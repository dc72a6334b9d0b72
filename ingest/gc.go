package ingest

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// GC settings by what a process does (TuneGC).
const (
	gcPercent      = 400       // GOGC unless set
	gcLimitEnforce = 100 << 20 // only enforces: a live heap of a few tens of MiB
	gcLimitDefault = 256 << 20 // sinks, serves control, forwards
	// gcLimitEmbeddedMin is the least a process that embeds nats-server
	// gets; it gets half the memory available to it when that is more.
	gcLimitEmbeddedMin = 1 << 30
	// gcFloorMax bounds the heap floor of a process that embeds
	// nats-server (half its limit, at most this much).
	gcFloorMax = 1 << 30
	// gcPercentMax bounds the GOGC a heap floor asks for.
	gcPercentMax = 10000
)

// TuneGC trades memory a Talos daemon does not need for CPU it does: unless
// GOGC or GOMEMLIMIT are set, the collector runs at 400% with a soft memory
// limit, so the heap stays bounded: 100 MiB for a process that only
// enforces (its live heap is a few tens of MiB: the replay and capability
// caches are bounded; its RSS then stays within the 128 MiB goal of
// DESIGN.md §5), 256 MiB for one that sinks, serves control or forwards,
// and half the memory available to it (its cgroup's limit, else the
// machine's), at least 1 GiB, for one that embeds nats-server. That one's
// live heap is not bounded by Talos: JetStream keeps each stream's newest
// message block in memory and an index entry for every subject, and
// TALOS_LEDGER has a subject per call for --replay-window. A limit close
// to the live heap would collect over and over: a fixed 1 GiB cost a third
// of the throughput after 560,000 calls (bash scripts/bench.sh sustained).
//
// That process also keeps a heap floor (holdFloor): while its live heap is
// small, it collects only once its heap reaches half its limit, at most
// 1 GiB. Each collection slows the calls it overlaps (a mark takes a
// quarter of its cores for tens of milliseconds), and at 400% a
// young server's small heap collects every few seconds; once the live heap
// is a fifth of the floor or more, 400% collects later than the floor
// would, and the floor changes nothing.
//
// It returns the limit it set, 0 when GOMEMLIMIT was set.
func TuneGC(enforceOnly, embedsNATS bool) int64 {
	ownGOGC := os.Getenv("GOGC") == ""
	if ownGOGC {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := int64(gcLimitDefault)
	switch {
	case embedsNATS:
		limit = embeddedLimit(memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem))
		if ownGOGC {
			heapFloor.Store(uint64(min(limit/2, gcFloorMax)))
			holdingFloor.Do(func() { go holdFloor() })
		}
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

// The heap floor holdFloor keeps, in bytes (0: none), and the one start
// of its goroutine.
var (
	heapFloor    atomic.Uint64
	holdingFloor sync.Once
)

// holdFloor sets GOGC, once a second for the life of the process, so that
// the next collection's heap goal is at least heapFloor (floorPercent of
// the live heap the last collection found).
func holdFloor() {
	m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/gogc:percent"}}
	for range time.Tick(time.Second) {
		floor := heapFloor.Load()
		if floor == 0 {
			continue
		}
		metrics.Read(m)
		if m[0].Value.Kind() != metrics.KindUint64 || m[1].Value.Kind() != metrics.KindUint64 {
			return
		}
		// Only a change of a tenth or more: each call recomputes the
		// collector's goal.
		p, cur := floorPercent(m[0].Value.Uint64(), floor), int(m[1].Value.Uint64())
		if p*10 < cur*9 || p*10 > cur*11 {
			debug.SetGCPercent(p)
		}
	}
}

// floorPercent is the GOGC that puts the heap goal of a live heap of live
// bytes at floor, or gcPercent when that puts it higher (or live is not
// known yet), at most gcPercentMax.
func floorPercent(live, floor uint64) int {
	if live == 0 || live*(100+gcPercent)/100 >= floor {
		return gcPercent
	}
	return int(min(floor*100/live-100, gcPercentMax))
}
