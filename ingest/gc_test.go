package ingest

import (
	"errors"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestTuneGCLimits pins the soft memory limit and GOGC TuneGC picks for
// each kind of process, and that GOMEMLIMIT and GOGC, when set, win.
func TestTuneGCLimits(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOGC", "")
	for _, c := range []struct {
		name                    string
		enforceOnly, embedsNATS bool
		want                    int64
		gogc                    int
	}{
		{"enforce only", true, false, 100 << 20, 400},
		{"sink and control", false, false, 256 << 20, 400},
		{"embeds nats-server", false, true, embeddedLimit(memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem)), 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", "")
			debug.SetGCPercent(100) // Go's default, as at a process's start
			if set := TuneGC(c.enforceOnly, c.embedsNATS); set != c.want {
				t.Errorf("TuneGC says it set %d MiB, want %d MiB", set>>20, c.want>>20)
			}
			if got := debug.SetMemoryLimit(-1); got != c.want {
				t.Errorf("memory limit %d MiB, want %d MiB", got>>20, c.want>>20)
			}
			if got := debug.SetGCPercent(100); got != c.gogc {
				t.Errorf("GOGC %d, want %d", got, c.gogc)
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
	t.Run("GOGC set", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		t.Setenv("GOGC", "200")
		debug.SetGCPercent(200) // what the runtime read from GOGC at start
		TuneGC(true, false)
		if got := debug.SetGCPercent(100); got != 200 {
			t.Errorf("GOGC %d with GOGC=200 set, want 200", got)
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
