package query

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ParseDuration is time.ParseDuration that also takes a number of days
// first, a day being 24 h, as the dashboard's since=7d does: 7d, 1d12h,
// 1.5d, 90m. talosctl reads its duration flags (--since) with it.
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("%q is not a duration (e.g. 90m, 24h, 7d, 1d12h)", s)
	days, rest, found := strings.Cut(s, "d")
	if !found {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		return d, nil
	}
	if !dayCount.MatchString(days) {
		return 0, bad
	}
	n, err := strconv.ParseFloat(days, 64)
	if err != nil {
		return 0, bad
	}
	d, more := time.Duration(n*float64(24*time.Hour)), time.Duration(0)
	if rest != "" {
		if more, err = time.ParseDuration(rest); err != nil || more < 0 || strings.HasPrefix(rest, "+") {
			return 0, bad
		}
	}
	if n < 0 {
		return d - more, nil
	}
	return d + more, nil
}

// dayCount is the number before ParseDuration's "d".
var dayCount = regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$`)

// TimeRange reads a time range as talosctl's --from, --to and --since
// give it (query and export): from and to are ParseTime's forms, since a
// start that long before now instead of from. Zero times are unbounded.
// The errors name those flags; an empty range is one.
func TimeRange(from, to string, since time.Duration, now time.Time) (start, end time.Time, err error) {
	if from != "" && since != 0 {
		return start, end, errors.New("give --from or --since, not both")
	}
	if since < 0 {
		return start, end, errors.New("--since must be positive")
	}
	if start, err = ParseTime(from); err != nil {
		return start, end, fmt.Errorf("--from: %v", err)
	}
	if end, err = ParseTime(to); err != nil {
		return start, end, fmt.Errorf("--to: %v", err)
	}
	if since > 0 {
		start = now.Add(-since)
	}
	if !start.IsZero() && !end.IsZero() && !start.Before(end) {
		return start, end, errors.New("the time range is empty (--from is not before --to)")
	}
	return start, end, nil
}

// ParseTime reads RFC 3339 (returned in UTC) or a date (its midnight
// UTC); "" is the zero time.
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 (2026-06-01T12:00:00Z) nor a date (2026-06-01)", s)
}

// Unhonoured returns the filters p sets that c does not take (see
// Canned.Filters), in the order of the Filter constants.
func (c Canned) Unhonoured(p Params) []string {
	given := []struct {
		name string
		set  bool
	}{{FilterFrom, !p.From.IsZero()}, {FilterTo, !p.To.IsZero()}, {FilterAgent, p.Agent != ""},
		{FilterServer, p.Server != ""}, {FilterTool, p.Tool != ""}}
	var out []string
	for _, f := range given {
		if f.set && !slices.Contains(c.Filters, f.name) {
			out = append(out, f.name)
		}
	}
	return out
}

// CannedFlags are a canned query's flags as talosctl query takes them.
type CannedFlags struct {
	Format              string // FormatTable, FormatCSV or FormatJSON; "" the default
	JSON                bool   // --json: FormatJSON, which another format contradicts
	From, To            string // ParseTime's forms
	Since               time.Duration
	Agent, Server, Tool string
	Limit               int
}

// ReadFlags checks f for c in this order: the output format (FormatTable
// by default), the row limit (1 to MaxLimit), the time range (TimeRange),
// then the filters, each of which c must take (Unhonoured). It returns the
// format and the parameters to run c with; the errors name the flags.
func (c Canned) ReadFlags(f CannedFlags, now time.Time) (string, Params, error) {
	format := f.Format
	switch {
	case format == "" && f.JSON:
		format = FormatJSON
	case format == "":
		format = FormatTable
	case format != FormatTable && format != FormatCSV && format != FormatJSON:
		return "", Params{}, fmt.Errorf("--format %q: want table, csv or json", format)
	case f.JSON && format != FormatJSON:
		return "", Params{}, fmt.Errorf("--json contradicts --format %s", format)
	}
	if f.Limit < 1 || f.Limit > MaxLimit {
		return "", Params{}, fmt.Errorf("--limit must be 1 to %d", MaxLimit)
	}
	from, to, err := TimeRange(f.From, f.To, f.Since, now)
	if err != nil {
		return "", Params{}, err
	}
	p := Params{From: from, To: to, Agent: f.Agent, Server: f.Server, Tool: f.Tool, Limit: f.Limit}
	if extra := c.Unhonoured(p); len(extra) > 0 {
		return "", Params{}, fmt.Errorf("takes no --%s (its filters: %s)", extra[0], strings.Join(c.Filters, ", "))
	}
	return format, p, nil
}
