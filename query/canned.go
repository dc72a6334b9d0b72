package query

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Canned queries are the auditors' questions with a fixed SQL text each:
// callers (talosctl query, the web dashboard) choose a query by name and
// pass Params, which are bound as `?` arguments by clickhouse-go. No SQL
// text from a caller ever reaches ClickHouse.

// Params narrows a canned query; zero values mean no filter.
type Params struct {
	From, To            time.Time // [From, To); zero = unbounded
	Agent, Server, Tool string
	Limit               int // rows; 0 = 100; at most 10000
}

// Canned describes one canned question.
type Canned struct {
	Name    string   // kebab-case, e.g. "denials-by-reason"
	Help    string   // one line
	View    string   // the v_* view it reads
	Columns []string // result column names in order
	Filters []string // which Params it honours: "from","to","agent","server","tool"
}

// Result is a canned query's rows; values are Go values as scanned (string,
// uint64, float64, time.Time, []string). Every unsigned integer is a uint64
// and every time is in UTC.
type Result struct {
	Name    string
	Columns []string
	Rows    [][]any
}

// ErrUnknownQuery is returned (wrapped, with the name) by RunCanned for a
// name that is not a canned query.
var ErrUnknownQuery = errors.New("query: unknown canned query")

// ErrInvalidParams is returned (wrapped, with the reason) by RunCanned for
// Params it cannot run with: a negative Limit, or From after To.
var ErrInvalidParams = errors.New("query: invalid canned query parameters")

// Filter names, as listed in Canned.Filters.
const (
	FilterFrom   = "from"
	FilterTo     = "to"
	FilterAgent  = "agent"
	FilterServer = "server"
	FilterTool   = "tool"
)

// Row limits of Params.Limit: 0 means DefaultLimit; more than MaxLimit is
// cut to MaxLimit.
const (
	DefaultLimit = 100
	MaxLimit     = 10000
)

// cannedPeriod is how a query's view is compared with Params.From and To.
type cannedPeriod int

const (
	// perRecord: the view has one row per record and a time_ms column (unix
	// milliseconds): rows in [From, To) exactly.
	perRecord cannedPeriod = iota
	// perHour: the view is an hourly aggregate with an `hour` column: the
	// hours that overlap [From, To).
	perHour
	// perDay: the view is a daily aggregate with a `day` column (Date, UTC):
	// the days that overlap [From, To).
	perDay
)

// cannedQuery is a Canned and how to run it.
type cannedQuery struct {
	Canned
	// sql selects Columns (in order) from {view}; {where} is replaced by
	// the filter conditions ("WHERE ..." or nothing) and the text ends
	// with "LIMIT ?".
	sql     string
	period  cannedPeriod
	timeCol string // compared with From/To; "" = no time filter
	// Columns compared with Agent, Server and Tool; "" = not honoured.
	agentCol, serverCol, toolCol string
}

// The queries (init sorts them by name). Aggregating queries alias their results
// with names that are no column of their view, or rename them in an outer
// SELECT: an alias equal to an aggregated column's name breaks on some
// ClickHouse versions.
var cannedQueries = []cannedQuery{{
	Canned: Canned{Name: "calls-over-time", View: ViewDecisions,
		Help:    "Calls (phase-pre decisions) and denials per hour; post_denials are results denied after the tool ran.",
		Columns: []string{"hour", "calls", "denials", "post_denials"}},
	sql: `SELECT toStartOfHour(time) AS hour, countIf(phase = 'pre') AS calls,
	countIf(phase = 'pre' AND decision = 'deny') AS denials, countIf(phase = 'post' AND decision = 'deny') AS post_denials
FROM {view} {where}
GROUP BY hour ORDER BY hour LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "calls-during-killswitch", View: ViewCallsDuringKillSwitch,
		Help:    "Decisions made while a kill switch covering the call was set, newest first (an allow here slipped through).",
		Columns: []string{"time", "tool_call_id", "agent_id", "server_id", "tool_name", "decision", "killswitch_target", "phase", "reason_codes", "receipt_id", "time_ms"}},
	sql: `SELECT time, tool_call_id, agent_id, server_id, tool_name, decision, killswitch_target, phase, reason_codes, receipt_id, time_ms
FROM {view} {where}
ORDER BY time_ms DESC, tool_call_id, phase, killswitch_target LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "denial-reasons", View: ViewDenials,
		Help:    "Denials per reason code, most frequent first (a denial with two codes counts for both).",
		Columns: []string{"reason_code", "denials"}},
	sql: `SELECT reason_code, count() AS denials
FROM {view} ARRAY JOIN reason_codes AS reason_code {where}
GROUP BY reason_code ORDER BY denials DESC, reason_code LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "denials-by-reason", View: ViewDenials,
		Help:    "Denials per hour, server and reason code.",
		Columns: []string{"hour", "server_id", "reason_code", "denials"}},
	sql: `SELECT hour, server_id, reason_code, count() AS denials
FROM {view} ARRAY JOIN reason_codes AS reason_code {where}
GROUP BY hour, server_id, reason_code ORDER BY hour, server_id, reason_code LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "incident-timeline", View: ViewIncidentTimeline,
		Help:    "Kill switches, quarantines, revocations, registry publish/pin and replay flushes (accepted or refused), newest first.",
		Columns: []string{"time", "verb", "scope", "target", "actor", "reason", "accepted", "code", "receipt_id", "time_ms", "stream_seq"}},
	sql: `SELECT time, verb, scope, target, actor, reason, accepted, code, receipt_id, time_ms, stream_seq
FROM {view} {where}
ORDER BY time_ms DESC, stream_seq DESC, receipt_id LIMIT ?`,
	timeCol: "time_ms",
}, {
	Canned: Canned{Name: "latency-percentiles", View: ViewToolLatency,
		Help:    "How long tools ran (executed calls): p50/p90/p99 and max in ms, and failures, per server and tool.",
		Columns: []string{"server_id", "tool_name", "calls", "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors"}},
	sql: `SELECT server_id, tool_name, n AS calls, q[1] AS p50_ms, q[2] AS p90_ms, q[3] AS p99_ms, mx AS max_ms, errs AS errors
FROM (
	SELECT server_id, tool_name, count() AS n, quantiles(0.5, 0.9, 0.99)(duration_ms) AS q, max(duration_ms) AS mx,
		countIf(ok = 0) AS errs
	FROM {view} {where}
	GROUP BY server_id, tool_name
)
ORDER BY calls DESC, server_id, tool_name LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "mcp-requests", View: ViewMCPRequests,
		Help:    "MCP requests Talos decided per method, server and name (tool, prompt, resource, or a server request's method), with denials.",
		Columns: []string{"method", "server_id", "tool_name", "requests", "denials"}},
	sql: `SELECT method, server_id, tool_name, count() AS requests, countIf(decision = 'deny') AS denials
FROM {view} {where}
GROUP BY method, server_id, tool_name ORDER BY requests DESC, method, server_id, tool_name LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "redaction-counts", View: ViewRedactionCounts,
		Help:    "Secrets redacted per day and rule (whole UTC days overlapping --from/--to).",
		Columns: []string{"day", "rule", "redactions"}},
	sql: `SELECT day, rule, redactions
FROM {view} {where}
ORDER BY day, redactions DESC, rule LIMIT ?`,
	period: perDay, timeCol: "day",
}, {
	Canned: Canned{Name: "registry-digests", View: ViewRegistryDigests,
		Help:    "Registry bundles the workers enforced: first and last call seen with each digest (whole hours overlapping --from/--to).",
		Columns: []string{"registry_digest", "first_seen", "last_seen", "calls", "first_seen_ms", "last_seen_ms"}},
	sql: `SELECT registry_digest, f AS first_seen, l AS last_seen, n AS calls, fms AS first_seen_ms, lms AS last_seen_ms
FROM (
	SELECT registry_digest, min(first_seen) AS f, max(last_seen) AS l, sum(calls) AS n, min(first_seen_ms) AS fms,
		max(last_seen_ms) AS lms
	FROM {view} {where}
	GROUP BY registry_digest
)
ORDER BY first_seen_ms, registry_digest LIMIT ?`,
	period: perHour, timeCol: "hour",
}, {
	Canned: Canned{Name: "server-requests", View: ViewServerRequests,
		Help: "What servers asked of clients (sampling, elicitation, roots), newest first, beside the call each was made during (--tool: that call's tool).",
		Columns: []string{"time", "parent_tool_call_id", "parent_method", "parent_tool_name", "tool_call_id", "method", "decision", "ok",
			"server_id", "agent_id", "args_hash", "result_hash", "receipt_id", "time_ms"}},
	sql: `SELECT time, parent_tool_call_id, parent_method, parent_tool_name, tool_call_id, method, decision, ok,
	server_id, agent_id, args_hash, result_hash, receipt_id, time_ms
FROM {view} {where}
ORDER BY time_ms DESC, tool_call_id LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "parent_tool_name",
}, {
	Canned: Canned{Name: "top-denied-agents", View: ViewDenials,
		Help:    "Agents with the most denials.",
		Columns: []string{"agent_id", "denials"}},
	sql: `SELECT agent_id, count() AS denials
FROM {view} {where}
GROUP BY agent_id ORDER BY denials DESC, agent_id LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "top-denied-tools", View: ViewDenials,
		Help:    "Tools (server and tool name) with the most denials.",
		Columns: []string{"server_id", "tool_name", "denials"}},
	sql: `SELECT server_id, tool_name, count() AS denials
FROM {view} {where}
GROUP BY server_id, tool_name ORDER BY denials DESC, server_id, tool_name LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}, {
	Canned: Canned{Name: "write-calls-per-agent", View: ViewWriteCalls,
		Help:    "Calls to write tools per agent: allowed, denied, held for approval.",
		Columns: []string{"agent_id", "allowed", "denied", "approvals", "calls"}},
	sql: `SELECT agent_id, countIf(decision = 'allow') AS allowed, countIf(decision = 'deny') AS denied,
	countIf(decision = 'require_approval') AS approvals, count() AS calls
FROM {view} {where}
GROUP BY agent_id ORDER BY calls DESC, agent_id LIMIT ?`,
	timeCol: "time_ms", agentCol: "agent_id", serverCol: "server_id", toolCol: "tool_name",
}}

func init() {
	slices.SortFunc(cannedQueries, func(a, b cannedQuery) int { return strings.Compare(a.Name, b.Name) })
	for i := range cannedQueries {
		q := &cannedQueries[i]
		if q.timeCol != "" {
			q.Filters = append(q.Filters, FilterFrom, FilterTo)
		}
		for _, f := range []struct{ name, col string }{{FilterAgent, q.agentCol}, {FilterServer, q.serverCol}, {FilterTool, q.toolCol}} {
			if f.col != "" {
				q.Filters = append(q.Filters, f.name)
			}
		}
	}
}

// CannedQueries returns every canned query, sorted by Name. The slices in
// it are copies: changing them changes nothing here.
func CannedQueries() []Canned {
	out := make([]Canned, len(cannedQueries))
	for i := range cannedQueries {
		out[i] = cannedQueries[i].copy()
	}
	return out
}

// LookupCanned returns the canned query called name.
func LookupCanned(name string) (Canned, bool) {
	q, ok := findCanned(name)
	if !ok {
		return Canned{}, false
	}
	return q.copy(), true
}

func findCanned(name string) (*cannedQuery, bool) {
	i, ok := slices.BinarySearchFunc(cannedQueries, name, func(q cannedQuery, n string) int { return strings.Compare(q.Name, n) })
	if !ok {
		return nil, false
	}
	return &cannedQueries[i], true
}

func (q *cannedQuery) copy() Canned {
	c := q.Canned
	c.Columns = slices.Clone(c.Columns)
	c.Filters = slices.Clone(c.Filters)
	return c
}

// RunCanned runs the canned query name on database with p and returns its
// rows. Filters the query does not honour (see Canned.Filters) are
// ignored. The error wraps ErrUnknownQuery for an unknown name and
// ErrInvalidParams for p it cannot run with.
func RunCanned(ctx context.Context, conn driver.Conn, database, name string, p Params) (*Result, error) {
	q, ok := findCanned(name)
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownQuery, name)
	}
	view, err := table(database, q.View)
	if err != nil {
		return nil, err
	}
	sql, args, err := q.build(view, p)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("query: %s: %w", q.Name, err)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	if len(types) != len(q.Columns) {
		return nil, fmt.Errorf("query: %s: %d columns, want %d", q.Name, len(types), len(q.Columns))
	}
	res := &Result{Name: q.Name, Columns: slices.Clone(q.Columns), Rows: [][]any{}}
	for rows.Next() {
		targets := make([]any, len(types))
		for i, t := range types {
			targets[i] = cannedScanTarget(t)
		}
		if err := rows.Scan(targets...); err != nil {
			return nil, fmt.Errorf("query: %s: %w", q.Name, err)
		}
		row := make([]any, len(targets))
		for i, t := range targets {
			row[i] = cannedValue(cannedDeref(t))
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: %s: %w", q.Name, err)
	}
	return res, nil
}

// build returns q's SQL text for view and its arguments under p.
func (q *cannedQuery) build(view string, p Params) (string, []any, error) {
	limit := p.Limit
	switch {
	case limit < 0:
		return "", nil, fmt.Errorf("%w: limit %d is negative", ErrInvalidParams, limit)
	case limit == 0:
		limit = DefaultLimit
	case limit > MaxLimit:
		limit = MaxLimit
	}
	if !p.From.IsZero() && !p.To.IsZero() && p.From.After(p.To) {
		return "", nil, fmt.Errorf("%w: from %s is after to %s", ErrInvalidParams,
			p.From.UTC().Format(time.RFC3339), p.To.UTC().Format(time.RFC3339))
	}
	var conds []string
	var args []any
	if q.timeCol != "" {
		c, a := q.timeConds(p.From, p.To)
		conds, args = append(conds, c...), append(args, a...)
	}
	for _, f := range []struct{ col, val string }{{q.agentCol, p.Agent}, {q.serverCol, p.Server}, {q.toolCol, p.Tool}} {
		if f.col != "" && f.val != "" {
			conds, args = append(conds, f.col+" = ?"), append(args, f.val)
		}
	}
	where := ""
	if len(conds) > 0 {
		where = "WHERE " + strings.Join(conds, " AND ")
	}
	sql := strings.NewReplacer("{view}", view, "{where}", where).Replace(q.sql)
	return sql, append(args, limit), nil
}

// timeConds are the conditions selecting q's rows in [from, to).
func (q *cannedQuery) timeConds(from, to time.Time) ([]string, []any) {
	var conds []string
	var args []any
	switch q.period {
	case perRecord:
		if !from.IsZero() {
			conds, args = append(conds, q.timeCol+" >= ?"), append(args, cannedMS(from))
		}
		if !to.IsZero() {
			conds, args = append(conds, q.timeCol+" < ?"), append(args, cannedMS(to))
		}
	case perHour:
		// The hours that end after from and start before to.
		if !from.IsZero() {
			conds, args = append(conds, "toUInt64(toUInt32("+q.timeCol+")) * 1000 >= ?"), append(args, cannedMS(from.Truncate(time.Hour)))
		}
		if !to.IsZero() {
			conds, args = append(conds, "toUInt64(toUInt32("+q.timeCol+")) * 1000 < ?"), append(args, cannedMS(to))
		}
	case perDay:
		// The UTC days that end after from and start before to; a Date
		// literal, so the server's time zone plays no part.
		if !from.IsZero() {
			conds, args = append(conds, q.timeCol+" >= toDate(?)"), append(args, from.UTC().Format(time.DateOnly))
		}
		if !to.IsZero() {
			end := to.UTC().Truncate(24 * time.Hour)
			if to.After(end) {
				end = end.Add(24 * time.Hour)
			}
			conds, args = append(conds, q.timeCol+" < toDate(?)"), append(args, end.Format(time.DateOnly))
		}
	}
	return conds, args
}

// cannedMS is t in unix milliseconds; times before 1970 are 0 (no stored
// row is older).
func cannedMS(t time.Time) uint64 {
	if ms := t.UnixMilli(); ms > 0 {
		return uint64(ms)
	}
	return 0
}

// cannedScanTarget is a pointer to a new value of the Go type the driver
// scans column t into.
func cannedScanTarget(t driver.ColumnType) any { return reflect.New(t.ScanType()).Interface() }

// cannedDeref is the value a cannedScanTarget points to.
func cannedDeref(p any) any { return reflect.ValueOf(p).Elem().Interface() }

// cannedValue turns a scanned value into one of Result's types.
func cannedValue(v any) any {
	switch x := v.(type) {
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case float32:
		return float64(x)
	case time.Time:
		return x.UTC()
	case []string:
		if x == nil {
			return []string{}
		}
		return x
	}
	return v
}
