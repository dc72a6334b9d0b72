package query

import (
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
