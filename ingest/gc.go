package ingest

import (
	"os"
	"runtime"
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
	// gcPercentMax bounds the GOGC a heap floor asks for: a floor of
	// 1 GiB holds over a live heap of about 1 MiB and more (a fresh
	// talosd dev's is a few MiB).
	gcPercentMax = 100_000
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
	tuning       sync.Mutex // held while GOGC is read and set
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
		if !holdOnce(m, floor) {
			return
		}
	}
}

// holdOnce is one tick of holdFloor; false when the runtime does not report
// what it needs.
func holdOnce(m []metrics.Sample, floor uint64) bool {
	tuning.Lock()
	defer tuning.Unlock()
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 || m[1].Value.Kind() != metrics.KindUint64 {
		return false
	}
	// Only a change of a tenth or more: each call recomputes the
	// collector's goal.
	p, cur := floorPercent(m[0].Value.Uint64(), floor), int(m[1].Value.Uint64())
	if p*10 < cur*9 || p*10 > cur*11 {
		debug.SetGCPercent(p)
	}
	return true
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

// PretouchHeap faults in, before the process serves, the heap it will
// grow into under load, and keeps it resident. It does something only in
// a process that keeps a heap floor (TuneGC: one that embeds nats-server,
// GOGC and GOMEMLIMIT not set), and returns how many bytes it touched.
//
// Until such a process's heap first reaches its floor, every page it
// allocates is a fresh one, and the kernel charges a page fault for each:
// on a virtual machine, 13-19 µs a page (scripts/machinecost). A young
// process under load paid that on about every 4 KiB it allocated (copies
// of published messages, the sink's column buffers) until it had
// collected once at the floor; here it is paid once, at start, off the
// path of any call, like a JVM's AlwaysPreTouch.
//
// The collector is off while the blocks are touched, so no cycle sees
// them live; the cycle that frees them then runs with the floor's GOGC,
// so that its goal and the next one are both about the floor and the
// scavenger keeps the pages (it returns what exceeds the heap in use at
// the last cycle, scaled by the change of goal, plus a tenth).
func PretouchHeap() uint64 {
	floor := heapFloor.Load()
	if floor == 0 {
		return 0
	}
	// holdFloor sets GOGC too: not while the collector is off here.
	tuning.Lock()
	defer tuning.Unlock()
	runtime.GC() // the live heap now, and a goal for the cycle below
	m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 || m[0].Value.Uint64() == 0 {
		return 0
	}
	live := m[0].Value.Uint64()
	if live >= floor {
		return 0
	}
	p, n := floorPercent(live, floor), floor-live
	const block = 4 << 20
	page := os.Getpagesize()
	debug.SetGCPercent(-1)
	blocks := make([][]byte, 0, n/block+1)
	for got := uint64(0); got < n; got += block {
		b := make([]byte, block)
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		blocks = append(blocks, b)
	}
	clear(blocks)
	debug.SetGCPercent(p)
	runtime.GC()
	return uint64(len(blocks)) * block
}
