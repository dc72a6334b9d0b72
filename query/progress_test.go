package query

import (
	"bytes"
	"strings"
	"testing"
)

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45000: "-45,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// The bar redraws one line in place and ends it only if it drew; a nil
// bar does nothing.
func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	b := NewProgressBar(&buf, "verifying", "receipts")
	b.Done()
	if buf.Len() != 0 {
		t.Fatalf("Done before Update wrote %q", buf.String())
	}
	b.Update(450_000, 1_000_000)
	line := buf.String()
	if !strings.HasPrefix(line, "\rverifying [#############.................]  45%  450,000/1,000,000 receipts  ") ||
		!strings.Contains(line, "ETA ") || strings.Contains(line, "\n") {
		t.Fatalf("line %q", line)
	}
	b.Update(1_000_000, 1_000_000)
	b.Done()
	if out := buf.String(); strings.Count(out, "\r") != 2 || !strings.HasSuffix(out, "\n") || !strings.Contains(out, "100%") ||
		strings.Count(out, "ETA") != 1 {
		t.Fatalf("output %q", out)
	}
	var nilBar *ProgressBar
	nilBar.Update(1, 2)
	nilBar.Done()
}
