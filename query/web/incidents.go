package web

import (
	"net/http"
	"sort"

	"github.com/talos-audit/talos/query"
)

// timelineLimit bounds the incident timeline of one page.
const timelineLimit = 1000

// hiddenColumns are timeline columns the page does not show (time_ms
// repeats time).
var hiddenColumns = map[string]bool{"time_ms": true}

type cell struct {
	Text string
	Link string // receipt page, for receipt_id
	Time bool
}

type incidentRow struct {
	Cells    []cell
	Accepted string // "yes", "no" or "" when the column is missing
}

type verbCount struct {
	Verb  string
	Count int
}

type incidentsData struct {
	Range      timeRange
	Columns    []string
	Rows       []incidentRow
	Verbs      []verbCount
	Limited    bool
	Forwarding forwardingPanel
}

// incidents is /incidents: the canned incident-timeline (kill switches,
// quarantines, revocations, registry changes) in a time range.
func (h *handler) incidents(w http.ResponseWriter, r *http.Request) {
	var d incidentsData
	var err error
	if d.Range, err = parseRange(r.URL.Query(), h.o.Now()); err != nil {
		h.fail(w, r, http.StatusBadRequest, "The filter is not valid.", err)
		return
	}
	ctx, cancel := queryContext(r)
	defer cancel()
	res, err := query.RunCanned(ctx, h.o.Conn, h.o.Database, "incident-timeline",
		query.Params{From: d.Range.From, To: d.Range.To, Limit: timelineLimit})
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "The incident timeline could not be read from ClickHouse.", err)
		return
	}
	for _, c := range res.Columns {
		if !hiddenColumns[c] {
			d.Columns = append(d.Columns, c)
		}
	}
	d.Limited = len(res.Rows) >= timelineLimit
	verbs := map[string]int{}
	for _, row := range res.Rows {
		var ir incidentRow
		for i, v := range row {
			c := cell{Text: fmtValue(v)}
			if i < len(res.Columns) {
				if hiddenColumns[res.Columns[i]] {
					continue
				}
				switch res.Columns[i] {
				case "receipt_id":
					if c.Text != "" {
						c.Link = "/receipts/" + c.Text
					}
				case "verb":
					verbs[c.Text]++
				case "accepted":
					if b, ok := asBool(v); ok {
						c.Text = fmtValue(b)
						ir.Accepted = c.Text
					}
				case "time":
					c.Time = true
				}
			}
			ir.Cells = append(ir.Cells, c)
		}
		d.Rows = append(d.Rows, ir)
	}
	for v, n := range verbs {
		d.Verbs = append(d.Verbs, verbCount{Verb: v, Count: n})
	}
	sort.Slice(d.Verbs, func(i, j int) bool { return d.Verbs[i].Verb < d.Verbs[j].Verb })
	d.Forwarding = h.forwarding(ctx)
	h.render(w, r, http.StatusOK, "incidents", "Incidents", d)
}
