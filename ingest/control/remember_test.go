package control

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// TestControlServiceForgetsStaleCommands pins what remember keeps: every
// command until it is older than the skew and a minute, and the old ones
// forgotten at most every forgetEvery, not on each command.
func TestControlServiceForgetsStaleCommands(t *testing.T) {
	now := time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC)
	s := &ControlService{o: ControlOptions{Skew: 2 * time.Minute, Now: func() time.Time { return now }},
		appended: map[string]appendedCommand{}}
	remember := func(id string, issued time.Time) {
		s.remember(id, appendedCommand{receiptID: "r-" + id, issuedAt: issued})
	}
	kept := func() []string { return slices.Sorted(maps.Keys(s.appended)) }

	remember("old", now.Add(-4*time.Minute)) // past the horizon already: forgotten on this first pass
	remember("a", now)
	for i := range 1000 { // a burst at one instant: all kept
		remember(fmt.Sprint("burst-", i), now)
	}
	if got := len(s.appended); got != 1001 {
		t.Fatalf("after a burst: %d commands remembered, want 1001 (old forgotten)", got)
	}
	if _, ok := s.appended["old"]; ok {
		t.Fatal("a command issued before the horizon was kept")
	}

	// Past the horizon, but within forgetEvery of the last pass: nothing
	// is forgotten yet.
	now = now.Add(3*time.Minute + time.Second)
	s.forgetAt = now.Add(time.Second)
	remember("b", now)
	if got := len(s.appended); got != 1002 {
		t.Fatalf("before the next pass: %d remembered, want 1002", got)
	}
	// The next pass forgets everything issued before now - skew - 1 min.
	now = now.Add(time.Second)
	remember("c", now)
	if got, want := kept(), []string{"b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("after the pass: remembered %v, want %v", got, want)
	}
	if want := now.Add(forgetEvery); !s.forgetAt.Equal(want) {
		t.Fatalf("next pass at %s, want %s", s.forgetAt, want)
	}
}
