package ingest

import (
	"runtime/debug"
	"testing"
)

// TestTuneGCLimits pins the soft memory limit TuneGC picks for each kind
// of process, and that GOMEMLIMIT, when set, wins.
func TestTuneGCLimits(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOGC", "")
	for _, c := range []struct {
		name                    string
		enforceOnly, embedsNATS bool
		want                    int64
	}{
		{"enforce only", true, false, 100 << 20},
		{"sink and control", false, false, 256 << 20},
		{"embeds nats-server", false, true, 1 << 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", "")
			TuneGC(c.enforceOnly, c.embedsNATS)
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
		TuneGC(false, true)
		if got := debug.SetMemoryLimit(-1); got != 123<<20 {
			t.Errorf("memory limit %d MiB, want GOMEMLIMIT's 123 MiB", got>>20)
		}
	})
}
