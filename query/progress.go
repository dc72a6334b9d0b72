package query

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// ProgressBar draws "verifying [#####.....] 45%  450,000/1,000,000
// receipts  38,211/s  ETA 14s" on one terminal line, redrawn in place: the
// progress callback of VerifyOptions (and of synth.Write). A nil
// *ProgressBar does nothing: a caller that shows no progress passes a nil
// bar's Update.
type ProgressBar struct {
	w          io.Writer
	verb, unit string
	start      time.Time
	drawn      bool
}

// NewProgressBar returns a bar that writes to w, starting its rate clock
// now; verb and unit name what it counts ("verifying", "receipts").
func NewProgressBar(w io.Writer, verb, unit string) *ProgressBar {
	return &ProgressBar{w: w, verb: verb, unit: unit, start: time.Now()}
}

// Update redraws the bar for done of total.
func (b *ProgressBar) Update(done, total int) {
	if b == nil {
		return
	}
	const width = 30
	total = max(total, done, 1)
	filled := done * width / total
	rate := float64(done) / max(time.Since(b.start).Seconds(), 1e-3)
	eta := ""
	if done < total && rate > 0 {
		eta = "  ETA " + (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String()
	}
	fmt.Fprintf(b.w, "\r%s [%s%s] %3d%%  %s/%s %s  %s/s%s   ", b.verb, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		done*100/total, thousands(done), thousands(total), b.unit, thousands(int(rate)), eta)
	b.drawn = true
}

// Done ends the bar's line, if it drew one.
func (b *ProgressBar) Done() {
	if b != nil && b.drawn {
		fmt.Fprintln(b.w)
	}
}

// thousands formats n with comma separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
