package web

import (
	"strconv"
	"time"
)

// Charts are drawn on the server as inline SVG: geometry here, markup in
// the templates (html/template escapes every label), colours in
// style.css. The numbers are also in the DOM as text (data-figure).

// hourBucket is one hour of the calls-over-time series.
type hourBucket struct {
	Hour           time.Time
	Calls, Denials uint64
}

// seriesChart is a bar chart of calls (and their denials) per hour on a
// time axis from Start to End.
type seriesChart struct {
	Width, Height int
	PlotLeft      float64
	PlotTop       float64
	PlotBottom    float64
	PlotRight     float64
	Bars          []seriesBar
	Grid          []gridLine
	XLabels       []axisLabel
	Empty         bool
}

type seriesBar struct {
	X, W                 float64
	CallsY, CallsH       float64
	DeniesY, DeniesH     float64
	Label                string // hour, for the tooltip
	Figure               string // data-figure key of the hour, e.g. 2026-03-04T05:00Z
	Calls, Denials       uint64
	CallsText, DenyTitle string
}

type gridLine struct {
	Y     float64
	Label string
}

type axisLabel struct {
	X      float64
	Label  string
	Anchor string // start | middle | end
}

// hourKey names an hour in data-figure keys: calls@2026-03-04T05:00Z.
func hourKey(t time.Time) string { return t.UTC().Format("2006-01-02T15:04Z") }

// minSpan is the shortest time axis of an open-ended range: a few hours
// of data still read as hours, not as one wall of colour.
const minSpan = 24 * time.Hour

// newSeriesChart lays out buckets between start and end; a zero end is
// the hour after now (or after the data), a zero start the first hour
// of the data, widened to minSpan.
func newSeriesChart(buckets []hourBucket, start, end, now time.Time) seriesChart {
	c := seriesChart{Width: 960, Height: 240, PlotLeft: 56, PlotTop: 12, PlotRight: 944, PlotBottom: 206}
	if len(buckets) == 0 {
		c.Empty = true
		return c
	}
	first, last := buckets[0].Hour, buckets[0].Hour
	var top uint64
	for _, b := range buckets {
		if b.Hour.Before(first) {
			first = b.Hour
		}
		if b.Hour.After(last) {
			last = b.Hour
		}
		top = max(top, b.Calls, b.Denials)
	}
	lo := first
	if !start.IsZero() && start.Before(lo) {
		lo = start.Truncate(time.Hour)
	}
	hi := last.Add(time.Hour)
	switch {
	case !end.IsZero() && end.After(hi):
		hi = end
	case end.IsZero() && now.Truncate(time.Hour).Add(time.Hour).After(hi):
		hi = now.Truncate(time.Hour).Add(time.Hour)
	}
	if start.IsZero() && hi.Sub(lo) < minSpan {
		lo = hi.Add(-minSpan)
	}
	span := hi.Sub(lo).Seconds()
	if span <= 0 {
		span = 3600
	}
	plotW := c.PlotRight - c.PlotLeft
	plotH := c.PlotBottom - c.PlotTop
	hourW := plotW * 3600 / span
	barW := max(hourW*0.8, 1.5)
	scale := niceCeil(top)
	y := func(v uint64) float64 { return c.PlotBottom - plotH*float64(v)/float64(scale) }
	for _, b := range buckets {
		x := c.PlotLeft + plotW*b.Hour.Sub(lo).Seconds()/span + (hourW-barW)/2
		c.Bars = append(c.Bars, seriesBar{
			X: x, W: barW,
			CallsY: y(b.Calls), CallsH: c.PlotBottom - y(b.Calls),
			DeniesY: y(b.Denials), DeniesH: c.PlotBottom - y(b.Denials),
			Label: fmtTime(b.Hour), Figure: hourKey(b.Hour), Calls: b.Calls, Denials: b.Denials,
		})
	}
	for i := 0; i <= 4; i++ {
		v := scale * uint64(i) / 4
		c.Grid = append(c.Grid, gridLine{Y: y(v), Label: strconv.FormatUint(v, 10)})
	}
	c.XLabels = []axisLabel{
		{X: c.PlotLeft, Label: lo.UTC().Format("Jan 2 15:04"), Anchor: "start"},
		{X: (c.PlotLeft + c.PlotRight) / 2, Label: lo.Add(hi.Sub(lo) / 2).UTC().Format("Jan 2 15:04"), Anchor: "middle"},
		{X: c.PlotRight, Label: hi.UTC().Format("Jan 2 15:04") + " UTC", Anchor: "end"},
	}
	return c
}

// niceCeil is the top of an axis for values up to n: four grid steps of
// 1, 2 or 5 times a power of ten.
func niceCeil(n uint64) uint64 {
	need := max((n+3)/4, 1)
	for p := uint64(1); p <= 1e17; p *= 10 {
		for _, m := range []uint64{1, 2, 5} {
			if step := m * p; step >= need {
				return 4 * step
			}
		}
	}
	return 4 * need
}

// barChart is a horizontal bar chart of labelled counts (reasons, agents,
// tools), largest first as the query returned them.
type barChart struct {
	Width, Height int
	LabelW        float64
	Bars          []hbar
	Empty         bool
}

type hbar struct {
	Y, W, TextY float64
	Label       string
	Figure      string // data-figure key, e.g. reason:KILL_SWITCH
	Value       uint64
	ValueX      float64
	Href        string // where the bar links to (a filtered receipt list)
}

const (
	barRow    = 26.0
	barHeight = 18.0
)

// newBarChart lays out bars: labels on the left, values right of each bar.
func newBarChart(bars []hbar) barChart {
	c := barChart{Width: 500, LabelW: 240, Empty: len(bars) == 0}
	var top uint64
	for _, b := range bars {
		top = max(top, b.Value)
	}
	if top == 0 {
		top = 1
	}
	maxW := float64(c.Width) - c.LabelW - 50
	for i, b := range bars {
		b.Y = 4 + float64(i)*barRow
		b.TextY = b.Y + barHeight - 4
		b.W = max(maxW*float64(b.Value)/float64(top), 1)
		b.ValueX = c.LabelW + b.W + 6
		c.Bars = append(c.Bars, b)
	}
	c.Height = int(8 + float64(len(bars))*barRow)
	return c
}
