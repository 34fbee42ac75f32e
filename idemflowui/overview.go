package idemflowui

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// flowRow is one flow's line of the overview's table.
type flowRow struct {
	Flow                              string
	InProgress, Stuck, Dead, Finished int64
	DeadInWindow                      int64
}

type overviewData struct {
	base
	Flows  []flowRow
	Total  flowRow
	Oldest *workflow.KeySummary
	Dead24 int64
	Window string
	Chart  chart
	// Partitions is the partitioned key table's count ahead (nil on a plain table).
	Partitions *store.PartitionReport
}

// overview reads four indexed statements of the admin API: the gauges of unfinished
// keys, the stuck key due longest, the outcomes in the window, and the dead letters of
// the last 24 hours; and, from the catalog, how many partitions a partitioned key
// table has ahead.
func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	if v, msg := form(r); msg != "" || len(v) > 0 {
		h.fail(w, r, http.StatusBadRequest, cmp.Or(msg, "the overview takes no parameters"))
		return
	}
	ctx := r.Context()
	gauges, err := h.engine.GaugeKeys(ctx)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	stuck, err := h.engine.ListKeys(ctx, workflow.ListOptions{Status: workflow.KeysStuck, Limit: 1})
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	bucket := h.opts.Window / 12
	outcomes, err := h.engine.CountOutcomes(ctx, workflow.OutcomeOptions{Window: h.opts.Window, Bucket: bucket})
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	dead24, err := h.engine.CountOutcomes(ctx, workflow.OutcomeOptions{Window: 24 * time.Hour, Bucket: 24 * time.Hour, Status: workflow.KeysDead})
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	parts, err := h.engine.CheckPartitions(ctx)
	switch {
	case errors.Is(err, store.ErrNotPartitioned):
	case err != nil:
		h.failErr(w, r, err)
		return
	}
	d := &overviewData{base: h.base(r, "Overview"), Window: ago(h.opts.Window)}
	if err == nil {
		d.Partitions = &parts
	}
	d.Nav = "overview"
	d.Flows, d.Total = flowRows(gauges, outcomes)
	if len(stuck.Keys) > 0 {
		d.Oldest = &stuck.Keys[0]
	}
	for _, o := range dead24 {
		d.Dead24 += o.Keys
	}
	d.Chart = newChart(outcomes, time.Now(), h.opts.Window, bucket)
	h.render(w, r, http.StatusOK, "overview", d)
}

// flowRows merges the gauges and the window's outcomes into one row per flow, ordered
// by flow, and their total.
func flowRows(gauges []workflow.KeyGauge, outcomes []workflow.KeyCount) ([]flowRow, flowRow) {
	rows := map[string]*flowRow{}
	row := func(flow string) *flowRow {
		if rows[flow] == nil {
			rows[flow] = &flowRow{Flow: flow}
		}
		return rows[flow]
	}
	for _, g := range gauges {
		fr := row(g.Flow)
		fr.InProgress, fr.Stuck, fr.Dead = g.InProgress, g.Stuck, g.Dead
	}
	for _, o := range outcomes {
		fr := row(o.Flow)
		if o.Status == workflow.KeysFinished {
			fr.Finished += o.Keys
		} else {
			fr.DeadInWindow += o.Keys
		}
	}
	var out []flowRow
	var total flowRow
	for _, fr := range rows {
		out = append(out, *fr)
		total.InProgress += fr.InProgress
		total.Stuck += fr.Stuck
		total.Dead += fr.Dead
		total.Finished += fr.Finished
		total.DeadInWindow += fr.DeadInWindow
	}
	slices.SortFunc(out, func(a, b flowRow) int { return cmp.Compare(a.Flow, b.Flow) })
	return out, total
}

// The chart: one bar per bucket, finished keys stacked under dead-lettered ones,
// drawn as inline SVG with presentation attributes and classes only (the page's
// Content-Security-Policy allows no inline style).
const (
	chartW, chartH = 720, 180
	chartLeft      = 44 // room for the y axis's labels
	chartBottom    = 22 // room for the x axis's labels
)

type chart struct {
	W, H, Left, Base int
	Max              int64
	Bars             []bar
	Labels           []label
	Empty            bool
}

type bar struct {
	X, W                 int
	FinishedY, FinishedH int
	DeadY, DeadH         int
	Title                string
}

type label struct {
	X    int
	Text string
}

// epochBucket is the start of the bucket holding t, buckets aligned on the Unix epoch as
// the database's date_bin aligns them (time.Truncate aligns on Go's zero time, which
// agrees only for buckets that divide a day).
func epochBucket(t time.Time, bucket time.Duration) time.Time {
	since := time.Duration(t.UnixNano())
	return time.Unix(0, int64(since-since%bucket)).In(t.Location())
}

// newChart lays the outcomes out in buckets from the one holding now-window to the
// one holding now.
func newChart(outcomes []workflow.KeyCount, now time.Time, window, bucket time.Duration) chart {
	first := epochBucket(now.Add(-window), bucket)
	n := int(epochBucket(now, bucket).Sub(first)/bucket) + 1
	fin, dead := make([]int64, n), make([]int64, n)
	for _, o := range outcomes {
		i := int(o.Start.Sub(first) / bucket)
		if i < 0 || i >= n {
			continue
		}
		if o.Status == workflow.KeysFinished {
			fin[i] += o.Keys
		} else {
			dead[i] += o.Keys
		}
	}
	c := chart{W: chartW, H: chartH, Left: chartLeft, Base: chartH - chartBottom}
	for i := range n {
		c.Max = max(c.Max, fin[i]+dead[i])
	}
	c.Empty = c.Max == 0
	scale := float64(c.Base-8) / float64(max(c.Max, 1))
	slot := (chartW - chartLeft) / n
	for i := range n {
		start := first.Add(time.Duration(i) * bucket)
		fh, dh := int(float64(fin[i])*scale+0.5), int(float64(dead[i])*scale+0.5)
		if fin[i] > 0 {
			fh = max(fh, 1)
		}
		if dead[i] > 0 {
			dh = max(dh, 1)
		}
		b := bar{X: chartLeft + i*slot + 2, W: slot - 4, FinishedH: fh, DeadH: dh,
			Title: fmt.Sprintf("%s–%s UTC: %d finished, %d dead-lettered", clock(start), clock(start.Add(bucket)), fin[i], dead[i])}
		b.FinishedY = c.Base - fh
		b.DeadY = b.FinishedY - dh
		c.Bars = append(c.Bars, b)
		if i%3 == 0 || i == n-1 {
			c.Labels = append(c.Labels, label{X: b.X + b.W/2, Text: clock(start)})
		}
	}
	return c
}

func clock(t time.Time) string { return t.UTC().Format("15:04") }
