package main

import (
	"fmt"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// chartSubjects are the contenders the chart shows, top to bottom.
var chartSubjects = []string{
	"ceiling", "redis_rate", "engine/gcra", "engine+args/gcra", "engine+batch/gcra",
	"engine+batch/fixed_window", "engine+batch/token_bucket", "engine+batch/sliding_window",
	"redis_rate×3", "engine/3-limits", "engine+batch/3-limits", "http-unbatched/gcra", "http-nethttp/gcra", "http/gcra",
}

// writeChart draws decisions per second on the distinct key set, one bar per
// concurrency, for the chart's contenders, as SVG.
func writeChart(path string, r *results) error {
	var names []string
	for _, s := range chartSubjects {
		if r.find(s, distinct, r.Meta.Conc[0]) != nil {
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		return nil // nothing measured (e.g. -only filter): no chart
	}
	// NominalY puts the first name at the bottom; the ceiling belongs on top.
	slices.Reverse(names)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("tollgate vs redis_rate vs the Redis ceiling: decisions/s, %d clients", r.Meta.Clients)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "decisions per second (higher is better)"
	p.X.Min = 0
	// The bottom rows (HTTP) are the shortest bars: the legend goes there.
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.Padding = vg.Points(4)
	p.X.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		ticks := plot.DefaultTicks{}.Ticks(min, max)
		for i := range ticks {
			if ticks[i].Label != "" {
				ticks[i].Label = thr(ticks[i].Value)
			}
		}
		return ticks
	})
	n := len(r.Meta.Conc)
	w := vg.Points(7)
	var most float64
	for _, s := range names {
		for _, c := range r.Meta.Conc {
			if x := r.find(s, distinct, c); x != nil {
				most = max(most, x.Throughput)
			}
		}
	}
	p.X.Max = most * 1.08
	for i, c := range r.Meta.Conc {
		vals := make(plotter.Values, len(names))
		for j, s := range names {
			if x := r.find(s, distinct, c); x != nil {
				vals[j] = x.Throughput
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("bench: chart: %w", err)
		}
		bars.Horizontal = true
		bars.LineStyle.Width = 0
		bars.Color = plotutil.Color(i)
		// Concurrency 1 on top within each group.
		bars.Offset = w * vg.Length(float64(n-1)/2-float64(i))
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("concurrency %d", c), bars)
	}
	p.NominalY(names...)
	p.Add(plotter.NewGrid())
	height := vg.Length(len(names))*w*vg.Length(n+1) + 2*vg.Inch
	if err := p.Save(9*vg.Inch, height, path); err != nil {
		return fmt.Errorf("bench: chart: %w", err)
	}
	return nil
}
