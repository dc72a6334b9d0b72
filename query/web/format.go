package web

import (
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// displayTime is how pages show times: UTC, to the second.
const displayTime = "2006-01-02 15:04:05Z"

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(displayTime)
}

// fmtValue formats a value as a canned query scanned it.
func fmtValue(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case time.Time:
		return fmtTime(x)
	case *time.Time:
		if x == nil {
			return ""
		}
		return fmtTime(*x)
	case bool:
		if x {
			return "yes"
		}
		return "no"
	case float64:
		return fmtFloat(x)
	case float32:
		return fmtFloat(float64(x))
	case []string:
		return strings.Join(x, ", ")
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v)
}

func fmtFloat(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "–"
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', 2, 64)
}

// asUint reads a count as a canned query scanned it.
func asUint(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint64:
		return x, true
	case uint32:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint8:
		return uint64(x), true
	case int64:
		return uint64(max(x, 0)), x >= 0
	case int32:
		return uint64(max(x, 0)), x >= 0
	case int:
		return uint64(max(x, 0)), x >= 0
	case float64:
		return uint64(max(x, 0)), x >= 0
	}
	return 0, false
}

// asTime reads a time as a canned query scanned it.
func asTime(v any) (time.Time, bool) {
	switch x := v.(type) {
	case time.Time:
		return x.UTC(), true
	case *time.Time:
		if x != nil {
			return x.UTC(), true
		}
	}
	return time.Time{}, false
}

// asBool reads a flag (bool or UInt8) as a canned query scanned it.
func asBool(v any) (bool, bool) {
	if b, ok := v.(bool); ok {
		return b, true
	}
	if n, ok := asUint(v); ok {
		return n != 0, true
	}
	return false, false
}

var funcs = template.FuncMap{
	"fmtTime": fmtTime,
	"fmtTimeMS": func(t time.Time) string {
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"fmtValue": fmtValue,
	"hourKey":  hourKey,
	"join":     strings.Join,
	"f1":       func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"add":      func(a, b float64) float64 { return a + b },
	"sub":      func(a, b float64) float64 { return a - b },
	"pathEscape": func(s string) string {
		return url.PathEscape(s)
	},
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
}
