package reliability

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// chartSeries is one line of a panel: a samples.csv column, scaled.
type chartSeries struct {
	name, col, color string
	scale            float64
}

type chartPanel struct {
	title  string
	series []chartSeries
}

var slotColors = map[string]string{"srv0": "#1f77b4", "srv1": "#ff7f0e", "sw0": "#2ca02c", "sw1": "#d62728"}

// soakPanels are the chart's panels: live heap, goroutines, the key table, p99.
func soakPanels() []chartPanel {
	var heap, gor []chartSeries
	for _, slot := range soakSlots {
		heap = append(heap, chartSeries{slot, slot + "_heap_live", slotColors[slot], 1.0 / (1 << 20)})
		gor = append(gor, chartSeries{slot, slot + "_goroutines", slotColors[slot], 1})
	}
	return []chartPanel{
		{"live heap after GC (MiB), per process", heap},
		{"goroutines, per process", gor},
		{"idemflow_keys (MiB)", []chartSeries{{"table", "table_bytes", "#1f77b4", 1.0 / (1 << 20)}, {"indexes", "index_bytes", "#9467bd", 1.0 / (1 << 20)}}},
		{"p99 per sample interval (ms)", []chartSeries{{"fresh", "fresh_p99_ms", "#d62728", 1}, {"replay", "replay_p99_ms", "#2ca02c", 1}, {"bare control", "bare_p99_ms", "#7f7f7f", 1}}},
	}
}

// soakChartFile draws the soak's samples over time as an SVG: one panel per
// soakPanels entry, kill windows shaded.
func soakChartFile(samplesPath, killsPath string, cfg soakConfig) (string, error) {
	samples, err := readCSV(samplesPath)
	if err != nil {
		return "", err
	}
	kills, err := readKills(killsPath)
	if err != nil {
		return "", err
	}
	return soakChart(samples, kills, fmt.Sprintf("idemflow soak: %s layout, retention %s, a server SIGKILLed every %s (shaded)", cfg.layoutName(), cfg.retention, cfg.killEvery)), nil
}

func soakChart(samples, kills *csvTable, title string) string {
	const width, panelH, left, right, top, gap = 960, 170, 70, 130, 50, 40
	panels := soakPanels()
	height := top + len(panels)*(panelH+gap) + 10
	end := 1.0
	for i := range samples.rows {
		end = max(end, samples.col(i, "t_s"))
	}
	plotW := float64(width - left - right)
	x := func(ts float64) float64 { return left + ts/end*plotW }
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="24" font-size="15">%s</text>`+"\n", left, title)
	for pi, panel := range panels {
		y0 := float64(top + pi*(panelH+gap) + 20)
		hi := 0.0
		for _, s := range panel.series {
			for i := range samples.rows {
				if v := samples.col(i, s.col) * s.scale; !math.IsNaN(v) {
					hi = max(hi, v)
				}
			}
		}
		hi = niceCeil(hi)
		y := func(v float64) float64 { return y0 + panelH - v/hi*panelH }
		p(`<text x="%d" y="%.0f" font-size="12" font-weight="bold">%s</text>`+"\n", left, y0-6, panel.title)
		for i := range kills.rows {
			from, to := kills.col(i, "from_s"), min(kills.col(i, "to_s"), end)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#eeeeee"/>`+"\n", x(from), y0, max(x(to)-x(from), 1), panelH)
		}
		p(`<rect x="%d" y="%.1f" width="%.0f" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, plotW, panelH)
		for _, f := range []float64{0, 0.5, 1} {
			p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(hi*f)+4, humanFloat(hi*f))
		}
		for si, s := range panel.series {
			var pts []string
			for i := range samples.rows {
				if v := samples.col(i, s.col) * s.scale; !math.IsNaN(v) {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(samples.col(i, "t_s")), y(v)))
				}
			}
			p(`<polyline fill="none" stroke="%s" stroke-width="1.2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
			p(`<text x="%d" y="%.1f" fill="%s">%s</text>`+"\n", width-right+10, y0+14+float64(si)*15, s.color, s.name)
		}
	}
	axisY := top + (len(panels)-1)*(panelH+gap) + 20 + panelH + 16
	for i := 0; i <= 6; i++ {
		ts := end * float64(i) / 6
		label := fmt.Sprintf("%.0f min", ts/60)
		if end < 600 {
			label = fmt.Sprintf("%.0f s", ts)
		}
		p(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(ts), axisY, label)
	}
	p("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func humanFloat(v float64) string {
	if v >= 10 || v == 0 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// TestSoakChart redraws a soak's chart from its files: IDEMFLOW_SOAK_CHART names the
// directory holding samples.csv and kills.csv (a soak's IDEMFLOW_SOAK_OUT); the SVG
// is written to IDEMFLOW_SOAK_CHART_TO (default soak.svg in that directory). Skipped
// without it.
func TestSoakChart(t *testing.T) {
	dir := os.Getenv("IDEMFLOW_SOAK_CHART")
	if dir == "" {
		t.Skip("IDEMFLOW_SOAK_CHART names a soak's output directory")
	}
	samples, err := readCSV(filepath.Join(dir, "samples.csv"))
	require.NoError(t, err)
	kills, err := readKills(filepath.Join(dir, "kills.csv"))
	require.NoError(t, err)
	title := os.Getenv("IDEMFLOW_SOAK_CHART_TITLE")
	if title == "" {
		title = "idemflow soak"
	}
	to := os.Getenv("IDEMFLOW_SOAK_CHART_TO")
	if to == "" {
		to = filepath.Join(dir, "soak.svg")
	}
	require.NoError(t, os.WriteFile(to, []byte(soakChart(samples, kills, title)), 0o644))
	t.Logf("wrote %s from %d samples", to, len(samples.rows))
}
