package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

var chartColors = map[string]string{
	vBare:     "#8c8c8c",
	vRecipe:   "#e07b39",
	vFused:    "#c9a227",
	vSafe:     "#8e5ea2",
	vIdem:     "#3b75af",
	vIdemPipe: "#2bb0b0",
	vReplay:   "#519e3e",
}

// chartSVG draws req/s by concurrency, one bar per variant, on a log scale, with each
// bar's median req/s and its ratio to bare.
func chartSVG(aggs []agg, concs []int) string {
	const (
		width, height = 960, 460
		left, right   = 72, 20
		top, bottom   = 64, 76
	)
	variants := []string{vBare, vRecipe, vFused, vSafe, vIdem, vIdemPipe, vReplay}
	lo, hi := math.Inf(1), 0.0
	for _, a := range aggs {
		if a.RPS > 0 {
			lo, hi = math.Min(lo, a.RPS), math.Max(hi, a.RPS)
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	yMin := math.Pow(10, math.Floor(math.Log10(lo)))
	yMax := math.Pow(10, math.Ceil(math.Log10(hi*1.6)))
	plotH := float64(height - top - bottom)
	plotW := float64(width - left - right)
	y := func(v float64) float64 {
		f := (math.Log10(v) - math.Log10(yMin)) / (math.Log10(yMax) - math.Log10(yMin))
		return float64(top) + plotH*(1-f)
	}

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n",
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="24" font-size="16" font-weight="bold">Charges flow: requests/s by concurrency (provider latency 0)</text>`+"\n", left)
	p(`<text x="%d" y="42" font-size="12" fill="#555">median of the rounds, log scale; under each bar (staggered): its ratio to bare in the same round (median)</text>`+"\n", left)

	chartGrid(&b, yMin, yMax, y, left, width-right)
	p(`<text transform="translate(18,%d) rotate(-90)" font-size="12" text-anchor="middle" fill="#333">requests/s</text>`+"\n", top+int(plotH/2))

	groupW := plotW / float64(len(concs))
	barW := groupW * 0.8 / float64(len(variants))
	for gi, conc := range concs {
		gx := float64(left) + groupW*float64(gi) + groupW*0.1
		for vi, v := range variants {
			a, ok := find(aggs, v, conc)
			if !ok || a.RPS <= 0 {
				continue
			}
			x := gx + barW*float64(vi)
			yy := y(a.RPS)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, concurrency %d: %.0f req/s</title></rect>`+"\n",
				x+1, yy, barW-2, float64(top)+plotH-yy, chartColors[v], html.EscapeString(v), conc, a.RPS)
			p(`<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle" fill="#222">%.0f</text>`+"\n", x+barW/2, yy-4, a.RPS)
			if v != vBare && a.Ratio > 0 {
				p(`<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle" fill="#444">%.2f×</text>`+"\n",
					x+barW/2, float64(top)+plotH+13+float64(vi%2)*11, a.Ratio)
			}
		}
		p(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" fill="#333">concurrency %d</text>`+"\n",
			gx+groupW*0.4, float64(top)+plotH+42, conc)
	}
	p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333"/>`+"\n", left, float64(top)+plotH, width-right, float64(top)+plotH)

	// Legend.
	x := float64(left)
	for _, v := range variants {
		p(`<rect x="%.1f" y="%d" width="12" height="12" fill="%s"/>`+"\n", x, height-18, chartColors[v])
		p(`<text x="%.1f" y="%d" font-size="12" fill="#333">%s</text>`+"\n", x+16, height-8, html.EscapeString(v))
		x += 16 + 7*float64(len(v)) + 18
	}
	p("</svg>\n")
	return b.String()
}

// chartGrid draws the grid lines of the y axis, at 1, 2 and 5 × 10^k from yMin to yMax,
// from x1 to x2, with their labels left of x1.
func chartGrid(b *strings.Builder, yMin, yMax float64, y func(float64) float64, left, x2 int) {
	p := printer(b)
	for d := yMin; d <= yMax*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := d * m
			if v > yMax*1.0001 {
				break
			}
			yy := y(v)
			stroke, w := "#e5e5e5", 1.0
			if m == 1 {
				stroke = "#c8c8c8"
			}
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`+"\n", left, yy, x2, yy, stroke, w)
			p(`<text x="%d" y="%.1f" font-size="11" text-anchor="end" fill="#555">%s</text>`+"\n", left-6, yy+4, humanInt(v))
		}
	}
}

func humanInt(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%g", v)
	}
}
