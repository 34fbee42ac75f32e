// Command bench measures idemflow on the charges flow against the same flow with no
// idempotency at all (bare), the textbook key-table recipe and a fused hand-written
// recipe, in one process and one run, in interleaved rounds, and checks the
// performance budget of DESIGN.md.
//
//	go run ./bench         # the full run (every part; about 20 minutes on a quiet 2-core machine):
//	                       # prints the report and writes docs/BENCHMARKS.md and docs/benchmarks.svg
//	go run ./bench -smoke  # a tiny run of most parts for CI (under a minute); writes nothing
//	go run ./bench -cell 1s -rounds 2 -warmup 1s -growth 200000 -partition-keys 100000 -docs ''   # a quick full run
//
// The database is -db's server, else $DATABASE_URL's, else a throwaway one from local
// PostgreSQL binaries (testkit/pgtest, fsync on, pg_stat_statements loaded;
// TEST_DATABASE_URL is honoured there). The bench creates a database of its own on it
// (and two more for the growth experiment) and drops them at the end. On a Citus
// coordinator (the database named by -db has the citus extension) it works in a fresh
// schema of that database instead, and distributes idemflow_keys and charges by scope,
// colocated (migrations.Distribute); see citus.go for what runs there.
//
// Variants, each a function call (no HTTP layer in front), each calling the fake
// provider over HTTP:
//
//   - bare: insert a pending charge, call the provider, mark it succeeded; plain pgx,
//     autocommit statements. The floor.
//   - recipe: the textbook idempotency-key recipe: the claim in a transaction of its
//     own, then a transaction per phase, one statement per round trip.
//   - recipe-fused: the best a careful team would hand-write: the claim inside the
//     first phase's transaction, each transaction one pgx batch (fused.go).
//   - recipe-fused-safe: recipe-fused with idemflow's guarantees: a claim that never
//     waits and lets a loser run nothing, a fenced finish, the sweeper's index
//     (fusedsafe.go).
//   - idemflow: workflow.Engine running chargeflow.Flow (Go-code tx phases), fresh keys.
//   - idemflow-pipelined: the same with chargeflow.PipelinedFlow (pipelined.go).
//   - idemflow-replay: retries of keys idemflow finished.
//
// Then the sweeper: stuck keys drained by one sweeper process and by four, and the
// retention cleanup of a large expired backlog under live traffic; concurrent
// duplicates of a key whose first attempt sits in a long first phase (dup.go); the
// losing path: a copy of a held key's round trips per pgx exec mode and what it leaves
// the next request on its connection, and fresh requests beside 8 and 16 losing copies
// per key (losers.go); fresh and replay latency with -growth N retained finished keys
// against an empty key table (growth.go); and the partitioned key table beside batched
// deletes (partitions.go); and what a refused request costs: idemhttp.Handler on a
// draining engine beside a bare net/http 503 with Retry-After, over loopback HTTP, the
// server in a process of its own (refusals.go; -phases refusals runs it alone, quickly
// with -refusal-n 2000 -rounds 3). Where idemflow's cost over recipe-fused goes comes from
// pg_stat_statements, read around every cell of the rounds (stmts.go). The budget's
// lines are declared in budget.go.
//
// The command exits non-zero on errors and invariant violations (a request failed, a
// replay was not a replay, a key was driven twice, a connection was held during a call
// phase, an effect committed other than once), never because a budget line was not
// met: those are printed as "not met".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// defaultPhases are the parts of the full run: every target of DESIGN.md's budget and of
// the issues' benchmarks is measured by one of them (perf, the server's CPU profile per
// variant, is a diagnostic: named with -phases, and needs Linux perf).
const defaultPhases = "rounds,wal,slow,drain,retention,dups,losers,growth,partitions,refusals,crowd"

// options are the command's flags.
type options struct {
	historyOmit   bool // -history-omit-clean
	smoke         bool
	rounds        int
	cell          time.Duration
	warmup        time.Duration
	conc          []int
	slowLatency   time.Duration
	drainKeys     int
	sweepers      int
	sweepConc     int
	drainSample   time.Duration
	backlog       int
	liveWindow    time.Duration
	docs          string
	cpuProfile    string
	keep          bool
	only          []string // variants to run in the rounds (all when empty)
	rtProfile     bool
	phases        map[string]bool
	growth        int           // finished key rows of the growth experiment (0: not run)
	growthConfigs string        // the server configurations it runs on, comma-separated (growthconfig.go)
	dupSleep      time.Duration // the duplicates experiment's first phase
	ops           bool          // also run idemflow-nohistory and idemflow-otel
	db            string        // server to run on (else $DATABASE_URL, else a throwaway server)
	distribute    string        // "auto", "on" or "off": distribute the key and charges tables on Citus
	citus         bool          // start a throwaway Citus cluster and run on its coordinator
	loserGap      time.Duration // losers part: the gap between bursts of copies
	// partitionKeys: keys of the partitioned key table's experiment (partitions.go).
	partitionKeys int
	// partitionBatchedKeys: keys of the cleanup experiment's batched-deletes side (0:
	// partitionKeys).
	partitionBatchedKeys int
	// partitionRetained: run the partitions part's retained-keys cells.
	partitionRetained bool
	// partitionCleanup: run the partitions part's cleanup experiment (else only the
	// retained-keys cells).
	partitionCleanup bool
	// partitionCleanupWidth: the width of the cleanup experiment's partitions; a day
	// of keys is removed a step whatever the width.
	partitionCleanupWidth time.Duration
	// partitionCleanupDays: how many days the cleanup experiment's expired keys span,
	// a step (and a pair of windows) a day.
	partitionCleanupDays int
	// partitionCleanupAttached: how many of those days' partitions are attached at
	// once (0: all of them, from the start); the others wait detached and are attached
	// one day at a time, before the pair that removes it, outside the windows.
	partitionCleanupAttached int
	// partitionCustom: the partitions part also runs its partitioned sides through
	// pools with plan_cache_mode = force_custom_plan.
	partitionCustom bool
	// partitionGeneric: the partitions part also runs its week-partitioned sides
	// through pools whose connections force generic plans.
	partitionGeneric bool
	// partitionSides: the sides of the retained-keys cells (partitionSideNames).
	partitionSides []string
	// partitionConfigs: the server configurations the partitions part runs on
	// (growthConfigsOf), one after the other; its budget figures come from the first.
	partitionConfigs string
	// partitionConc: the closed loops of live fresh requests in the partitions part.
	partitionConc int
	// partitionDayKeys: keys a simulated day of the partitions part's week of sizes
	// (0: not run).
	partitionDayKeys int
	// refusalN and refusalConc: the refusals part's requests per side per round, and its
	// closed loops (refusals.go).
	refusalN    int
	refusalConc int
	// The crowd part's settings (crowd.go).
	crowdConc        int           // the baseline's closed loops
	crowdBase        time.Duration // the baseline's window
	crowdDur         time.Duration // the crowd's window
	crowdTimeout     time.Duration // a crowd client gives up an attempt after this
	crowdLive        int           // charges under way at most in the crowd
	crowdCPU         int           // the CPU the pinned load generator runs on
	crowdMaxInFlight int           // the server's workflow.Config.MaxInFlight
	crowdAdmitWait   time.Duration // the server's workflow.Config.AdmitWait
	crowdShedHold    time.Duration // the server's idemhttp.Config.ShedHold
	crowdProfile     string        // where to write the server's CPU profile under the crowd
	crowdClient      string        // the load generator's client: conn or transport
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	o := &options{}
	var conc, only, phaseList, partSides string
	fs.BoolVar(&o.smoke, "smoke", false, "tiny run for CI: 1 round, short cells, small N, no docs written")
	fs.IntVar(&o.rounds, "rounds", 5, "interleaved rounds at provider latency 0 (medians are over rounds)")
	fs.DurationVar(&o.cell, "cell", 2500*time.Millisecond, "how long each (variant, concurrency) cell runs in a round")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up per variant before the rounds")
	fs.StringVar(&conc, "conc", "1,8,32", "concurrencies (closed-loop workers)")
	fs.DurationVar(&o.slowLatency, "slow-latency", 20*time.Millisecond, "provider latency of the slow-provider run")
	fs.IntVar(&o.drainKeys, "drain-keys", 5000, "stuck keys per sweeper drain")
	fs.IntVar(&o.sweepers, "sweepers", 4, "sweeper processes in the multi-process drain")
	fs.IntVar(&o.sweepConc, "sweeper-concurrency", 8, "sweeper.Config.Concurrency of each sweeper process")
	fs.DurationVar(&o.drainSample, "drain-sample", 0, "drain part: sample the sweepers' backends (state, wait event) in pg_stat_activity this often, and log what was seen (0: not sampled; the samples cost server CPU)")
	fs.IntVar(&o.backlog, "backlog", 200000, "expired finished keys for the retention run")
	fs.DurationVar(&o.liveWindow, "live-window", 8*time.Second, "length of the retention run's baseline window")
	fs.StringVar(&o.docs, "docs", "docs", "directory for BENCHMARKS.md and benchmarks.svg (empty: write nothing)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process to the file")
	fs.BoolVar(&o.keep, "keep", false, "keep the bench database (and a throwaway server's data) at the end")
	fs.BoolVar(&o.rtProfile, "rtprofile", false, "time each kind of round trip (from the client) and print the table at the end")
	fs.IntVar(&o.growth, "growth", 10000000, "growth experiment: bulk-load this many finished keys and compare with an empty table (0: not run)")
	fs.StringVar(&o.growthConfigs, "growth-configs", "production,default", "growth experiment: the server configurations it runs on, one after the other: production (a throwaway server sized to the machine: shared buffers a quarter of its memory) and default (the bench's server, PostgreSQL's defaults)")
	fs.DurationVar(&o.dupSleep, "dup-sleep", 3*time.Second, "duplicates experiment: how long the first attempt's first tx phase takes")
	fs.IntVar(&o.partitionKeys, "partition-keys", 1000000, "keys of the partitions part (-phases partitions: partitions.go)")
	fs.IntVar(&o.partitionBatchedKeys, "partition-batched-keys", 0, "partitions part: keys of the cleanup's batched-deletes side (0: -partition-keys)")
	fs.BoolVar(&o.partitionRetained, "partition-retained", true, "partitions part: also run the retained-keys cells (false: only the cleanup, and the week of sizes if asked)")
	fs.BoolVar(&o.partitionCustom, "partition-custom-plans", false, "partitions part: also run the day-partitioned sides with plan_cache_mode = force_custom_plan")
	fs.BoolVar(&o.partitionGeneric, "partition-generic-plans", false, "partitions part: also run the week-partitioned sides with plan_cache_mode = force_generic_plan")
	fs.BoolVar(&o.partitionCleanup, "partition-cleanup", true, "partitions part: also run the cleanup experiment (false: only the retained-keys cells)")
	fs.IntVar(&o.partitionCleanupDays, "partition-cleanup-days", 10, "partitions part: how many days the cleanup experiment's expired keys span, ending 40 days ago: a removal step and a pair of windows per day, so more days resolve the live p99's ratio more finely (-partition-keys spread over them)")
	fs.IntVar(&o.partitionConc, "partition-conc", 8, "partitions part: closed loops of live fresh requests in its cells and windows (8 keeps this machine's two cores busy; fewer leave CPU idle, so that a removal's own CPU does not come out of the live requests' time)")
	fs.IntVar(&o.partitionCleanupAttached, "partition-cleanup-attached", 0, "partitions part: how many of the cleanup experiment's expired days are attached at once (0: all, from the start); the rest wait detached and each is attached before the pair that removes it, with a warm-up after, so that a removal meets as many attached partitions as a production table's retention holds, however many pairs are run")
	fs.DurationVar(&o.partitionCleanupWidth, "partition-cleanup-width", 24*time.Hour, "partitions part: the width of the cleanup experiment's partitions, a divisor of a day in whole minutes (24h: one partition a day; 1h: each day in 24, a step removing the day's 24, each with its own detach and drop)")
	fs.StringVar(&partSides, "partition-sides", strings.Join(partitionSideNames, ","), "partitions part: the sides of the retained-keys cells (empty is always run: the reference)")
	fs.StringVar(&o.partitionConfigs, "partition-configs", "production,default", "partitions part: the server configurations it runs on, one after the other (as -growth-configs); budget lines from the first")
	fs.IntVar(&o.partitionDayKeys, "partition-day-keys", 0, "partitions part: simulate a week of this many keys a day, 2-day retention, and log table+index sizes, batched deletes vs partition drops (0: not run)")
	fs.IntVar(&o.refusalN, "refusal-n", 20000, "refusals part: requests per side (idemhttp refusing, bare 503) per round")
	fs.IntVar(&o.refusalConc, "refusal-conc", 8, "refusals part: closed loops sending the requests")
	fs.IntVar(&o.crowdConc, "crowd-conc", 32, "crowd part: closed loops of the no-crowd baseline")
	fs.DurationVar(&o.crowdBase, "crowd-base", 5*time.Second, "crowd part: the baseline's measured window (after 1s of warm-up)")
	fs.DurationVar(&o.crowdDur, "crowd-dur", 8*time.Second, "crowd part: the crowd's measured window")
	fs.DurationVar(&o.crowdTimeout, "crowd-timeout", time.Second, "crowd part: a client gives up an attempt after this long and retries at once")
	fs.IntVar(&o.crowdLive, "crowd-live", 4096, "crowd part: charges under way at most (arrivals beyond are dropped and counted)")
	fs.IntVar(&o.crowdCPU, "crowd-cpu", 1, "crowd part: the CPU of the pinned load generator (the server gets the others)")
	fs.IntVar(&o.crowdMaxInFlight, "crowd-max-in-flight", 0, "crowd part: the server's workflow.Config.MaxInFlight (0: the default)")
	fs.DurationVar(&o.crowdAdmitWait, "crowd-admit-wait", 0, "crowd part: the server's workflow.Config.AdmitWait (0: the default)")
	fs.DurationVar(&o.crowdShedHold, "crowd-shed-hold", 500*time.Millisecond, "crowd part: the server's idemhttp.Config.ShedHold, as charges serve's -shed-hold (0: refusals answered at once)")
	fs.StringVar(&o.crowdClient, "crowd-client", "conn", "crowd part: the load generator's client: conn (one connection per client, read with a socket deadline) or transport (net/http's client, to compare)")
	fs.StringVar(&o.crowdProfile, "crowd-profile", "", "crowd part: write the server's CPU profile under the crowd (round 1, unpinned) to this file")
	fs.BoolVar(&o.historyOmit, "history-omit-clean", true, "also run idemflow-pipelined with workflow.Config.HistoryOmitCleanFinish (idemflow-pipelined-omit), and its budget lines")
	fs.BoolVar(&o.ops, "ops", false, "also run idemflow with no history (idemflow-nohistory) and with the OpenTelemetry adapter (idemflow-otel)")
	fs.StringVar(&o.db, "db", "", "PostgreSQL URL of the server to run on (default $DATABASE_URL, else a throwaway server); "+
		"on a Citus coordinator the bench works in a fresh schema of that database, with the key and charges tables distributed by scope")
	fs.BoolVar(&o.citus, "citus", false, "start a throwaway Citus cluster from the local binaries (a coordinator and 2 workers, testkit/pgtest.StartCitus) and run on its coordinator, "+
		"with the key and charges tables distributed; server CPU is then every node's")
	fs.DurationVar(&o.loserGap, "loser-gap", 50*time.Millisecond, "losers part: a burst of 8 or 16 copies of a held key every this long, beside the fresh requests")
	fs.StringVar(&o.distribute, "distribute", "auto", "distribute idemflow_keys and charges by scope, colocated, on Citus (auto: when the database has the citus extension; on; off)")
	fs.StringVar(&only, "only", "", "comma-separated variants to run (for profiling; the report then has gaps)")
	fs.StringVar(&phaseList, "phases", defaultPhases, "comma-separated parts to run (growth also needs -growth N above 0)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.smoke {
		o.smokeDefaults(set, &phaseList)
	}
	if err := o.parseLists(conc, only, phaseList); err != nil {
		return nil, err
	}
	sides, err := partitionSidesOf(partSides)
	if err != nil {
		return nil, err
	}
	o.partitionSides = sides
	if err := o.check(); err != nil {
		return nil, err
	}
	return o, nil
}

// smokeDefaults sets -smoke's defaults for the flags not given explicitly (set).
func (o *options) smokeDefaults(set map[string]bool, phaseList *string) {
	defaults := map[string]func(){
		"rounds":         func() { o.rounds = 1 },
		"cell":           func() { o.cell = 300 * time.Millisecond },
		"warmup":         func() { o.warmup = 200 * time.Millisecond },
		"drain-keys":     func() { o.drainKeys = 200 },
		"backlog":        func() { o.backlog = 3000 },
		"live-window":    func() { o.liveWindow = 500 * time.Millisecond },
		"docs":           func() { o.docs = "" },
		"phases":         func() { *phaseList = "rounds,wal,slow,drain,retention,dups,growth,refusals" },
		"growth":         func() { o.growth = 10000 },
		"growth-configs": func() { o.growthConfigs = "default" },
		"dup-sleep":      func() { o.dupSleep = time.Second },
		"refusal-n":      func() { o.refusalN = 500 },
	}
	for name, apply := range defaults {
		if !set[name] {
			apply()
		}
	}
}

// parseLists parses the list flags: -conc, -only and -phases.
func (o *options) parseLists(conc, only, phaseList string) error {
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 256 {
			return fmt.Errorf("-conc: %q is not a concurrency in 1..256", s)
		}
		o.conc = append(o.conc, n)
	}
	if only != "" {
		o.only = strings.Split(only, ",")
	}
	if d := o.partitionCleanupDays; d < 1 || d > 365 {
		return fmt.Errorf("-partition-cleanup-days: %d is not between 1 and 365", d)
	}
	if c := o.partitionConc; c < 1 || c > 64 {
		return fmt.Errorf("-partition-conc: %d is not between 1 and 64", c)
	}
	if a := o.partitionCleanupAttached; a < 0 || a > o.partitionCleanupDays {
		return fmt.Errorf("-partition-cleanup-attached: %d is not between 0 and -partition-cleanup-days (%d)", a, o.partitionCleanupDays)
	}
	if w := o.partitionCleanupWidth; w < time.Minute || w%time.Minute != 0 || (24*time.Hour)%w != 0 {
		return fmt.Errorf("-partition-cleanup-width: %s does not divide a day into whole minutes", w)
	}
	o.phases = map[string]bool{}
	for _, p := range strings.Split(phaseList, ",") {
		switch p = strings.TrimSpace(p); p {
		case "rounds", "wal", "perf", "slow", "drain", "retention", "dups", "losers", "growth", "partitions", "refusals", "crowd":
			o.phases[p] = true
		default:
			return fmt.Errorf("-phases: unknown part %q", p)
		}
	}
	return nil
}

// usesVariants reports whether a part that sends requests to the variants runs: every
// part but refusals and crowd.
func (o *options) usesVariants() bool {
	for p := range o.phases {
		if p != "refusals" && p != "crowd" {
			return true
		}
	}
	return false
}

// check refuses flag values that make no run.
func (o *options) check() error {
	switch {
	case o.rounds < 1:
		return errors.New("-rounds must be at least 1")
	case o.cell <= 0 || o.warmup < 0:
		return errors.New("-cell must be positive and -warmup not negative")
	case o.drainKeys < 1 || o.sweepers < 1 || o.sweepConc < 1:
		return errors.New("-drain-keys, -sweepers and -sweeper-concurrency must be positive")
	case o.backlog < 1 || o.liveWindow <= 0:
		return errors.New("-backlog and -live-window must be positive")
	case o.growth < 0:
		return errors.New("-growth must not be negative")
	case o.refusalN < 1 || o.refusalConc < 1:
		return errors.New("-refusal-n and -refusal-conc must be positive")
	case o.crowdClient != "conn" && o.crowdClient != "transport":
		return errors.New("-crowd-client must be conn or transport")
	case o.crowdConc < 1 || o.crowdLive < 1 || o.crowdBase <= 0 || o.crowdDur <= 0 || o.crowdTimeout <= 0 || o.crowdCPU < 0:
		return errors.New("-crowd-conc, -crowd-live, -crowd-base, -crowd-dur and -crowd-timeout must be positive, -crowd-cpu not negative")
	case o.loserGap < time.Millisecond:
		return errors.New("-loser-gap must be at least 1ms")
	case o.dupSleep < 100*time.Millisecond:
		return errors.New("-dup-sleep must be at least 100ms")
	case o.distribute != "auto" && o.distribute != "on" && o.distribute != "off":
		return errors.New("-distribute must be auto, on or off")
	case o.citus && (o.db != "" || o.distribute == "off"):
		return errors.New("-citus starts a cluster of its own: not with -db or -distribute off")
	}
	return nil
}

func main() {
	if len(os.Args) > 1 {
		if sub, ok := subcommands[os.Args[1]]; ok {
			if err := sub(os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "bench %s: %v\n", os.Args[1], err)
				os.Exit(1)
			}
			return
		}
	}
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := 0
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		code = 1
	}
	if code != 0 {
		stop()
		pprof.StopCPUProfile()
		os.Exit(code)
	}
}

// run is the whole benchmark. Its error means an error or an invariant violation.
func run(ctx context.Context, o *options) error {
	started := time.Now()
	env, err := newEnv(ctx, o)
	if err != nil {
		return err
	}
	defer env.close(o.keep)

	rep := &report{opts: o, started: started, machine: env.machine, args: os.Args[1:], figs: env.figs}
	var violations []string
	logf("database %s on %s (PostgreSQL %s, fsync=%s)", env.db.name, redactURL(env.db.serverURL), env.machine.pgVersion, env.machine.fsync)

	if err := env.loadPhases(ctx, o, rep); err != nil {
		return err
	}
	if err := env.keyPhases(ctx, o, rep); err != nil {
		return err
	}
	if rep.dups != nil {
		violations = append(violations, rep.dups.violations()...)
	}
	if rep.losers != nil {
		violations = append(violations, rep.losers.violations()...)
	}
	if env.pgss {
		texts, err := env.stmtTexts(ctx)
		if err != nil {
			return err
		}
		rep.stmtTexts = texts
	}
	rep.finished = time.Now()
	if o.rtProfile {
		for _, v := range env.variants {
			printRTProfile(v)
		}
	}

	// The fused recipe's effects over the whole run.
	fc, problems := env.verifyFused(ctx, "fused_keys", "fused:", env.fast.URL, env.slow.URL)
	rep.fused = &fc
	violations = append(violations, problems...)
	sc, problems := env.verifyFused(ctx, "safe_keys", "safe:", env.fast.URL, env.slow.URL)
	rep.fusedSafe = &sc
	violations = append(violations, problems...)

	violations = append(violations, rep.violations()...)
	out := rep.markdown()
	fmt.Println()
	fmt.Println(out)
	if o.docs != "" {
		if err := rep.write(o.docs); err != nil {
			return err
		}
		logf("wrote %s/BENCHMARKS.md and %s/%s", o.docs, o.docs, chartFile)
	}
	if len(violations) > 0 {
		return fmt.Errorf("%d invariant violation(s):\n  %s", len(violations), strings.Join(violations, "\n  "))
	}
	return nil
}

// loadPhases runs the phases that put load on the variants: the throughput rounds
// (provider latency 0), the WAL and CPU profiles, and the slow-provider round.
func (env *env) loadPhases(ctx context.Context, o *options, rep *report) error {
	// Throughput rounds, provider latency 0. A run of the refusals part alone warms
	// nothing: it sends no request to the variants.
	if o.usesVariants() {
		if err := env.warmup(ctx, o.warmup); err != nil {
			return err
		}
	}
	if o.phases["rounds"] {
		for r := 0; r < o.rounds; r++ {
			cells, err := env.round(ctx, r, false)
			rep.cells = append(rep.cells, cells...)
			if err != nil {
				return err
			}
		}
	}
	// Where each variant's WAL goes.
	if o.phases["wal"] {
		wal, err := env.walProfiles(ctx, min(o.cell, 2*time.Second))
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			logf("no WAL profile: %v", err) // a diagnostic: the run goes on without it
		}
		rep.wal = wal
	}
	// Where the server's CPU goes, when perf is there.
	if o.phases["perf"] {
		rep.perf = env.perfProfiles(ctx, o.conc[len(o.conc)/2], 4*time.Second)
	}
	// One round with a slow provider, watching connections during the calls.
	if o.phases["slow"] {
		slow, act, err := env.slowRun(ctx)
		if err != nil {
			return err
		}
		rep.slowCells, rep.activity = slow, act
	}
	return nil
}

// keyPhases runs the phases about keys: the sweeper drain, retention cleanup,
// duplicates of a key in flight, and the growth of the key table.
func (env *env) keyPhases(ctx context.Context, o *options, rep *report) error {
	// Sweeper drain: 1 process, then o.sweepers processes.
	if o.phases["drain"] {
		for _, procs := range []int{1, o.sweepers} {
			d, err := env.drain(ctx, procs)
			if err != nil {
				return err
			}
			rep.drains = append(rep.drains, d)
		}
	}
	// Retention cleanup under live traffic.
	if o.phases["retention"] {
		ret, err := env.retention(ctx)
		if err != nil {
			return err
		}
		rep.retention = ret
	}
	// Duplicates of a key whose first attempt is inside a long first phase.
	if o.phases["dups"] {
		d, err := env.duplicates(ctx)
		if err != nil {
			return err
		}
		rep.dups = d
	}
	// Copies of held keys: round trips per exec mode, and beside fresh requests.
	if o.phases["losers"] {
		l, err := env.losers(ctx)
		if err != nil {
			return err
		}
		rep.losers = l
	}
	if o.phases["partitions"] { // partitions.go: its budget figures go to env.figs
		if err := env.partitionsRun(ctx); err != nil {
			return err
		}
	}
	// What a refused request costs beside a bare 503 (refusals.go: its budget figures
	// go to env.figs).
	if o.phases["refusals"] {
		if err := env.refusals(ctx); err != nil {
			return err
		}
	}
	// Goodput under a crowd 4× the capacity (crowd.go: its figures go to env.figs).
	if o.phases["crowd"] {
		if err := env.crowdRounds(ctx); err != nil {
			return err
		}
	}
	// Many retained finished keys against an empty table.
	if o.phases["growth"] && o.growth > 0 {
		g, err := env.growth(ctx)
		if err != nil {
			return err
		}
		rep.growths = g
	}
	return nil
}

// logf prints progress to stderr, so that stdout holds only the report.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
