package main

import (
	"fmt"
	"github.com/idemflow/idemflow/workflow"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// chartFile is the chart's name in the docs directory.
const chartFile = "benchmarks.svg"

// report is everything the run measured.
type report struct {
	opts     *options
	machine  machine
	args     []string
	started  time.Time
	finished time.Time

	cells     []cell // rounds at provider latency 0
	slowCells []cell
	activity  []activity
	drains    []*drainResult
	retention *retentionResult
	wal       []walProfile
	perf      []perfProfile
	fused     *fusedCheck
	fusedSafe *fusedCheck
	growths   []*growthResult // one per server configuration, production-like first
	dups      *dupResult
	losers    *loserResult
	stmtTexts map[int64]string // pg_stat_statements' texts, by queryid
	figs      *figures         // figures parts hand the budget (partitions)
}

// agg is one variant at one concurrency, over the rounds.
type agg struct {
	Variant  string
	Conc     int
	Rounds   int
	N        int
	RPS      float64 // median over rounds
	Ratio    float64 // median over rounds of req/s ÷ bare's req/s in the same round
	RatioLo  float64
	RatioHi  float64
	P50, P99 float64 // ms, medians over rounds
	Per      perReq  // medians over rounds
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

var variantOrder = []string{vBare, vRecipe, vFused, vSafe, vIdem, vIdemPipe, vIdemPipeOmit, vIdemNoHistory, vIdemOtel, vReplay, vControl}

// aggregate groups cells by variant and concurrency, in report order.
func aggregate(cells []cell) []agg {
	type key struct {
		v string
		c int
	}
	bareRPS := map[[2]int]float64{} // (round, conc) -> bare req/s
	for _, c := range cells {
		if c.Variant == vBare {
			bareRPS[[2]int{c.Round, c.Conc}] = c.RPS
		}
	}
	groups := map[key][]cell{}
	var concs []int
	for _, c := range cells {
		k := key{c.Variant, c.Conc}
		groups[k] = append(groups[k], c)
		if !slices.Contains(concs, c.Conc) {
			concs = append(concs, c.Conc)
		}
	}
	slices.Sort(concs)
	order := slices.Clone(variantOrder)
	for _, c := range cells {
		// Variants added by files of their own (laterVariants) go after the built-in ones.
		if !slices.Contains(order, c.Variant) {
			order = append(order, c.Variant)
		}
	}
	var out []agg
	for _, v := range order {
		for _, conc := range concs {
			g := groups[key{v, conc}]
			if len(g) == 0 {
				continue
			}
			a := agg{Variant: v, Conc: conc, Rounds: len(g)}
			var rps, ratio, p50, p99 []float64
			per := make([][]float64, len(perReq{}.vals()))
			for _, c := range g {
				a.N += c.N
				rps = append(rps, c.RPS)
				if b, ok := bareRPS[[2]int{c.Round, c.Conc}]; ok && b > 0 {
					ratio = append(ratio, c.RPS/b)
				}
				p50 = append(p50, ms(c.P50))
				p99 = append(p99, ms(c.P99))
				for i, x := range c.Per.vals() {
					per[i] = append(per[i], x)
				}
			}
			a.RPS, a.P50, a.P99 = median(rps), median(p50), median(p99)
			a.Ratio = median(ratio)
			if len(ratio) > 0 {
				a.RatioLo, a.RatioHi = slices.Min(ratio), slices.Max(ratio)
			}
			var med []float64
			for _, xs := range per {
				med = append(med, median(xs))
			}
			a.Per = perReqOf(med)
			out = append(out, a)
		}
	}
	return out
}

func find(aggs []agg, v string, conc int) (agg, bool) {
	for _, a := range aggs {
		if a.Variant == v && a.Conc == conc {
			return a, true
		}
	}
	return agg{}, false
}

// roundRatio is the median over rounds of v's req/s ÷ ref's in the same round, with
// its range.
func roundRatio(cells []cell, v, ref string, conc int) (med, lo, hi float64, ok bool) {
	refRPS := map[int]float64{}
	for _, c := range cells {
		if c.Variant == ref && c.Conc == conc {
			refRPS[c.Round] = c.RPS
		}
	}
	var ratios []float64
	for _, c := range cells {
		if b, found := refRPS[c.Round]; found && b > 0 && c.Variant == v && c.Conc == conc {
			ratios = append(ratios, c.RPS/b)
		}
	}
	if len(ratios) == 0 {
		return 0, 0, 0, false
	}
	return median(ratios), slices.Min(ratios), slices.Max(ratios), true
}

// violations are the invariant violations: they make the command fail.
func (r *report) violations() []string {
	var out []string
	for _, a := range r.activity {
		if a.Variant == vControl {
			if a.IdleTxInCall == 0 && a.HeldInCall+a.CallHolding == 0 {
				logf("warning: the negative control was not detected holding a transaction across its call")
			}
			continue
		}
		if n := a.HeldInCall + a.CallHolding + a.IdleTxInCall; n > 0 {
			out = append(out, fmt.Sprintf("%s at concurrency %d held a connection during a call phase (%d times)", a.Variant, a.Conc, n))
		}
	}
	for _, d := range r.drains {
		for _, p := range d.Problems {
			out = append(out, fmt.Sprintf("drain with %d process(es): %s", d.Procs, p))
		}
	}
	if r.retention != nil {
		for _, p := range r.retention.Problems {
			out = append(out, "retention: "+p)
		}
	}
	return out
}

func (r *report) command() string {
	cmd := "go run ./bench"
	for _, a := range r.args {
		cmd += " " + a
	}
	return cmd
}

// markdown renders the report, section by section.
func (r *report) markdown() string {
	var b strings.Builder
	r.mdBudget(&b)
	r.mdMachine(&b)
	r.mdThroughput(&b)
	r.mdDrain(&b)
	r.mdRetention(&b)
	r.dupSection(&b)
	r.loserSection(&b)
	r.growthSection(&b)
	r.whereTimeGoes(&b)
	r.extraBreakdown(&b)
	r.whyNotMet(&b)
	r.mdRounds(&b)
	r.mdHow(&b)
	return b.String()
}

// printer returns a Printf into b.
func printer(b *strings.Builder) func(format string, args ...any) {
	return func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
}

// mdBudget writes the title, how the file was made, and the budget table.
func (r *report) mdBudget(b *strings.Builder) {
	p := printer(b)
	p("# Benchmarks\n\n")
	p("Generated by `%s` on %s (%s), in one process and one run. ", r.command(), r.started.UTC().Format("2006-01-02 15:04 MST"),
		r.finished.Sub(r.started).Round(time.Second))
	p("Regenerate with `go run ./bench` (every part; about 20 minutes on a quiet 2-core machine; it writes this file above the hand-written sections and [%s](%s)); ", chartFile, chartFile)
	p("CI runs `go run ./bench -smoke` (under a minute), which writes nothing and fails only on errors and invariant violations, never on a budget line. ")
	p("For profiling single paths there are Go benchmarks: `go test -run '^$' -bench . ./workflow/ ./internal/keytable/ ./examples/charges/chargeflow/` (claim, advance, replay, fingerprint; the charges flow in the example's package; each reports round trips per operation).\n\n")

	p("## Budget\n\n")
	p("Every line is computed from this run's data. *source*: DESIGN.md's performance budget, the issue whose target it is, or *standing* (a line the bench has carried from an earlier budget); *Go-code* is the `idemflow` variant, *pipelined* `idemflow-pipelined`, both on the library's default `Config` and pgx's default exec mode with warm statement caches. A line whose part did not run is *not measured*.\n\n")
	p("| source | line | target | measured | |\n|---|---|---|---|---|\n")
	for _, l := range r.budget() {
		p("| %s | %s | %s | %s | %s |\n", l.Source, l.Line, l.Target, l.Measured, l.verdict())
	}
}

// mdMachine writes the machine table.
func (r *report) mdMachine(b *strings.Builder) {
	p := printer(b)
	m := r.machine
	o := r.opts
	p("\n## Machine\n\n| | |\n|---|---|\n")
	p("| CPU | %d × %s |\n", m.cpus, orDash(m.cpuModel))
	p("| memory | %s |\n", orDash(m.memory))
	p("| Go | %s |\n", m.goVersion)
	p("| PostgreSQL | %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s, max_wal_size=%s |\n", m.pgVersion, m.fsync, m.syncCommit, m.sharedBufs, m.maxWalSize)
	p("| file system | %s |\n", orDash(m.dataFS))
	server := "`-db` / `$DATABASE_URL` / `TEST_DATABASE_URL`"
	if m.throwaway {
		server = "throwaway server from local binaries (testkit/pgtest), same machine, TCP on 127.0.0.1"
	}
	where := "a fresh database per run"
	switch {
	case m.citusNodes > 0:
		server = fmt.Sprintf("throwaway Citus cluster from local binaries (testkit/pgtest.StartCitus): a coordinator and %d workers on 127.0.0.1; server CPU is every node's", m.citusNodes-1)
		fallthrough
	case m.citus:
		where = "a fresh schema of the coordinator's database per run, charges (by account_id) and idemflow_keys (by scope) distributed in one colocation group"
	}
	p("| server | %s; %s |\n", server, where)
	p("| load average at start | %s |\n", orDash(m.loadAverage))
	p("| command | `%s` |\n", r.command())
	p("| rounds | %d interleaved rounds of %s per cell, concurrency %s; slow-provider run: 1 round at %s |\n",
		o.rounds, o.cell, joinInts(o.conc), o.slowLatency)
}

// mdThroughput writes the cost tables, at provider latency 0 and with a slow provider.
func (r *report) mdThroughput(b *strings.Builder) {
	p := printer(b)
	o := r.opts
	aggs := aggregate(r.cells)
	p("\n## Throughput and cost per request (provider latency 0)\n\n")
	p("![req/s by concurrency](%s)\n\n", chartFile)
	p("Medians over %d rounds; × bare is computed per round against bare in the same round (range over rounds in brackets).\n\n", o.rounds)
	costTable(b, aggs)

	p("\n## Slow provider (%s), one round\n\n", o.slowLatency)
	costTable(b, aggregate(r.slowCells))
	p("\nIn this run a sampler queries pg_stat_activity every 2 ms: its CPU is in the CPU columns, which matters at concurrency 1.\n")
	p("\nConnections while calls are in flight: pg_stat_activity sampled every 2 ms, and a tracker that follows each request's call phase and the pool connections it holds (pgxpool acquire/release tracer, exact).\n\n")
	p("| variant | conc | samples | idle-in-tx backends seen | longest idle in tx (ms) | idle in tx while its request is in a call | connections held in a call | max connections in use | acquisitions above requests outside a call |\n")
	p("|---|---|---|---|---|---|---|---|---|\n")
	for _, a := range r.activity {
		p("| %s | %d | %d | %d | %.2f | %d | %d | %d | %d |\n", a.Variant, a.Conc, a.Samples, a.IdleTxSeen, ms(a.IdleTxMax),
			a.IdleTxInCall, a.HeldInCall+a.CallHolding, a.MaxInUse, a.OverUse)
	}
}

// mdDrain writes the sweeper drain table.
func (r *report) mdDrain(b *strings.Builder) {
	if len(r.drains) == 0 {
		return
	}
	p := printer(b)
	p("\n## Sweeper drain\n\n")
	p("Stuck keys are made the way clients leave them: each charge runs through the engine with a provider that answers 503, so create_charge commits and the key is released at that recovery point. ")
	p("The sweepers (separate processes of this binary, `Engine.Start`, Interval 10ms, no grace) take them over, call a healthy provider with the derived key and finalize. keys/s runs, by the database clock, from just before the start signal to the last key's `finished_at` (the end is polled for every 20 ms once the provider has answered a call for every key, so that the polling scans do not load the server during the drain; CPU is counted until the poll sees it).\n\n")
	p("Per key: the server's CPU (every process of it), the sweeper processes' own (getrusage) and this process's (the fake provider), and the round trips and statements the sweepers' pools sent (a pgx tracer in each).\n\n")
	p("| sweeper processes | concurrency each | stuck keys | time | keys/s | CPU ms per key: server / sweepers / bench | round trips / statements per key | passes | taken | finished | released | lease lost | one charge per key | provider requests / payments / keys called twice | lock versions |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, d := range r.drains {
		n := float64(d.Keys)
		p("| %d | %d | %d | %s | %.0f | %.3f / %.3f / %.3f | %.2f / %.2f | %d | %d | %d | %d | %d | %d rows, %d keys | %d / %d / %d | %s |\n",
			d.Procs, d.Concurrency, d.Keys, d.Elapsed.Round(time.Millisecond), d.KeysPerSec,
			d.ServerCPU, d.Child.CPUMs/n, d.BenchCPU, float64(d.Child.RoundTrips)/n, float64(d.Child.Statements)/n,
			d.Child.Passes, d.Child.Taken,
			d.Child.Finished, d.Child.Released, d.Child.LeaseLost, d.Charges, d.DistinctCharges,
			d.ProviderRequests, d.ProviderPayments, d.ProviderKeysTwice, lockVersions(d.LockVersions))
	}
}

// mdRetention writes the retention cleanup table, if it ran.
func (r *report) mdRetention(b *strings.Builder) {
	p := printer(b)
	if rt := r.retention; rt != nil {
		p("\n## Retention cleanup under live traffic\n\n")
		p("%d expired finished keys (finished two days ago) inserted with INSERT … SELECT generate_series, then VACUUM ANALYZE and CHECKPOINT (%s). ",
			rt.Backlog, rt.InsertTime.Round(time.Millisecond))
		p("Live traffic: idemflow fresh requests at concurrency %d. One sweeper process runs one pass (`Engine.Sweep`) (batches of %d until none is left) with the default 24h retention: %d keys deleted in %s.\n\n",
			rt.Conc, workflow.CleanupBatchDefault, rt.Expired, rt.CleanupTime.Round(time.Millisecond))
		p("| window | requests | req/s | p50 (ms) | p99 (ms) | live backends seen waiting on a row or table lock | all lock waits seen |\n|---|---|---|---|---|---|---|\n")
		for _, w := range []struct {
			name string
			w    liveWindow
		}{{"backlog present, no cleanup", rt.Base}, {"cleanup running", rt.During}, {"after the cleanup", rt.After}} {
			p("| %s | %d | %.0f | %.2f | %.2f | %d in %d samples | %s |\n", w.name, w.w.N, w.w.RPS, ms(w.w.P50), ms(w.w.P99), w.w.LockWaits, w.w.Samples, fmtWaits(w.w.Waits))
		}
	}
}

// mdRounds writes the per-round ratios to bare.
func (r *report) mdRounds(b *strings.Builder) {
	p := printer(b)
	o := r.opts
	p("\n## Per-round ratios to bare\n\n")
	p("| variant | conc | %s |\n|---|---|%s\n", roundHeads(o.rounds), strings.Repeat("---|", o.rounds))
	for _, v := range []string{vRecipe, vFused, vSafe, vIdem, vIdemPipe, vReplay} {
		for _, conc := range o.conc {
			var cols []string
			for rd := range o.rounds {
				cols = append(cols, ratioIn(r.cells, v, conc, rd))
			}
			p("| %s | %d | %s |\n", v, conc, strings.Join(cols, " | "))
		}
	}
}

// mdHow writes how each figure is measured.
func (r *report) mdHow(b *strings.Builder) {
	p := printer(b)
	m := r.machine
	o := r.opts
	p("\n## How it is measured\n\n")
	p("- **Variants.** `bare`: insert a pending charge, call the provider, mark it succeeded; two autocommit statements, plain pgx. ")
	p("`recipe`: the textbook key-table recipe written in `bench/variants.go`: the claim in a transaction of its own (INSERT … ON CONFLICT DO NOTHING), then one transaction per phase that also advances the key's recovery point (fenced by `locked_at`), every statement, BEGIN and COMMIT a round trip of its own: 11 round trips, 3 commits. ")
	p("`recipe-fused`: the best a careful team would hand-write (`bench/fused.go`): a lookup (replay, 409, 422 as a server would answer), then the claim inside the first phase's transaction: one pgx batch, run as one implicit transaction, of the key row's INSERT … ON CONFLICT DO NOTHING (already at the phase's recovery point, naming the charge by an id the client chose in the table default's format) and the charge's INSERT, which inserts only if that key row is this attempt's; the provider call with a key derived from the row's id; then one batch of the charge's UPDATE, fenced by the key's lease (`EXISTS (… FOR UPDATE)`, so no takeover can come between) and the key's finish with the stored response (known before the update: every field of the charge is). 3 round trips, 5 statements, 2 writing commits; no CTE, no plpgsql; its effects (one charge and one provider payment per key) are checked at the end of the run. ")
	p("`recipe-fused-safe`: recipe-fused with idemflow's guarantees (`bench/fusedsafe.go`): the claim batch starts with a transaction-scoped advisory lock taken without waiting that raises when held, and inserts the key row with a plain INSERT that raises on a committed row, so that a loser never waits and none of the phase's statements runs after a lost claim; the finish batch starts with a fence that locks the key row without waiting at the claim's lock version (`FOR NO KEY UPDATE NOWAIT`, raising when the version moved or the row is locked), then the charge's UPDATE and a plain UPDATE of the key row; its key table has the sweeper's partial index of unfinished keys by due time, so its finish is not HOT (idemflow's is not either); no retention index, no history. 3 round trips, 7 statements, 2 writing commits; effects checked like recipe-fused's. ")
	p("`idemflow`: `workflow.Engine.Do` running `chargeflow.Flow` (the example's Go-code tx phases), fresh keys. `idemflow-pipelined`: the same with `chargeflow.PipelinedFlow` (pipelined tx phases: each sends the engine's claim (the claim lock and the key row's insert) or fence, its statements and, after a fence, the key row's write in one round trip, as one implicit transaction: 3 round trips, 7 statements, 2 writing commits). Both run the library with its default `Config`. `idemflow-pipelined-omit` (`-history-omit-clean`, on by default): idemflow-pipelined with `Config.HistoryOmitCleanFinish`, which stores no history entry for a key's first attempt that finishes from the start (the key's history shows one derived from its row; off by default in this release, for the upgrade contract). `idemflow-replay`: `Do` with keys idemflow finished. `idemflow-loser` and `idemflow-pipelined-loser` (`bench/losevariant.go`): `Do` on one of %d keys whose claim locks another connection holds for the whole run and whose rows never exist, on each flow: every request is a losing copy that must be told 409 at once. ", heldKeys)
	p("All call the fake provider (`chargeflow.NewProvider`) over HTTP on 127.0.0.1 in this process; none has an HTTP layer in front. Each variant has a pool of its own (max %d connections, warm: every connection used in the warm-up).\n", slices.Max(o.conc))
	p("- **Load.** Closed loop: `conc` goroutines each send the next request as soon as the last one is answered, for %s per cell. Cells are interleaved: each round runs every variant at every concurrency, and the order of the variants rotates between concurrencies and rounds.\n", o.cell)
	p("- **Statements and round trips (tracer)**: a pgx `QueryTracer` + `BatchTracer` on each pool: each query is one statement and one round trip; each batch is one round trip and as many statements as it holds. BEGIN and COMMIT count as statements.\n")
	p("- **Round trips (wire)**: each pool's sockets are wrapped; a write that follows a read starts a new round trip. This also catches what the tracer cannot see (statement-cache prepares, a batch split in two).\n")
	p("- **Commits**: `pg_stat_database.xact_commit` of the bench database, before and after the cell. A backend reports its counters at most once a second (and an idle one only after a 10 s timeout), so before and after each cell every idle connection of every pool runs `SELECT pg_stat_force_next_flush() FROM bench_flush` (a backend reports before its ReadyForQuery, and only when it has something pending: hence the one-row table), those transactions are subtracted, and the admin connection reads with `stats_fetch_consistency = none` from another database. ")
	p("This counts read-only transactions too (idemflow's lookup, a replay). **Writing transactions** are the advance of the transaction-id counter (`pg_snapshot_xmax(pg_current_snapshot())`, read while no bench transaction is open): only a transaction that writes gets an xid. The tracer's count of COMMITs and autocommit statements agrees with xact_commit (column *tracer*). Autovacuum and checkpoints in the same window add a little to commits, xids and WAL.\n")
	p("- **WAL bytes**: the advance of `pg_current_wal_insert_lsn()` over the cell (cluster-wide; includes full-page images after checkpoints, which is real cost).\n")
	p("- **Latency**: per request, wall clock in the client; p50/p99 per cell, medians over rounds.\n")
	p("- **Refusals** (`refusals` part, `bench/refusals.go`): a server process of its own serves, on one loopback listener, `idemhttp.Handler` on a real engine with the charges flow, drained before the first request (every attempt refused before its claim: 503, Retry-After, the problem document, the hooks), the same on a second engine that is overloaded (`MaxInFlight` 1, its place held by an attempt that never ends, `AdmitWait` 4 ms: after the first waits nearly every refusal comes at once, the queue being hopeless, and no refused body is read), and a bare `net/http` handler answering 503 with `Retry-After: 1`. The bench's client sends the same keyed charge request to each, %d requests per side per round in %d closed loops, over %d interleaved rounds (each side goes first in turn); the server process reports its own CPU (getrusage) and heap allocations (runtime/metrics) before and after each side's round, the client reads its own. The budget judges the median over rounds of the per-round ratio.\n",
		o.refusalN, o.refusalConc, o.rounds)
	p("- **Crowd** (`crowd` part, `bench/crowd.go`): a charges server in a process of its own (`idemhttp.Handler`, the charges flow with Go-code phases, the fake provider in-process, a pool of 4; admission `MaxInFlight` %d, `AdmitWait` %s, 0 meaning the engine's defaults; `ShedHold` %s, as `charges serve`'s `-shed-hold`: an overloaded refusal's answer held that long on a timer) and a load generator in another (`bench/crowdgen.go`, client `%s`: `conn` holds one HTTP/1.1 connection per client, reads with the attempt's deadline on the socket, keeps the connection after an answer and closes it on giving up, so a retry after a give-up opens a new one; `transport` is net/http's client). In each round, pinned (the generator on CPU %d with taskset, the server on the others; Postgres unpinned) and unpinned, interleaved, on a fresh server: a baseline of %d closed loops of patient clients for %s after 1 s of warm-up, then new charges open-loop at 4× the baseline's charges/s for %s, each attempt given up after %s and retried at once with the same key, as after any refusal (at most %d charges under way; arrivals beyond are dropped and counted). Goodput is the charges answered 201 per second; the budget judges the pinned runs' median of goodput ÷ baseline.\n",
		o.crowdMaxInFlight, o.crowdAdmitWait, o.crowdShedHold, o.crowdClient, o.crowdCPU, o.crowdConc, o.crowdBase, o.crowdDur, o.crowdTimeout, o.crowdLive)
	p("- **CPU**: server CPU is the advance over the cell of user + system time (`/proc/<pid>/stat`, 10 ms ticks) of the postmaster and all its children (backends, WAL writer, checkpointer, autovacuum), when the server runs on this machine; client CPU is this process's getrusage (the variant's Go code, pgx, the in-process fake provider and the tracer). Both are divided by the cell's requests. **allocs (client)** are the heap objects this process allocated over the cell (runtime/metrics `/gc/heap/allocs:objects`) per request: the variant's code, pgx, the tracer and the in-process fake provider's HTTP server and client, which every variant pays alike.\n")
	p("- **Statements (pg_stat_statements)**: loaded on the throwaway server (track = top, planning tracked); its counters of the bench database are read just before and after each cell's load, outside the CPU window, from another database. Every variant pays its small overhead alike.\n")
	p("- **Noise.** The machine has %d cores shared by PostgreSQL, this process and its in-process provider; other engineers may run tests on the same machine at the same time (load average at the start: %s). The rotation and the per-round ratios are there so that a disturbance hits all variants of a round alike; look at the per-round ratios before trusting a single figure.\n", m.cpus, orDash(m.loadAverage))
	if m.sharedDB {
		p("- The server refused CREATE DATABASE, so the bench ran in a schema of an existing database: other activity in that database is counted in its commits.\n")
	}
}

// costTable writes the per-variant table.
func costTable(b *strings.Builder, aggs []agg) {
	fmt.Fprintf(b, "| variant | conc | req/s | × bare | p50 (ms) | p99 (ms) | statements | round trips (tracer / wire) | commits (xact_commit / tracer) | writing transactions | WAL bytes | CPU ms (server / client) | allocs (client) |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, a := range aggs {
		ratio := "—"
		if a.Variant != vBare && !math.IsNaN(a.Ratio) && a.Ratio > 0 {
			if a.RatioLo != a.RatioHi {
				ratio = fmt.Sprintf("%.2f (%.2f–%.2f)", a.Ratio, a.RatioLo, a.RatioHi)
			} else {
				ratio = fmt.Sprintf("%.2f", a.Ratio)
			}
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %s | %.2f | %.2f | %.2f | %.2f / %.2f | %.2f / %.2f | %.2f | %.0f | %s / %.2f | %.0f |\n",
			a.Variant, a.Conc, a.RPS, ratio, a.P50, a.P99, a.Per.Statements, a.Per.RoundTrips, a.Per.Wire,
			a.Per.Commits, a.Per.TracerCommits, a.Per.Writes, a.Per.WAL, fmtMaybe(a.Per.ServerCPU), a.Per.ClientCPU, a.Per.Allocs)
	}
}

func fmtWaits(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return strings.Join(s, ", ")
}

func fmtMaybe(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.2f", x)
}

func ratioIn(cells []cell, v string, conc, round int) string {
	var x, bare float64
	for _, c := range cells {
		if c.Round == round && c.Conc == conc {
			switch c.Variant {
			case v:
				x = c.RPS
			case vBare:
				bare = c.RPS
			}
		}
	}
	if x == 0 || bare == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", x/bare)
}

func roundHeads(n int) string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("round %d", i+1))
	}
	return strings.Join(s, " | ")
}

func lockVersions(m map[int64]int) string {
	var keys []int64
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("v%d: %d", k, m[k]))
	}
	return strings.Join(s, ", ")
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// handWritten marks where BENCHMARKS.md's hand-written sections start: write keeps
// everything from it on and regenerates everything before it.
const handWritten = "<!-- Hand-written from here on: `go run ./bench` regenerates everything above this line and keeps everything below it. -->"

// write writes BENCHMARKS.md and the chart into dir.
func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "BENCHMARKS.md")
	out := r.markdown()
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if i := strings.Index(string(old), handWritten); i >= 0 {
		out += "\n" + string(old[i:])
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, chartFile), []byte(chartSVG(aggregate(r.cells), r.opts.conc)), 0o644)
}

// printRTProfile prints, for -rtprofile, where a variant's database time went.
func printRTProfile(v *variant) {
	p := v.tr.prof
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	type row struct {
		label string
		k     *rtKind
	}
	var rows []row
	for l, k := range p.kinds {
		rows = append(rows, row{l, k})
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.k.total - a.k.total) })
	fmt.Fprintf(os.Stderr, "\nround trips of %s (client-side time, all cells):\n", v.name)
	for _, r := range rows {
		fmt.Fprintf(os.Stderr, "  %8d  mean %7.3f ms  max %8.2f ms  total %8.2f s  %s\n", r.k.n,
			ms(r.k.total)/float64(r.k.n), ms(r.k.max), r.k.total.Seconds(), r.label)
	}
}

// whereTimeGoes writes the profile section: CPU per request, WAL by record type, and
// the server's perf profile.
func (r *report) whereTimeGoes(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	aggs := aggregate(r.cells)
	if len(aggs) == 0 && len(r.wal) == 0 && len(r.perf) == 0 {
		return
	}
	p("\n## Where the time goes\n\n")
	if len(aggs) > 0 {
		p("CPU per request (ms), medians over the rounds: the database server (all its processes, from /proc) and this process (client, provider, tracer). ")
		p("On %d cores, req/s can not exceed %d000 ms ÷ (server + client CPU per request).\n\n", r.machine.cpus, r.machine.cpus)
		p("| variant | %s |\n|---|%s\n", concHeads(r.opts.conc, "server / client"), strings.Repeat("---|", len(r.opts.conc)))
		for _, v := range []string{vBare, vRecipe, vFused, vSafe, vIdem, vIdemPipe, vReplay} {
			var cols []string
			for _, c := range r.opts.conc {
				a, ok := find(aggs, v, c)
				if !ok {
					cols = append(cols, "—")
					continue
				}
				cols = append(cols, fmt.Sprintf("%s / %.2f", fmtMaybe(a.Per.ServerCPU), a.Per.ClientCPU))
			}
			p("| %s | %s |\n", v, strings.Join(cols, " | "))
		}
	}
	if len(r.wal) > 0 {
		p("\nWAL per request by record type (pg_walinspect `pg_get_wal_stats`, each variant alone at concurrency 1; record bytes, full-page images apart):\n\n")
		p("| variant | requests | record bytes | FPI bytes | largest record types (count, bytes per request) |\n|---|---|---|---|---|\n")
		for _, w := range r.wal {
			var top []string
			for i, rec := range w.Records {
				if i == 6 {
					break
				}
				top = append(top, fmt.Sprintf("%s ×%.2f %.0f B", rec.Kind, rec.Count, rec.Bytes+rec.FPI))
			}
			p("| %s | %d | %.0f | %.0f | %s |\n", w.Variant, w.N, w.Total, w.TotalFPI, strings.Join(top, "; "))
		}
	}
	if len(r.perf) > 0 {
		p("\nThe server's CPU samples (Linux perf, 999 Hz, call graphs; backends of the bench database while each variant runs alone at concurrency %d), inclusive share per function:\n\n", r.perf[0].Conc)
		p("| function | what | %s |\n|---|---|%s\n", perfHeads(r.perf), strings.Repeat("---|", len(r.perf)))
		for _, s := range perfSymbols {
			var cols []string
			for _, pp := range r.perf {
				cols = append(cols, fmt.Sprintf("%.1f%%", pp.Share[s.sym]))
			}
			p("| `%s` | %s | %s |\n", s.sym, s.what, strings.Join(cols, " | "))
		}
	}
}

func concHeads(concs []int, what string) string {
	var s []string
	for _, c := range concs {
		s = append(s, fmt.Sprintf("c=%d %s", c, what))
	}
	return strings.Join(s, " | ")
}

func perfHeads(ps []perfProfile) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%s (%d samples)", p.Variant, p.Samples))
	}
	return strings.Join(s, " | ")
}

// whyNotMet explains a missed throughput line from what was measured.
func (r *report) whyNotMet(b *strings.Builder) {
	aggs := aggregate(r.cells)
	maxConc := slices.Max(r.opts.conc)
	idem, ok1 := find(aggs, vIdem, maxConc)
	bare, ok2 := find(aggs, vBare, maxConc)
	if !ok1 || !ok2 || idem.Ratio >= 0.5 || math.IsNaN(idem.Per.ServerCPU) {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Why fresh throughput misses 0.5× bare\n\n")
	p("At concurrency %d the machine's %d cores are the bottleneck: a fresh idemflow request costs %.2f ms of database-server CPU against %.2f ms for bare (%.1f×), plus %.2f ms against %.2f ms in this process. ",
		maxConc, r.machine.cpus, idem.Per.ServerCPU, bare.Per.ServerCPU, idem.Per.ServerCPU/bare.Per.ServerCPU, idem.Per.ClientCPU, bare.Per.ClientCPU)
	p("%d000 ms ÷ %.2f ms caps idemflow at about %.0f req/s on this machine, bare at about %.0f. ",
		r.machine.cpus, idem.Per.ServerCPU+idem.Per.ClientCPU, float64(r.machine.cpus)*1000/(idem.Per.ServerCPU+idem.Per.ClientCPU),
		float64(r.machine.cpus)*1000/(bare.Per.ServerCPU+bare.Per.ClientCPU))
	p("Where the extra goes, statement by statement, is in the comparison with the fused recipe above.\n")
}
