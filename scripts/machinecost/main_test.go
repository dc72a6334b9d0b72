package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// Each cost is measured (positive, finite) and printed under its name, and
// the JSON form carries the same figures.
func TestMeasure(t *testing.T) {
	c, err := measure(sizes{rounds: 3, syscalls: 1000, pages: 256, wakes: 200})
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]float64{"system call": c.Syscall, "page fault": c.Fault, "thread wake-up": c.Wake} {
		if !(v > 0 && v < 1e6) {
			t.Errorf("%s: %v µs, want a positive figure", name, v)
		}
		if !strings.Contains(c.String(), name+" ") {
			t.Errorf("%q does not name %s", c.String(), name)
		}
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back costs
	if err := json.Unmarshal(b, &back); err != nil || back != c {
		t.Errorf("JSON %s reads back as %+v (%v), want %+v", b, back, err, c)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
