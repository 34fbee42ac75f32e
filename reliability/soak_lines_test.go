package reliability

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strconv"
	"testing"
	"time"
)

// passLine is one of the soak's pass lines: a measured value against its limit.
type passLine struct {
	Name     string
	Value    float64
	Limit    float64
	Enforced bool // the quick tier enforces only what does not depend on time
}

func (l passLine) pass() bool { return l.Value <= l.Limit }

func (l passLine) String() string {
	verdict := "PASS"
	if !l.pass() {
		verdict = "FAIL"
	}
	if !l.Enforced {
		verdict += " (reported, not enforced in this tier)"
	}
	return fmt.Sprintf("%s = %.3f (limit %.2f): %s", l.Name, l.Value, l.Limit, verdict)
}

// soakLines are a run's pass lines, computed from its files.
type soakLines struct{ all []passLine }

// enforce fails t for every enforced line that is not met.
func (s *soakLines) enforce(t testing.TB) {
	t.Helper()
	for _, l := range s.all {
		if l.Enforced && !l.pass() {
			t.Errorf("soak pass line not met: %s", l)
		}
	}
}

// csvTable is a CSV file with a header: its columns by name, as numbers (NaN when
// empty or not a number).
type csvTable struct {
	cols map[string]int
	rows [][]float64
	text [][]string
}

func readCSV(path string) (*csvTable, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	t := &csvTable{cols: map[string]int{}}
	for i, c := range recs[0] {
		t.cols[c] = i
	}
	for _, r := range recs[1:] {
		row := make([]float64, len(r))
		for i, v := range r {
			row[i], err = strconv.ParseFloat(v, 64)
			if err != nil {
				row[i] = math.NaN()
			}
		}
		t.rows = append(t.rows, row)
		t.text = append(t.text, r)
	}
	return t, nil
}

// readKills reads kills.csv; a run stopped before its first kill has none.
func readKills(path string) (*csvTable, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return &csvTable{cols: map[string]int{"from_s": 0, "to_s": 1}}, nil
	}
	return readCSV(path)
}

// col returns column name of row i (NaN if there is no such column).
func (t *csvTable) col(i int, name string) float64 {
	c, ok := t.cols[name]
	if !ok || c >= len(t.rows[i]) {
		return math.NaN()
	}
	return t.rows[i][c]
}

// between returns the values of column name in rows whose t_s is in [from, to).
func (t *csvTable) between(name string, from, to float64) []float64 {
	var out []float64
	for i := range t.rows {
		if ts := t.col(i, "t_s"); ts >= from && ts < to {
			if v := t.col(i, name); !math.IsNaN(v) {
				out = append(out, v)
			}
		}
	}
	return out
}

// computeSoakLines reads the soak's files and computes its pass lines.
func computeSoakLines(cfg soakConfig, samplesPath, latenciesPath, killsPath string) (*soakLines, error) {
	samples, err := readCSV(samplesPath)
	if err != nil {
		return nil, err
	}
	if len(samples.rows) < 8 {
		return nil, fmt.Errorf("%s: %d samples, too few for quarters", samplesPath, len(samples.rows))
	}
	end := samples.col(len(samples.rows)-1, "t_s")
	out := &soakLines{}
	quarterRatio := func(name string, values func(from, to float64) []float64) passLine {
		q2, q4 := quantile(values(end/4, end/2), 0.5), quantile(values(3*end/4, end+1), 0.5)
		return passLine{Name: name, Value: q4 / q2, Limit: 1.1, Enforced: cfg.full}
	}
	for _, slot := range soakSlots {
		for _, m := range []string{"heap_live", "goroutines"} {
			col := slot + "_" + m
			out.all = append(out.all, quarterRatio("median "+col+" last quarter / second quarter",
				func(from, to float64) []float64 { return samples.between(col, from, to) }))
		}
	}
	size := func(from, to float64) []float64 {
		tb, ib := samples.between("table_bytes", from, to), samples.between("index_bytes", from, to)
		for i := range min(len(tb), len(ib)) {
			tb[i] += ib[i]
		}
		return tb[:min(len(tb), len(ib))]
	}
	out.all = append(out.all, quarterRatio("median key table+index bytes last quarter / second quarter", size))
	out.all = append(out.all, rowBound(cfg, samples), outboxLine(cfg, samples, end))
	lats, err := readCSV(latenciesPath)
	if err != nil {
		return nil, err
	}
	kills, err := readKills(killsPath)
	if err != nil {
		return nil, err
	}
	first := [2]float64{cfg.warmup.Seconds(), (cfg.warmup + cfg.window).Seconds()}
	last := [2]float64{end - cfg.window.Seconds(), end + 1}
	for _, kind := range []string{"fresh", "replay"} {
		r1, r2 := p99Ratio(lats, kills, kind, first), p99Ratio(lats, kills, kind, last)
		out.all = append(out.all, passLine{
			Name:  fmt.Sprintf("p99 %s/bare last %s (%.2f) / first %s after warm-up (%.2f), kill windows excluded", kind, cfg.window, r2, cfg.window, r1),
			Value: r2 / r1, Limit: 1.2, Enforced: cfg.full,
		})
	}
	return out, nil
}

// rowBound is the key table's row count against what the retention window holds: at
// every sample after retention+slack, the rows are at most the keys submitted in the
// last retention+slack (from the sample at or before that cutoff). Its value is the
// largest ratio. On the partitioned layout a key also goes with its partition, once
// the partition's upper bound is retention old: a key created at its partition's lower
// bound stays up to one width longer, so the window is retention+width+slack (the
// batched deletes still remove finished keys retention after they finished, sooner).
func rowBound(cfg soakConfig, samples *csvTable) passLine {
	span := (cfg.retention + cfg.width + cfg.slack).Seconds()
	what := fmt.Sprintf("retention+%s", cfg.slack.Round(time.Second))
	if cfg.width > 0 {
		what = fmt.Sprintf("retention+partition width %s+%s", cfg.width, cfg.slack.Round(time.Second))
	}
	worst, n := 0.0, 0
	for i := range samples.rows {
		ts, rows := samples.col(i, "t_s"), samples.col(i, "key_rows")
		if ts < span || math.IsNaN(rows) {
			continue
		}
		before := 0.0
		for j := range samples.rows {
			if samples.col(j, "t_s") <= ts-span {
				before = samples.col(j, "submitted")
			}
		}
		window := samples.col(i, "submitted") - before
		worst = max(worst, rows/max(window, 1))
		n++
	}
	return passLine{
		Name:  fmt.Sprintf("key rows / keys submitted in the last %s (worst of %d samples)", what, n),
		Value: worst, Limit: 1, Enforced: n > 0,
	}
}

// p99Ratio is the p99 of kind's requests that began in w, outside every kill window,
// over the bare control's in the same span.
func p99Ratio(lats, kills *csvTable, kind string, w [2]float64) float64 {
	var ours, bare []float64
	for i := range lats.rows {
		at := lats.col(i, "t_ms") / 1000
		if at < w[0] || at >= w[1] || inKill(kills, at) {
			continue
		}
		ms := lats.col(i, "us") / 1000
		switch lats.text[i][lats.cols["kind"]] {
		case kind:
			ours = append(ours, ms)
		case "bare":
			bare = append(bare, ms)
		}
	}
	return quantile(ours, 0.99) / quantile(bare, 0.99)
}

func inKill(kills *csvTable, at float64) bool {
	for i := range kills.rows {
		if at >= kills.col(i, "from_s") && at < kills.col(i, "to_s") {
			return true
		}
	}
	return false
}
