package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// The budget table: each line is declared as data (checks), with where it comes from,
// what it reads, its target and the figure it is judged on. A figure is computed from
// this run's data only; a line whose part did not run says so and is judged neither
// met nor not met.

// check is one budget line.
type check struct {
	src    string // DESIGN.md, an issue, or "standing" (a line the bench has carried since before)
	line   string
	target string
	part   string // the part (-phases) that measures it
	fig    func(r *report) figure
	want   want
}

// figure is what a check is judged on.
type figure struct {
	ok     bool    // measured in this run
	val    float64 // judged by want; for exactly, lo and hi are
	lo, hi float64
	text   string // how it reads in the table
	note   string
}

// want is a target: val op x (exactly: lo and hi within 0.05 of x).
type want struct {
	op string // "≥", "≤", "=", or "" (reported, not judged)
	x  float64
}

func atLeast(x float64) want { return want{"≥", x} }
func atMost(x float64) want  { return want{"≤", x} }
func exactly(x float64) want { return want{"=", x} }

func (w want) met(f figure) bool {
	switch w.op {
	case "≥":
		return f.val >= w.x
	case "≤":
		return f.val <= w.x
	case "=":
		return f.lo > w.x-0.05 && f.hi < w.x+0.05
	}
	return true
}

// budgetLine is one rendered line of the table.
type budgetLine struct {
	Source   string
	Line     string
	Target   string
	Measured string
	Met      bool
	NotRun   bool // the part that measures it did not run: neither met nor not met
	Note     string
}

func (l budgetLine) verdict() string {
	v := mark(l.Met)
	if l.NotRun {
		v = "not measured"
	}
	if l.Note != "" {
		v += "; " + l.Note
	}
	return v
}

func mark(met bool) string {
	if met {
		return "met"
	}
	return "**not met**"
}

// budget judges every check, in the order of the table, then the lines that parts of
// the run judge themselves (growth.go).
func (r *report) budget() []budgetLine {
	var out []budgetLine
	for _, c := range r.checks() {
		f := c.fig(r)
		l := budgetLine{Source: c.src, Line: c.line, Target: c.target, Measured: f.text, Note: f.note}
		if f.ok {
			l.Met = c.want.met(f)
		} else {
			l.NotRun = true
			switch {
			case l.Measured != "":
			case r.opts.phases[c.part]:
				l.Measured = fmt.Sprintf("not measured: the `%s` part ran without this figure", c.part)
			default:
				l.Measured = fmt.Sprintf("not run in this run (part `%s`)", c.part)
			}
		}
		out = append(out, l)
	}
	for _, l := range r.growthLines() {
		if l.Source == "" {
			l.Source = "DESIGN.md"
		}
		out = append(out, l)
	}
	return out
}

// checks are the budget's lines for this run's concurrencies. top is the largest.
func (r *report) checks() []check {
	top := slices.Max(r.opts.conc)
	var cs []check
	for _, c := range r.opts.conc {
		cs = append(cs, check{"standing", fmt.Sprintf("Go-code fresh throughput at concurrency %d vs recipe-fused", c), "≥ 1× recipe-fused",
			"rounds", rpsVs(vIdem, vFused, c), atLeast(1)})
	}
	at := func(s string) string { return fmt.Sprintf(s, top) }
	cs = append(cs, []check{
		{"standing", "Go-code fresh request: server + client CPU vs recipe-fused", "≤ recipe-fused's, at every concurrency", "rounds",
			perReqVs(vIdem, vFused, cpuTotal), atMost(1)},
		{"standing", at("Go-code fresh throughput at concurrency %d vs bare"), "≥ 0.5× bare", "rounds", rpsVs(vIdem, vBare, top), atLeast(0.5)},
		{"standing", at("Go-code fresh throughput at concurrency %d vs bare (stretch)"), "≥ 0.6× bare", "rounds", rpsVs(vIdem, vBare, top), atLeast(0.6)},
		{"issue 26", at("Go-code fresh throughput at concurrency %d vs bare"), "≥ 0.45× bare", "rounds", rpsVs(vIdem, vBare, top), atLeast(0.45)},
		{"standing", "Go-code fresh charges request: round trips", "≤ 5", "rounds", roundTrips(vIdem), atMost(5.05)},
		{"DESIGN.md", "Go-code fresh charges request: writing commits", "2 (one per tx phase)", "rounds", writingCommits(vIdem), exactly(2)},
		{"issue 26", "Pipelined fresh charges request: round trips (default exec mode, warm cache)", "3", "rounds", roundTrips(vIdemPipe), exactly(3)},
		{"issue 26", "Pipelined fresh charges request: writing commits", "2 (one per tx phase)", "rounds", writingCommits(vIdemPipe), exactly(2)},
		{"issue 26", "Pipelined fresh charges request: statements (tracer) vs recipe-fused-safe", "≤ recipe-fused-safe's (7: no BEGIN or COMMIT in a one-round-trip phase, the claim's insert its check)", "rounds",
			perReqVs(vIdemPipe, vSafe, stmtCount), atMost(1)},
		{"issue 26", "Pipelined fresh request: server CPU vs recipe-fused-safe", "≤ 1.15× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdemPipe, vSafe, cpuServer), atMost(1.15)},
		{"issue 26", "Pipelined fresh request: WAL vs recipe-fused-safe", "≤ 1.15× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdemPipe, vSafe, walBytes), atMost(1.15)},
		{"issue 26", at("Pipelined fresh throughput at concurrency %d vs bare"), "≥ 0.55× bare", "rounds", rpsVs(vIdemPipe, vBare, top), atLeast(0.55)},
		{"issue 26", at("Pipelined fresh throughput at concurrency %d vs recipe-fused (stretch)"), "≥ 1.0× recipe-fused", "rounds",
			rpsVs(vIdemPipe, vFused, top), atLeast(1)},
		{"issue 39", "Go-code fresh charges request: round trips (claim known before user code, replay in one round trip)", "≤ 4", "rounds", roundTrips(vIdem), atMost(4.05)},
		{"issue 39", "Go-code fresh request: server + client CPU vs recipe-fused-safe", "≤ 1.3× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdem, vSafe, cpuTotal), atMost(1.3)},
		{"issue 39", "Pipelined fresh request: server + client CPU vs recipe-fused-safe", "≤ 1.10× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdemPipe, vSafe, cpuTotal), atMost(1.10)},
		{"issue 39", "Pipelined fresh request: client allocations vs recipe-fused-safe", "≤ 1.5× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdemPipe, vSafe, allocCount), atMost(1.5)},
		{"issue 26", "Both shapes measured beside bare, recipe, recipe-fused and recipe-fused-safe", "concurrency 1, 8 and 32, ≥ 5 paired interleaved rounds, CPU (server and client) and allocations per request in every cell", "rounds",
			coverage, atLeast(5)},
		{"DESIGN.md", "Replay: round trips", "1", "rounds", roundTrips(vReplay), exactly(1)},
		{"DESIGN.md", "Replay: no write", "0 writing transactions", "rounds", replayWrites, atMost(0.005)},
		{"issue 26", at("Replay throughput at concurrency %d"), "≥ 7× bare", "rounds", rpsVs(vReplay, vBare, top), atLeast(7)},
		{"DESIGN.md", "Losing copy, Go-code flow (claim held elsewhere): no write", "0 writing transactions", "rounds", noWrites(vIdemLoser), atMost(0.005)},
		{"DESIGN.md", "Losing copy, pipelined flow (claim held elsewhere): no write", "0 writing transactions", "rounds", noWrites(vPipeLoser), atMost(0.005)},
		{"standing", "Losing copy, Go-code flow: round trips (look-up; BEGIN, claim lock, look-up; ROLLBACK)", "3", "rounds", roundTrips(vIdemLoser), exactly(3)},
		{"standing", "Losing copy, pipelined flow: round trips (look-up; the raised claim batch)", "≤ 3 on the wire: the copy's 2, and the re-prepare of the raised batch's statements that the next request on its connection pays", "rounds", roundTrips(vPipeLoser), atMost(3.05)},
		{"issue 39", "What users run, measured in the rounds: both shapes, the replay, both losing copies", "concurrency 1, 8 and 32, ≥ 5 interleaved rounds, CPU (server and client), allocations and round trips in every cell (WAL beside them)", "rounds",
			coverageOf(usersRun), atLeast(5)},
		{"standing", "recipe-fused: same effects", "one charge and one provider payment per key", "rounds", fusedEffects(vFused), atMost(0)},
		{"standing", "recipe-fused-safe: same effects", "one charge and one provider payment per key", "rounds", fusedEffects(vSafe), atMost(0)},
	}...)
	for _, c := range r.opts.conc {
		cs = append(cs, check{"issue 39", fmt.Sprintf("Pipelined fresh throughput at concurrency %d vs recipe-fused-safe", c), "≥ 0.95× recipe-fused-safe (stretch: ≥ 1.0×)",
			"rounds", rpsVs(vIdemPipe, vSafe, c), atLeast(0.95)})
	}
	cs = append(cs, r.historyOmitChecks()...)
	cs = append(cs, dupChecks...)
	for _, v := range []string{vIdemPipe, vIdem, vSafe} {
		for _, k := range loserCopies {
			cs = append(cs, check{"issue 26", fmt.Sprintf("Concurrent duplicates: %s fresh requests while %d copies per key lose on the same pool", v, k),
				"≥ 0.90× fresh req/s without copies", "losers", loserVs(v, k), atLeast(0.9)})
		}
	}
	cs = append(cs, check{"DESIGN.md", "Only losers raise: pipelined fresh requests alone roll nothing back", "0 rollbacks per fresh request",
		"losers", freshRollbacks(vIdemPipe), atMost(0.005)})
	cs = append(cs, slowChecks(r.opts.slowLatency)...)
	cs = append(cs, sweeperChecks(r.opts.sweepConc)...)
	cs = append(cs, refusalChecks...)
	cs = append(cs, crowdChecks...)
	return append(cs, partitionChecks...)
}

// historyOmitChecks are issue 39's lines for the pipelined flow with
// Config.HistoryOmitCleanFinish (-history-omit-clean): the history entry a clean finish
// stores is the WAL line's gap (docs/BENCHMARKS.md). None without the flag.
func (r *report) historyOmitChecks() []check {
	if !r.opts.historyOmit {
		return nil
	}
	const omit = "Pipelined fresh request, HistoryOmitCleanFinish: "
	cs := []check{
		{"issue 39", omit + "WAL vs recipe-fused-safe", "≤ 1.15× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdemPipeOmit, vSafe, walBytes), atMost(1.15)},
		{"issue 39", omit + "server + client CPU vs recipe-fused-safe", "≤ 1.10× recipe-fused-safe's, at every concurrency", "rounds",
			perReqVs(vIdemPipeOmit, vSafe, cpuTotal), atMost(1.10)},
		{"issue 39", omit + "round trips", "3", "rounds", roundTrips(vIdemPipeOmit), exactly(3)},
	}
	for _, c := range r.opts.conc {
		cs = append(cs, check{"issue 39", fmt.Sprintf(omit+"throughput at concurrency %d vs recipe-fused-safe", c), "≥ 0.95× recipe-fused-safe (stretch: ≥ 1.0×)",
			"rounds", rpsVs(vIdemPipeOmit, vSafe, c), atLeast(0.95)})
	}
	return cs
}

// perReqField is one per-request column, named.
type perReqField struct {
	name, format string // format prints one value with its unit
	f            func(perReq) float64
}

var (
	cpuServer  = perReqField{"server CPU", "%.2f ms", func(p perReq) float64 { return p.ServerCPU }}
	cpuTotal   = perReqField{"server + client CPU", "%.2f ms", func(p perReq) float64 { return p.ServerCPU + p.ClientCPU }}
	walBytes   = perReqField{"WAL", "%.0f B", func(p perReq) float64 { return p.WAL }}
	stmtCount  = perReqField{"statements", "%.2f", func(p perReq) float64 { return p.Statements }}
	allocCount = perReqField{"client allocations", "%.0f", func(p perReq) float64 { return p.Allocs }}
)

// rpsVs: the median over rounds of v's req/s ÷ ref's in the same round, at conc.
func rpsVs(v, ref string, conc int) func(*report) figure {
	return func(r *report) figure {
		med, lo, hi, ok := roundRatio(r.cells, v, ref, conc)
		return figure{ok: ok, val: med, lo: lo, hi: hi, text: fmt.Sprintf("%.2f× (rounds: %.2f–%.2f×)", med, lo, hi)}
	}
}

// perReqVs: v's per-request field ÷ ref's (medians over rounds) at every concurrency;
// judged on the largest ratio.
func perReqVs(v, ref string, fd perReqField) func(*report) figure {
	return func(r *report) figure {
		aggs := aggregate(r.cells)
		f := figure{val: math.Inf(-1)}
		var cols []string
		for _, c := range r.opts.conc {
			a, ok1 := find(aggs, v, c)
			b, ok2 := find(aggs, ref, c)
			x, y := fd.f(a.Per), fd.f(b.Per)
			if !ok1 || !ok2 || math.IsNaN(x) || math.IsNaN(y) || y <= 0 {
				continue
			}
			f.ok = true
			f.val = max(f.val, x/y)
			cols = append(cols, fmt.Sprintf("c=%d: "+fd.format+" vs "+fd.format+" (%.2f×)", c, x, y, x/y))
		}
		f.text = strings.Join(cols, "; ")
		if !f.ok {
			f.text = fmt.Sprintf("not measured (%s of %s or %s missing)", fd.name, v, ref)
		}
		return f
	}
}

// roundTrips: v's round trips per request, the larger of the tracer's and the wire's,
// at the concurrency where it is largest.
func roundTrips(v string) func(*report) figure {
	return func(r *report) figure {
		var rts, wire []float64
		for _, a := range aggregate(r.cells) {
			if a.Variant == v {
				rts, wire = append(rts, a.Per.RoundTrips), append(wire, a.Per.Wire)
			}
		}
		if len(rts) == 0 {
			return figure{}
		}
		lo, hi := min(slices.Min(rts), slices.Min(wire)), max(slices.Max(rts), slices.Max(wire))
		return figure{ok: true, val: hi, lo: lo, hi: hi,
			text: fmt.Sprintf("%.2f (tracer), %.2f (wire), the most at any concurrency", slices.Max(rts), slices.Max(wire))}
	}
}

// writingCommits: v's writing transactions per request over the concurrencies.
func writingCommits(v string) func(*report) figure {
	return func(r *report) figure {
		var writes, commits []float64
		for _, a := range aggregate(r.cells) {
			if a.Variant == v {
				writes, commits = append(writes, a.Per.Writes), append(commits, a.Per.Commits)
			}
		}
		if len(writes) == 0 {
			return figure{}
		}
		lo, hi := slices.Min(writes), slices.Max(writes)
		return figure{ok: true, val: hi, lo: lo, hi: hi,
			text: fmt.Sprintf("%.2f–%.2f writing transactions per request (%.2f–%.2f commits counting read-only ones)",
				lo, hi, slices.Min(commits), slices.Max(commits))}
	}
}

func replayWrites(r *report) figure { return noWrites(vReplay)(r) }

// noWrites: the most writing transactions per request of v at any concurrency.
func noWrites(v string) func(*report) figure {
	return func(r *report) figure {
		f := writingCommits(v)(r)
		if f.ok {
			f.text = fmt.Sprintf("%.3f writing transactions per request, the most at any concurrency", f.hi)
		}
		return f
	}
}

// coverageVariants and coverageConcs are what issue 26 asks the rounds to measure.
var (
	coverageVariants = []string{vBare, vRecipe, vFused, vSafe, vIdem, vIdemPipe}
	coverageConcs    = []int{1, 8, 32}
)

// coverage: the fewest rounds any cell issue 26 asks for has with its CPU columns and
// allocations measured (0 when a cell is missing).
func coverage(r *report) figure { return coverageOf(coverageVariants)(r) }

// usersRun are what users run, each measured in the rounds (issue 39 item 4): both
// phase shapes, the replay and the losing copy of each shape. The refusal is measured
// in its own part (refusalChecks).
var usersRun = []string{vIdem, vIdemPipe, vReplay, vIdemLoser, vPipeLoser}

// coverageOf: the fewest rounds any cell of variants at coverageConcs has with its
// CPU columns, allocations and round trips measured (0 when a cell is missing).
func coverageOf(variants []string) func(*report) figure {
	return func(r *report) figure {
		if len(r.cells) == 0 {
			return figure{}
		}
		least := math.MaxInt
		var missing []string
		for _, v := range variants {
			for _, c := range coverageConcs {
				n := 0
				for _, x := range r.cells {
					if x.Variant == v && x.Conc == c && !math.IsNaN(x.Per.ServerCPU) && x.Per.ClientCPU > 0 && x.Per.Allocs > 0 && x.Per.RoundTrips > 0 {
						n++
					}
				}
				if n == 0 {
					missing = append(missing, fmt.Sprintf("%s c=%d", v, c))
				}
				least = min(least, n)
			}
		}
		text := fmt.Sprintf("%d variants × concurrency %s: at least %d rounds per cell with server and client CPU, allocations and round trips measured",
			len(variants), joinInts(coverageConcs), least)
		if len(missing) > 0 {
			text += "; missing: " + strings.Join(missing, ", ")
		}
		return figure{ok: true, val: float64(least), text: text}
	}
}

// fusedEffects: keys of a fused recipe whose effects were not exactly once.
func fusedEffects(v string) func(*report) figure {
	return func(r *report) figure {
		f := r.fused
		if v == vSafe {
			f = r.fusedSafe
		}
		if f == nil || f.Keys == 0 {
			return figure{}
		}
		bad := (f.Keys - f.Finished) + (f.Keys - f.Charges) + (f.Keys - f.Linked) + (f.Keys - f.ProviderKeys) + f.ProviderTwice
		return figure{ok: true, val: float64(bad),
			text: fmt.Sprintf("%d keys finished of %d; %d charges, %d succeeded and named by their key; %d derived keys at the provider, %d not called exactly once",
				f.Finished, f.Keys, f.Charges, f.Linked, f.ProviderKeys, f.ProviderTwice)}
	}
}

// loserVs: fresh req/s with k copies per key losing ÷ without, median over rounds.
func loserVs(v string, k int) func(*report) figure {
	return func(r *report) figure {
		if r.losers == nil {
			return figure{}
		}
		med, lo, hi, ok := r.losers.loserRatio(v, k)
		return figure{ok: ok, val: med, text: fmt.Sprintf("%.2f× (rounds: %.2f–%.2f×; a burst every %s)", med, lo, hi, r.opts.loserGap)}
	}
}

// freshRollbacks: v's rollbacks per fresh request in the losers part's cells without
// copies (pg_stat_database's xact_rollback; a batch that raises is one), the most in
// any round.
func freshRollbacks(v string) func(*report) figure {
	return func(r *report) figure {
		if r.losers == nil {
			return figure{}
		}
		f := figure{val: math.Inf(-1)}
		for _, c := range r.losers.Cells {
			if c.Variant == v && c.Copies == 0 {
				f.ok, f.val = true, max(f.val, c.Rollbacks)
			}
		}
		f.text = fmt.Sprintf("%.3f rollbacks per fresh request, the most in any round", f.val)
		return f
	}
}

// dupChecks are the concurrent duplicates' lines (dup.go measures them).
var dupChecks = []check{
	{"standing", fmt.Sprintf("Concurrent duplicates: %d sent while the first attempt's first tx phase is running", dupCount), "all 409, each within 50 ms", "dups",
		func(r *report) figure { return r.dupFigure(dupAnswers) }, atMost(0)},
	{"standing", "Concurrent duplicates: losers run nothing", "phase function run once", "dups",
		func(r *report) figure { return r.dupFigure(dupEntries) }, exactly(1)},
	{"standing", "Concurrent duplicates: no duplicate holds a connection while the owner works", "none held over 50 ms", "dups",
		func(r *report) figure { return r.dupFigure(dupHeld) }, atMost(50)},
	{"standing", "Concurrent duplicates: an unrelated request of another scope is not slowed", "slowest within 50 ms of the slowest without duplicates", "dups",
		func(r *report) figure { return r.dupFigure(dupSlowed) }, atMost(50)},
}

// slowChecks are the slow provider's lines: no connection held across a call.
func slowChecks(lat time.Duration) []check {
	return []check{
		{"DESIGN.md", fmt.Sprintf("%s provider: no connection idle in transaction during the call", lat), "none", "slow", slowIdle, atMost(0)},
		{"standing", fmt.Sprintf("%s provider: pool connections in use", lat), "≤ requests in tx phases", "slow", slowOverUse, atMost(0)},
	}
}

// sweeperChecks are the sweeper drain's lines.
func sweeperChecks(conc int) []check {
	return []check{
		{"standing", "Sweeper: one sweeper's drain rate", fmt.Sprintf("≥ 0.5× Go-code fresh req/s at concurrency %d", conc), "drain", drainRate, atLeast(0.5)},
		{"standing", "Sweeper: more processes vs 1", "not slower (≥ 0.95×: the run-to-run noise of one drain on 2 cores)", "drain", drainScale, atLeast(0.95)},
		{"standing", "Sweeper: no key driven twice", "0", "drain", drainProblems, atMost(0)},
		{"standing", "Retention cleanup running: live p99", "≤ 1.25× p99 without cleanup", "retention", retentionP99, atMost(1.25)},
		{"DESIGN.md", "Retention cleanup never blocks live traffic", "no live request waiting on a row or table lock", "retention", retentionWaits, atMost(0)},
	}
}

// slowIdle: idle-in-transaction backends and connections held by a request in its call
// phase, for the engine's variants.
func slowIdle(r *report) figure {
	if len(r.activity) == 0 {
		return figure{}
	}
	var held, idle int
	var idleMax time.Duration
	var control *activity
	for i, a := range r.activity {
		switch a.Variant {
		case vControl:
			control = &r.activity[i]
		case vIdem, vIdemPipe:
			held += a.HeldInCall + a.CallHolding
			idle += a.IdleTxInCall
			idleMax = max(idleMax, a.IdleTxMax)
		}
	}
	f := figure{ok: true, val: float64(held + idle),
		text: fmt.Sprintf("%d idle-in-transaction backends held by a request in its call phase (pg_stat_activity every 2 ms); %d connections held in a call phase (exact); longest idle in transaction between a tx phase's own statements: %.2f ms",
			idle, held, ms(idleMax))}
	if control != nil {
		f.note = fmt.Sprintf("the control that holds a transaction across the call shows %d idle-in-transaction backends held by a request in its call, up to %.1f ms",
			control.IdleTxInCall, ms(control.IdleTxMax))
	}
	return f
}

// slowOverUse: pool acquisitions above the requests outside a call phase.
func slowOverUse(r *report) figure {
	if len(r.activity) == 0 {
		return figure{}
	}
	var over, inUse int
	for _, a := range r.activity {
		if a.Variant == vIdem || a.Variant == vIdemPipe {
			over += a.OverUse
			inUse = max(inUse, a.MaxInUse)
		}
	}
	return figure{ok: true, val: float64(over),
		text: fmt.Sprintf("%d acquisitions above the requests outside a call phase; at most %d in use at concurrency %d", over, inUse, slices.Max(r.opts.conc)),
		note: "requests outside a call phase = in the look-up or a tx phase"}
}

// drainRate: one sweeper's keys/s ÷ Go-code fresh req/s at the sweeper's concurrency.
func drainRate(r *report) figure {
	if len(r.drains) == 0 {
		return figure{}
	}
	one := r.drains[0]
	a, ok := find(aggregate(r.cells), vIdem, r.opts.sweepConc)
	if !ok {
		return figure{text: fmt.Sprintf("%.0f keys/s; no fresh cell at concurrency %d to compare with", one.KeysPerSec, r.opts.sweepConc)}
	}
	x := one.KeysPerSec / a.RPS
	return figure{ok: true, val: x, text: fmt.Sprintf("%.0f keys/s = %.2f× (fresh: %.0f req/s)", one.KeysPerSec, x, a.RPS)}
}

// drainScale: several sweeper processes' keys/s ÷ one's.
func drainScale(r *report) figure {
	if len(r.drains) < 2 {
		return figure{}
	}
	one, many := r.drains[0], r.drains[1]
	x := many.KeysPerSec / one.KeysPerSec
	return figure{ok: true, val: x, text: fmt.Sprintf("%d processes: %.0f vs %.0f keys/s (%.2f×)", many.Procs, many.KeysPerSec, one.KeysPerSec, x)}
}

// drainProblems: keys driven twice or left wrong by the drains.
func drainProblems(r *report) figure {
	if len(r.drains) == 0 {
		return figure{}
	}
	n := 0
	for _, d := range r.drains {
		n += len(d.Problems)
	}
	return figure{ok: true, val: float64(n), text: fmt.Sprintf("%d problems: one charge per key, one provider request and payment per derived key", n)}
}

// retentionP99: live p99 while the cleanup runs ÷ without it.
func retentionP99(r *report) figure {
	rt := r.retention
	if rt == nil {
		return figure{}
	}
	x := ms(rt.During.P99) / ms(rt.NoCleanupP99)
	return figure{ok: true, val: x,
		text: fmt.Sprintf("%.2f ms vs %.2f ms = %.2f× (without: the windows before and after the cleanup together; before alone %.2f ms, after alone %.2f ms)",
			ms(rt.During.P99), ms(rt.NoCleanupP99), x, ms(rt.Base.P99), ms(rt.After.P99))}
}

// retentionWaits: live backends seen waiting on a row or table lock during the cleanup.
func retentionWaits(r *report) figure {
	rt := r.retention
	if rt == nil {
		return figure{}
	}
	return figure{ok: true, val: float64(rt.During.LockWaits),
		text: fmt.Sprintf("%d live backends seen waiting on a row or table lock in %d samples during the cleanup (all lock waits seen, any backend, relation extension included: %s; before the cleanup: %s)",
			rt.During.LockWaits, rt.During.Samples, fmtWaits(rt.During.Waits), fmtWaits(rt.Base.Waits))}
}

// figures are what parts of the run hand the report: figures by id, for the checks that
// read them (partitionChecks), each set from the part's own measurements with set (a
// figure never set reads "not measured"). Safe for concurrent use.
type figures struct {
	mu sync.Mutex
	m  map[string]figure
}

// set records figure id: val is what the check's target judges, text how it reads (the
// value with its context: sides, counts, rounds).
func (fs *figures) set(id string, val float64, text string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[string]figure{}
	}
	fs.m[id] = figure{ok: true, val: val, lo: val, hi: val, text: text}
}

// text is how figure id reads ("" when it was not set).
func (fs *figures) text(id string) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.m[id].text
}

// read is the check's figure function for id.
func read(id string) func(*report) figure {
	return func(r *report) figure {
		if r.figs == nil {
			return figure{}
		}
		r.figs.mu.Lock()
		defer r.figs.mu.Unlock()
		return r.figs.m[id]
	}
}

// The partitions part's figures (issue 28), set by partitions.go.
const (
	// figPartFresh: fresh p50 on the day-partitioned key table holding the retained keys
	// ÷ on an empty plain key table, median over rounds of the per-round ratio.
	figPartFresh = "partitions.retained.fresh"
	// figPartReplay: the same for replays.
	figPartReplay = "partitions.retained.replay"
	// figChosenFresh: fresh p50 on the chosen partitioned layout (week partitions)
	// holding the partitions part's keys over 30 days ÷ the plain table holding the
	// same keys, the median of the rounds' ratios (issue 40 item 1).
	figChosenFresh = "partitions.chosen.fresh"
	// figChosenReplay: the same for replays of keys finished within the last minute.
	figChosenReplay = "partitions.chosen.replay"
	// figPartCleanupP99: live p99 while partitions are removed ÷ live p99 without.
	figPartCleanupP99 = "partitions.cleanup.p99"
	// figPartWALFactor: batched deletes' cleanup WAL per expired key ÷ partition
	// removal's.
	figPartWALFactor = "partitions.cleanup.walfactor"
	// figPartLockWaitsCreate and figPartLockWaitsRemove: samples in which a live request
	// waited on a lock while partitions were created (and attached) / removed (detached
	// and dropped).
	figPartLockWaitsCreate = "partitions.locks.create"
	figPartLockWaitsRemove = "partitions.locks.remove"
)

// partitionChecks are issue 28's targets.
var partitionChecks = []check{
	{"issue 28", "Partitioned key table, retained keys: fresh p50 vs an empty table", "≤ 1.2×", "partitions", read(figPartFresh), atMost(1.2)},
	{"issue 28", "Partitioned key table, retained keys: replay p50 vs an empty table", "≤ 1.5×", "partitions", read(figPartReplay), atMost(1.5)},
	{"issue 40", "Chosen partitioned layout (week partitions, 30-day retention): fresh p50 vs the plain table with the same keys", "≤ 1.15×", "partitions", read(figChosenFresh), atMost(1.15)},
	{"issue 40", "Chosen partitioned layout (week partitions, 30-day retention): replay p50 vs the plain table with the same keys", "≤ 1.3×", "partitions", read(figChosenReplay), atMost(1.3)},
	{"issue 28", "Partition removal running: live p99", "≤ 1.05× p99 without it", "partitions", read(figPartCleanupP99), atMost(1.05)},
	{"issue 28", "Partition removal: cleanup WAL per expired key vs batched deletes", "≥ 100× below", "partitions", read(figPartWALFactor), atLeast(100)},
	{"issue 28", "Partition creation: no live request waits on a lock", "0 samples with a live lock wait", "partitions", read(figPartLockWaitsCreate), atMost(0)},
	{"issue 28", "Partition removal: no live request waits on a lock", "0 samples with a live lock wait", "partitions", read(figPartLockWaitsRemove), atMost(0)},
}
