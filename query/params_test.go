package query

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestTimeRange(t *testing.T) {
	now := time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)
	day := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name, from, to string
		since          time.Duration
		start, end     time.Time
		err            string
	}{
		{name: "unbounded"},
		{name: "date and RFC 3339 in another zone", from: "2026-06-01", to: "2026-06-01T14:00:00+02:00",
			start: day, end: day.Add(12 * time.Hour)},
		{name: "since", since: 24 * time.Hour, start: day},
		{name: "from and since", from: "2026-06-01", since: time.Hour, err: "give --from or --since, not both"},
		{name: "negative since", since: -time.Hour, err: "--since must be positive"},
		{name: "bad from", from: "June", err: `--from: "June" is neither RFC 3339 (2026-06-01T12:00:00Z) nor a date (2026-06-01)`},
		{name: "bad to", to: "1/6/2026", err: `--to: "1/6/2026" is neither RFC 3339 (2026-06-01T12:00:00Z) nor a date (2026-06-01)`},
		{name: "empty", from: "2026-06-01", to: "2026-06-01", err: "the time range is empty (--from is not before --to)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start, end, err := TimeRange(c.from, c.to, c.since, now)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || !start.Equal(c.start) || !end.Equal(c.end) {
				t.Fatalf("= %v, %v, %v; want %v, %v", start, end, err, c.start, c.end)
			}
			if !start.IsZero() && start.Location() != time.UTC {
				t.Errorf("start %v is not in UTC", start)
			}
		})
	}
}

func TestUnhonoured(t *testing.T) {
	q := Canned{Name: "q", Filters: []string{FilterFrom, FilterAgent}}
	p := Params{From: time.Unix(1, 0), To: time.Unix(2, 0), Agent: "a", Tool: "t"}
	if got := q.Unhonoured(p); !slices.Equal(got, []string{FilterTo, FilterTool}) {
		t.Errorf("Unhonoured = %v", got)
	}
	if got := q.Unhonoured(Params{Agent: "a"}); got != nil {
		t.Errorf("Unhonoured of honoured filters = %v", got)
	}
}

// ReadFlags: the format by default and with --json, each error in its
// order, and the parameters of good flags.
func TestReadFlags(t *testing.T) {
	q := Canned{Name: "q", Filters: []string{FilterFrom, FilterTo, FilterAgent}}
	now := time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		f      CannedFlags
		format string
		err    string
	}{
		{name: "default", f: CannedFlags{Limit: 10}, format: FormatTable},
		{name: "json", f: CannedFlags{JSON: true, Limit: 10}, format: FormatJSON},
		{name: "csv", f: CannedFlags{Format: FormatCSV, Limit: 10}, format: FormatCSV},
		{name: "bad format first", f: CannedFlags{Format: "xml", Limit: 0}, err: `--format "xml": want table, csv or json`},
		{name: "json contradicts", f: CannedFlags{Format: FormatCSV, JSON: true, Limit: 10}, err: "--json contradicts --format csv"},
		{name: "limit before range", f: CannedFlags{Limit: MaxLimit + 1, From: "x"}, err: fmt.Sprintf("--limit must be 1 to %d", MaxLimit)},
		{name: "range", f: CannedFlags{Limit: 10, From: "x"}, err: `--from: "x" is neither RFC 3339 (2026-06-01T12:00:00Z) nor a date (2026-06-01)`},
		{name: "filter", f: CannedFlags{Limit: 10, Server: "files", Tool: "t"}, err: "takes no --server (its filters: from, to, agent)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			format, _, err := q.ReadFlags(c.f, now)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || format != c.format {
				t.Fatalf("= %q, %v; want %q", format, err, c.format)
			}
		})
	}
	_, p, err := q.ReadFlags(CannedFlags{Since: time.Hour, Agent: "a", Limit: 5}, now)
	if err != nil || !p.From.Equal(now.Add(-time.Hour)) || !p.To.IsZero() || p.Agent != "a" || p.Limit != 5 {
		t.Fatalf("params %+v, %v", p, err)
	}
}

// TestParseDuration: Go's durations, and days first as the dashboard's
// since=7d takes them.
func TestParseDuration(t *testing.T) {
	day := 24 * time.Hour
	for _, c := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: "90m", want: 90 * time.Minute},
		{in: "24h", want: day},
		{in: "7d", want: 7 * day},
		{in: "30d", want: 30 * day},
		{in: "1d12h", want: day + 12*time.Hour},
		{in: "1.5d", want: day + 12*time.Hour},
		{in: "2d30m15s", want: 2*day + 30*time.Minute + 15*time.Second},
		{in: "-1d1h", want: -day - time.Hour},
		{in: "0d", want: 0},
		{in: "", err: true},
		{in: "d", err: true},
		{in: "7", err: true},
		{in: "7days", err: true},
		{in: "1d-1h", err: true},
		{in: "1e3d", err: true},
		{in: "Infd", err: true},
		{in: "1h7d", err: true},
	} {
		got, err := ParseDuration(c.in)
		switch {
		case c.err && err == nil:
			t.Errorf("ParseDuration(%q) = %v, want an error", c.in, got)
		case !c.err && (err != nil || got != c.want):
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}
