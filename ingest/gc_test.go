package ingest

import (
	"errors"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"syscall"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestTuneGCLimits pins the soft memory limit TuneGC picks for each kind
// of process, and that GOMEMLIMIT, when set, wins.
func TestTuneGCLimits(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer heapFloor.Store(0) // first: the floor's goroutine then leaves GOGC alone
	t.Setenv("GOGC", "")
	for _, c := range []struct {
		name                    string
		enforceOnly, embedsNATS bool
		want                    int64
	}{
		{"enforce only", true, false, 100 << 20},
		{"sink and control", false, false, 256 << 20},
		{"embeds nats-server", false, true, embeddedLimit(memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem))},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", "")
			if set := TuneGC(c.enforceOnly, c.embedsNATS); set != c.want {
				t.Errorf("TuneGC says it set %d MiB, want %d MiB", set>>20, c.want>>20)
			}
			if got := debug.SetMemoryLimit(-1); got != c.want {
				t.Errorf("memory limit %d MiB, want %d MiB", got>>20, c.want>>20)
			}
			if got := debug.SetGCPercent(400); got != 400 {
				t.Errorf("GOGC %d, want 400", got)
			}
		})
	}
	t.Run("GOMEMLIMIT set", func(t *testing.T) {
		debug.SetMemoryLimit(123 << 20)
		t.Setenv("GOMEMLIMIT", "123MiB")
		if set := TuneGC(false, true); set != 0 {
			t.Errorf("TuneGC says it set %d MiB with GOMEMLIMIT set", set>>20)
		}
		if got := debug.SetMemoryLimit(-1); got != 123<<20 {
			t.Errorf("memory limit %d MiB, want GOMEMLIMIT's 123 MiB", got>>20)
		}
	})
}

// TestEmbeddedLimit pins the soft limit of a process that embeds
// nats-server: half the memory available to it, at least 1 GiB, and 1 GiB
// when the memory available cannot be read.
func TestEmbeddedLimit(t *testing.T) {
	for _, c := range []struct {
		name      string
		available memlimit.Provider
		want      int64
	}{
		{"24 GiB machine", memlimit.Limit(24 << 30), 12 << 30},
		{"3 GiB container", memlimit.Limit(3 << 30), 3 << 29},
		{"1.5 GiB container", memlimit.Limit(3 << 29), 1 << 30},
		{"no limit known", func() (uint64, error) { return 0, memlimit.ErrNoLimit }, 1 << 30},
		{"unreadable", func() (uint64, error) { return 0, errors.New("no cgroup") }, 1 << 30},
	} {
		if got := embeddedLimit(c.available); got != c.want {
			t.Errorf("%s: %d MiB, want %d MiB", c.name, got>>20, c.want>>20)
		}
	}
}

// TestFloorPercent: a small live heap collects at the floor, a large one
// at 400%, and a tiny one at no more than gcPercentMax.
func TestFloorPercent(t *testing.T) {
	const floor = 1 << 30
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, gcPercent},          // no collection yet
		{floor / 8, 700},        // goal at the floor: 8 × live
		{floor / 10, 900},       // 10 × live
		{floor / 5, gcPercent},  // 400% reaches the floor
		{floor, gcPercent},      // past it
		{1 << 20, gcPercentMax}, // 1 MiB live: the floor would ask 102,300%
		{floor / 100, 9900},     // 100 × live
	} {
		if got := floorPercent(c.live, floor); got != c.want {
			t.Errorf("floorPercent(%d MiB, 1 GiB) = %d, want %d", c.live>>20, got, c.want)
		}
		if c.live > 0 && c.want != gcPercentMax {
			if goal := c.live * uint64(100+floorPercent(c.live, floor)) / 100; goal < floor-c.live/100 {
				t.Errorf("live %d MiB: heap goal %d MiB, below the floor", c.live>>20, goal>>20)
			}
		}
	}
}

// TestTuneGCHoldsAFloor: a process that embeds nats-server, with a live
// heap far below the floor, gets a GOGC above 400 within seconds.
func TestTuneGCHoldsAFloor(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer heapFloor.Store(0) // first: the floor's goroutine then leaves GOGC alone
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	TuneGC(false, true)
	runtime.GC() // a live heap to go by: this test binary's few MiB
	deadline := time.Now().Add(10 * time.Second)
	gogc := []metrics.Sample{{Name: "/gc/gogc:percent"}} // read without setting it
	for {
		metrics.Read(gogc)
		if p := gogc[0].Value.Uint64(); p > gcPercent {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GOGC still %d after 10 s; want the floor's, above %d", gogc[0].Value.Uint64(), gcPercent)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTuneGCNoFloorWithGOGC: a GOGC set by the operator is theirs: no floor.
func TestTuneGCNoFloorWithGOGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer heapFloor.Store(0)
	heapFloor.Store(0)
	t.Setenv("GOGC", "200")
	t.Setenv("GOMEMLIMIT", "")
	TuneGC(false, true)
	if f := heapFloor.Load(); f != 0 {
		t.Errorf("heap floor %d MiB with GOGC set, want none", f>>20)
	}
}

// TestPretouchHeap: with a heap floor, the pages PretouchHeap touched stay
// resident (the scavenger, given time, does not hand them back), and
// garbage allocated afterwards, up to the floor, reuses them instead of
// faulting fresh ones in (without the touching: a fault a page). Without
// a floor it does nothing.
func TestPretouchHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer heapFloor.Store(0)
	heapFloor.Store(0)
	if n := PretouchHeap(); n != 0 {
		t.Fatalf("touched %d bytes without a floor", n)
	}
	const floor = 256 << 20
	heapFloor.Store(floor)
	n := PretouchHeap()
	if n < floor/4 { // less than the floor: GOGC's cap over this binary's small live heap
		t.Fatalf("touched %d MiB for a floor of %d MiB", n>>20, floor>>20)
	}
	time.Sleep(2 * time.Second) // the background scavenger's turn
	// Garbage up to the floor's goal, in blocks too large for the stack:
	// the pages it takes are resident already.
	page := os.Getpagesize()
	before := minorFaults(t)
	for got := uint64(0); got < n*3/4; got += 1 << 20 {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
	}
	pages := n * 3 / 4 / uint64(page)
	faults := minorFaults(t) - before
	t.Logf("touched %d MiB; 2 s later, %d page faults allocating %d pages", n>>20, faults, pages)
	if faults > pages/10 {
		t.Errorf("%d page faults allocating %d pages after the heap was touched, want at most a tenth", faults, pages)
	}
}

// minorFaults is this process's minor page faults so far.
func minorFaults(t *testing.T) uint64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return uint64(ru.Minflt)
}
