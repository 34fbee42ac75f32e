package main

import (
	"strings"
	"testing"
)

// syntheticReport is a report with two rounds of cells whose figures are known:
// idemflow-pipelined at 0.6× bare and 1.1× recipe-fused-safe's server CPU.
func syntheticReport(pipeCPU float64) *report {
	r := &report{opts: &options{conc: []int{1, 8, 32}, phases: map[string]bool{"rounds": true, "partitions": true}}, figs: &figures{}}
	for round := range 2 {
		for _, c := range []int{1, 8, 32} {
			add := func(v string, rps, cpu, wal, rts, writes float64) {
				r.cells = append(r.cells, cell{Variant: v, Conc: c, Round: round, N: 100, RPS: rps,
					Per: perReq{Statements: 7, RoundTrips: rts, Wire: rts, Writes: writes, Commits: writes + 1, WAL: wal, ServerCPU: cpu, ClientCPU: 0.5, Allocs: 300}})
			}
			add(vBare, 1000, 1, 600, 2, 2)
			add(vSafe, 700, 1, 1700, 3, 2)
			add(vFused, 700, 1, 1500, 3, 2)
			add(vIdemPipe, 600, pipeCPU, 1800, 3, 2)
			add(vReplay, 8000, 0.1, 0, 1, 0)
		}
	}
	return r
}

// line is the budget line whose text starts with prefix.
func line(t *testing.T, r *report, prefix string) budgetLine {
	t.Helper()
	for _, l := range r.budget() {
		if strings.HasPrefix(l.Line, prefix) {
			return l
		}
	}
	t.Fatalf("no budget line %q", prefix)
	return budgetLine{}
}

func TestBudgetJudgesFromTheCells(t *testing.T) {
	r := syntheticReport(1.1)
	for _, c := range []struct {
		prefix    string
		met, none bool
		measured  string
	}{
		{"Pipelined fresh request: server CPU vs recipe-fused-safe", true, false, "c=32: 1.10 ms vs 1.00 ms (1.10×)"},
		{"Pipelined fresh request: WAL vs recipe-fused-safe", true, false, "1800 B vs 1700 B (1.06×)"},
		{"Pipelined fresh throughput at concurrency 32 vs bare", true, false, "0.60×"},
		{"Pipelined fresh throughput at concurrency 32 vs recipe-fused (stretch)", false, false, "0.86×"},
		{"Pipelined fresh charges request: round trips", true, false, "3.00 (tracer)"},
		{"Pipelined fresh charges request: writing commits", true, false, "2.00–2.00"},
		{"Pipelined fresh charges request: statements (tracer) vs recipe-fused-safe", true, false, "c=32: 7.00 vs 7.00 (1.00×)"},
		{"Pipelined fresh request: server + client CPU vs recipe-fused-safe", true, false, "c=32: 1.60 ms vs 1.50 ms (1.07×)"},
		{"Pipelined fresh request: client allocations vs recipe-fused-safe", true, false, "c=8: 300 vs 300 (1.00×)"},
		{"Pipelined fresh throughput at concurrency 8 vs recipe-fused-safe", false, false, "0.86×"},
		{"Go-code fresh request: server + client CPU vs recipe-fused-safe", false, true, ""},
		{"Go-code fresh charges request: round trips (claim known", false, true, ""},
		{"Replay throughput at concurrency 32", true, false, "8.00×"},
		{"Replay: round trips", true, false, "1.00"},
		{"Both shapes measured", false, false, "missing: recipe c=1"},
		{"Go-code fresh throughput at concurrency 32 vs bare", false, true, ""},
		{"Concurrent duplicates: idemflow-pipelined fresh requests while 8 copies", false, true, "part `losers`"},
		{"Partition removal: cleanup WAL per expired key", false, true, "the `partitions` part ran without this figure"},
	} {
		l := line(t, r, c.prefix)
		if l.Met != c.met || l.NotRun != c.none || !strings.Contains(l.Measured, c.measured) {
			t.Errorf("%s: met %t, not run %t, measured %q; want met %t, not run %t, measured containing %q",
				c.prefix, l.Met, l.NotRun, l.Measured, c.met, c.none, c.measured)
		}
	}
}

func TestBudgetVerdictFollowsTheFigure(t *testing.T) {
	// The pipelined variant's server CPU at 1.3× recipe-fused-safe's in one round
	// turns the line to not met.
	r := syntheticReport(1.1)
	r.cells[len(r.cells)-2].Per.ServerCPU = 1.3 // round 2, c=32, idemflow-pipelined
	r.cells[len(r.cells)-7].Per.ServerCPU = 1.3 // round 2, c=8
	r.cells[len(r.cells)-12].Per.ServerCPU = 1.3
	l := line(t, r, "Pipelined fresh request: server CPU vs recipe-fused-safe")
	if l.Met || l.NotRun {
		t.Errorf("server CPU 1.2× recipe-fused-safe's (median of 1.1 and 1.3) judged met: %+v", l)
	}
	// The pipelined variant's 12 statements of before (BEGIN and COMMIT in each phase,
	// the claim's own check) against recipe-fused-safe's 7 turn that line to not met.
	for i := range r.cells {
		if r.cells[i].Variant == vIdemPipe {
			r.cells[i].Per.Statements = 12
		}
	}
	if l := line(t, r, "Pipelined fresh charges request: statements"); l.Met || l.NotRun {
		t.Errorf("12 statements against 7 judged met: %+v", l)
	}
	// A figure a part sets is judged by its check.
	r.figs.set(figPartWALFactor, 120, "120× below")
	r.figs.set(figPartLockWaitsRemove, 2, "2 samples")
	if l := line(t, r, "Partition removal: cleanup WAL per expired key"); !l.Met || l.NotRun || l.Measured != "120× below" {
		t.Errorf("WAL factor 120 against ≥ 100: %+v", l)
	}
	if l := line(t, r, "Partition removal: no live request waits"); l.Met || l.NotRun {
		t.Errorf("2 lock-wait samples against 0: %+v", l)
	}
}

// The refusal lines are judged on the refusals part's figures against 1.5× bare, and
// read "not run" without them.
func TestBudgetJudgesRefusals(t *testing.T) {
	r := syntheticReport(1.1)
	for _, prefix := range []string{"Refusal (a draining engine", "Refusal: server + client CPU", "Refusal (an overloaded engine", "Refusal (overloaded)"} {
		if l := line(t, r, prefix); !l.NotRun || !strings.Contains(l.Measured, "not run in this run (part `refusals`)") {
			t.Fatalf("%s without figures: %+v", prefix, l)
		}
	}
	r.opts.phases["refusals"] = true
	r.figs.set(figRefusalServer, 1.6, "1.6×")
	r.figs.set(figRefusalTotal, 1.4, "1.4×")
	if l := line(t, r, "Refusal (an overloaded engine"); !l.NotRun {
		t.Fatalf("the overloaded engine's line without its figure: %+v", l)
	}
	r.figs.set(figRefusalOverServer, 1.2, "1.2×")
	r.figs.set(figRefusalOverTotal, 1.7, "1.7×")
	if l := line(t, r, "Refusal (an overloaded engine"); l.NotRun || !l.Met {
		t.Fatalf("overloaded server CPU at 1.2× bare: %+v", l)
	}
	if l := line(t, r, "Refusal (overloaded): server + client CPU"); l.NotRun || l.Met {
		t.Fatalf("overloaded server + client CPU at 1.7× bare: %+v", l)
	}
	if l := line(t, r, "Refusal (a draining engine"); l.NotRun || l.Met {
		t.Fatalf("server CPU at 1.6× bare: %+v", l)
	}
	if l := line(t, r, "Refusal: server + client CPU"); l.NotRun || !l.Met {
		t.Fatalf("server + client CPU at 1.4× bare: %+v", l)
	}
}

// The crowd line is judged on the pinned runs' goodput against 0.5× the baseline, and
// reads "not run" without the part.
func TestBudgetJudgesCrowd(t *testing.T) {
	r := syntheticReport(1.1)
	const prefix = "Crowd 4× capacity"
	if l := line(t, r, prefix); !l.NotRun || !strings.Contains(l.Measured, "not run in this run (part `crowd`)") {
		t.Fatalf("without figures: %+v", l)
	}
	r.opts.phases["crowd"] = true
	r.figs.set(figCrowdPinned, 0.45, "0.45×")
	if l := line(t, r, prefix); l.NotRun || l.Met {
		t.Fatalf("goodput at 0.45× the baseline: %+v", l)
	}
	r.figs.set(figCrowdPinned, 0.5, "0.50×")
	if l := line(t, r, prefix); l.NotRun || !l.Met {
		t.Fatalf("goodput at 0.5× the baseline: %+v", l)
	}
}
