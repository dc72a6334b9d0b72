package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/talos-audit/talos/query"
)

// Overview limits: the top lists show this many rows; the series reads
// at most query's maximum of hours.
const (
	topN        = 10
	seriesLimit = 10000
)

type overviewData struct {
	Range                  timeRange
	Agent, Server, Tool    string
	Totals                 query.CallTotals
	DenyRate               string
	Series                 seriesChart
	Hours                  []hourBucket // newest first, for the table
	Reasons, Agents, Tools barChart
}

// overview is /: totals and charts of the calls in a time range,
// optionally of one agent, server or tool.
func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	d, err := overviewFilter(r.URL.Query(), h.o.Now())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "The filter is not valid.", err)
		return
	}
	p := query.Params{From: d.Range.From, To: d.Range.To, Agent: d.Agent, Server: d.Server, Tool: d.Tool}
	ctx, cancel := queryContext(r)
	defer cancel()

	if d.Totals, err = query.Totals(ctx, h.o.Conn, h.o.Database, p); err != nil {
		h.fail(w, r, http.StatusInternalServerError, "The totals could not be read from ClickHouse.", err)
		return
	}
	if d.Totals.Calls > 0 {
		d.DenyRate = fmt.Sprintf("%.1f%%", 100*float64(d.Totals.Denials)/float64(d.Totals.Calls))
	}

	series, err := h.runCanned(ctx, "calls-over-time", p, seriesLimit)
	if err == nil {
		d.Hours, err = hourBuckets(series)
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "The calls over time could not be read from ClickHouse.", err)
		return
	}
	d.Series = newSeriesChart(d.Hours, d.Range.From, d.Range.To, h.o.Now())
	sort.Slice(d.Hours, func(i, j int) bool { return d.Hours[i].Hour.After(d.Hours[j].Hour) })

	if err := h.denialCharts(ctx, p, &d); err != nil {
		h.fail(w, r, http.StatusInternalServerError, "A chart could not be read from ClickHouse.", err)
		return
	}
	h.render(w, r, http.StatusOK, "overview", "Overview", d)
}

// overviewFilter reads the overview's time range and its agent, server
// and tool filters from the query string.
func overviewFilter(v url.Values, now time.Time) (overviewData, error) {
	var (
		d   overviewData
		err error
	)
	if d.Range, err = parseRange(v, now); err != nil {
		return d, err
	}
	if d.Agent, err = text(v, "agent"); err != nil {
		return d, err
	}
	if d.Server, err = text(v, "server"); err != nil {
		return d, err
	}
	d.Tool, err = text(v, "tool")
	return d, err
}

// runCanned runs the canned query name with p, at most limit rows.
func (h *handler) runCanned(ctx context.Context, name string, p query.Params, limit int) (*query.Result, error) {
	p.Limit = limit
	res, err := query.RunCanned(ctx, h.o.Conn, h.o.Database, name, p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return res, nil
}

// denialCharts reads the bar charts of denials by reason, by agent and by
// tool into d.
func (h *handler) denialCharts(ctx context.Context, p query.Params, d *overviewData) error {
	bars := func(name string, figure func(row []any) (label, key string, set func(url.Values), ok bool)) (barChart, error) {
		res, err := h.runCanned(ctx, name, p, topN)
		if err != nil {
			return barChart{}, err
		}
		var out []hbar
		for _, row := range res.Rows {
			label, key, set, ok := figure(row)
			n, okN := asUint(row[len(res.Columns)-1])
			if !ok || !okN {
				return barChart{}, fmt.Errorf("%s: unexpected columns %v", name, res.Columns)
			}
			out = append(out, hbar{Label: label, Figure: key, Value: n, Href: d.deniedHref(set)})
		}
		return newBarChart(out), nil
	}
	str := func(v any) (string, bool) { s, ok := v.(string); return s, ok }
	var err error
	if d.Reasons, err = bars("denial-reasons", func(row []any) (string, string, func(url.Values), bool) {
		code, ok := str(row[0])
		return code, "reason:" + code, func(q url.Values) { q.Set("reason", code) }, ok && len(row) >= 2
	}); err != nil {
		return err
	}
	if d.Agents, err = bars("top-denied-agents", func(row []any) (string, string, func(url.Values), bool) {
		agent, ok := str(row[0])
		label := agent
		if label == "" {
			label = "(no agent)"
		}
		return label, "agent:" + agent, func(q url.Values) { q.Set("agent", agent) }, ok && len(row) >= 2
	}); err != nil {
		return err
	}
	d.Tools, err = bars("top-denied-tools", func(row []any) (string, string, func(url.Values), bool) {
		server, ok1 := str(row[0])
		tool, ok2 := str(row[1])
		return server + "/" + tool, "tool:" + server + "/" + tool,
			func(q url.Values) { q.Set("server", server); q.Set("tool", tool) }, ok1 && ok2 && len(row) >= 3
	})
	return err
}

// deniedHref links a bar to the denials it counts: the receipts of d's
// range and filters, narrowed by set.
func (d *overviewData) deniedHref(set func(url.Values)) string {
	q := url.Values{"decision": {"deny"}}
	d.Range.values(q)
	if d.Agent != "" {
		q.Set("agent", d.Agent)
	}
	if d.Server != "" {
		q.Set("server", d.Server)
	}
	if d.Tool != "" {
		q.Set("tool", d.Tool)
	}
	set(q)
	return "/receipts?" + q.Encode()
}

// hourBuckets reads calls-over-time (hour, calls, denials).
func hourBuckets(res *query.Result) ([]hourBucket, error) {
	var out []hourBucket
	for _, row := range res.Rows {
		if len(row) < 3 {
			return nil, errors.New("calls-over-time: fewer than 3 columns")
		}
		hour, ok1 := asTime(row[0])
		calls, ok2 := asUint(row[1])
		denials, ok3 := asUint(row[2])
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("calls-over-time: unexpected values %T %T %T", row[0], row[1], row[2])
		}
		out = append(out, hourBucket{Hour: hour, Calls: calls, Denials: denials})
	}
	return out, nil
}
