package web

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/talos-audit/talos/query"
)

// errBadParam marks a query-string parameter the dashboard refuses (400).
var errBadParam = errors.New("bad parameter")

func badParam(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errBadParam, fmt.Sprintf(format, a...))
}

// text reads a free-text filter: trimmed, at most query.MaxFilterLen
// bytes of printable UTF-8. Values are bound as query parameters; this
// only keeps junk out of pages and logs.
func text(v url.Values, name string) (string, error) {
	s := strings.TrimSpace(v.Get(name))
	if len(s) > query.MaxFilterLen {
		return "", badParam("%s is longer than %d bytes", name, query.MaxFilterLen)
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return "", badParam("%s has control characters or is not UTF-8", name)
	}
	return s, nil
}

// oneOf reads a parameter that must be one of allowed ("" always is).
func oneOf(v url.Values, name string, allowed ...string) (string, error) {
	s := strings.TrimSpace(v.Get(name))
	if s == "" {
		return "", nil
	}
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", badParam("%s must be one of %s", name, strings.Join(allowed, ", "))
}

// timeLayouts are the accepted forms of from and to: RFC 3339, what an
// HTML datetime-local input sends, and a date (UTC unless an offset is
// given).
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

func parseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (use RFC 3339, 2006-01-02T15:04 or 2006-01-02)", s)
}

// sinceChoices are the preset ranges of the time filter.
var sinceChoices = []struct {
	Value, Label string
	d            time.Duration
}{
	{"1h", "last hour", time.Hour},
	{"24h", "last 24 hours", 24 * time.Hour},
	{"7d", "last 7 days", 7 * 24 * time.Hour},
	{"30d", "last 30 days", 30 * 24 * time.Hour},
	{"all", "all time", 0},
}

// defaultSince is the range a page shows without time parameters.
const defaultSince = "24h"

// timeRange is a page's time filter, resolved and as typed.
type timeRange struct {
	From, To       time.Time // zero: unbounded
	Since          string    // the preset chosen, "" when from/to were given
	FromIn, ToIn   string    // as typed, for the form
	Choices        []choice
	Description    string
	explicitBounds bool
}

type choice struct {
	Value, Label string
	Selected     bool
}

// parseRange reads from, to and since. Explicit from/to win over since
// (the form then offers "from / to" as the range); with neither, since
// defaults to defaultSince, relative to now.
func parseRange(v url.Values, now time.Time) (timeRange, error) {
	var r timeRange
	var err error
	r.FromIn, r.ToIn = strings.TrimSpace(v.Get("from")), strings.TrimSpace(v.Get("to"))
	if r.FromIn != "" {
		if r.From, err = parseTime(r.FromIn); err != nil {
			return r, badParam("from: %v", err)
		}
	}
	if r.ToIn != "" {
		if r.To, err = parseTime(r.ToIn); err != nil {
			return r, badParam("to: %v", err)
		}
	}
	if !r.From.IsZero() && !r.To.IsZero() && !r.From.Before(r.To) {
		return r, badParam("from must be before to")
	}
	r.explicitBounds = r.FromIn != "" || r.ToIn != ""
	if !r.explicitBounds {
		r.Since = strings.TrimSpace(v.Get("since"))
		if r.Since == "" {
			r.Since = defaultSince
		}
		found := false
		for _, c := range sinceChoices {
			if c.Value == r.Since {
				found = true
				if c.d > 0 {
					r.From = now.Add(-c.d).UTC()
				}
			}
		}
		if !found {
			return r, badParam("since must be one of 1h, 24h, 7d, 30d, all")
		}
	}
	if r.explicitBounds {
		r.Choices = append(r.Choices, choice{Value: "", Label: "from / to", Selected: true})
	}
	for _, c := range sinceChoices {
		r.Choices = append(r.Choices, choice{Value: c.Value, Label: c.Label, Selected: c.Value == r.Since})
	}
	switch {
	case r.From.IsZero() && r.To.IsZero():
		r.Description = "all time"
	case r.To.IsZero():
		r.Description = "since " + fmtTime(r.From)
	case r.From.IsZero():
		r.Description = "until " + fmtTime(r.To)
	default:
		r.Description = fmtTime(r.From) + " to " + fmtTime(r.To)
	}
	return r, nil
}

// values adds the range to v the way parseRange reads it back.
func (r timeRange) values(v url.Values) {
	if r.explicitBounds {
		if r.FromIn != "" {
			v.Set("from", r.FromIn)
		}
		if r.ToIn != "" {
			v.Set("to", r.ToIn)
		}
		return
	}
	v.Set("since", r.Since)
}

// parseCursor reads a receipt list position written by formatCursor.
func parseCursor(s string) (query.ReceiptCursor, error) {
	if s == "" {
		return query.ReceiptCursor{}, nil
	}
	ms, id, ok := strings.Cut(s, "~")
	n, err := strconv.ParseUint(ms, 10, 64)
	if !ok || err != nil || id == "" || len(id) > query.MaxFilterLen {
		return query.ReceiptCursor{}, badParam("before is not a position of the receipt list")
	}
	return query.ReceiptCursor{TimeMS: n, ReceiptID: id}, nil
}

func formatCursor(c query.ReceiptCursor) string {
	return strconv.FormatUint(c.TimeMS, 10) + "~" + c.ReceiptID
}
