package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/workflow"
)

// childCommand is the hidden subcommand that runs one sweeper process.
const childCommand = "__sweeper"

// childReport is what a sweeper process prints when it is done.
type childReport struct {
	Passes       int     `json:"passes"`
	Taken        int     `json:"taken"`
	Finished     int     `json:"finished"`
	Released     int     `json:"released"`
	DeadLettered int     `json:"dead_lettered"`
	LeaseLost    int     `json:"lease_lost"`
	GivenBack    int     `json:"given_back"`
	Expired      int64   `json:"expired"`
	Errors       int     `json:"errors"`
	LastError    string  `json:"last_error,omitempty"`
	Seconds      float64 `json:"seconds"` // from "go" to done

	// What the process spent from "go" to done (drain mode): its pool's statements,
	// round trips and commits (the bench's tracer), its own CPU (getrusage), the passes
	// that took some keys but fewer than a batch and those that took none (each
	// followed by the loop's Interval), and the time its round trips took, by kind (the
	// first words of each statement of the round trip).
	Statements  int64              `json:"statements"`
	RoundTrips  int64              `json:"round_trips"`
	Commits     int64              `json:"commits"`
	CPUMs       float64            `json:"cpu_ms"`
	ShortPasses int                `json:"short_passes"`
	EmptyPasses int                `json:"empty_passes"`
	RTMs        map[string]float64 `json:"rt_ms,omitempty"`
	RTCalls     map[string]int     `json:"rt_calls,omitempty"`
}

func (r *childReport) add(o childReport) {
	r.Passes += o.Passes
	r.Taken += o.Taken
	r.Finished += o.Finished
	r.Released += o.Released
	r.DeadLettered += o.DeadLettered
	r.LeaseLost += o.LeaseLost
	r.GivenBack += o.GivenBack
	r.Expired += o.Expired
	r.Errors += o.Errors
	r.Statements += o.Statements
	r.RoundTrips += o.RoundTrips
	r.Commits += o.Commits
	r.CPUMs += o.CPUMs
	r.ShortPasses += o.ShortPasses
	r.EmptyPasses += o.EmptyPasses
	for k, v := range o.RTMs {
		if r.RTMs == nil {
			r.RTMs, r.RTCalls = map[string]float64{}, map[string]int{}
		}
		r.RTMs[k] += v
		r.RTCalls[k] += o.RTCalls[k]
	}
	if o.LastError != "" {
		r.LastError = o.LastError
	}
	r.Seconds = max(r.Seconds, o.Seconds)
}

// runChild is a sweeper process: it connects, prints "ready", waits for "go" on stdin,
// then either runs the sweeper's background loop until "stop" (mode drain) or one
// pass (mode cleanup, Engine.Sweep), and prints a childReport as JSON.
func runChild(args []string) error {
	fs := flag.NewFlagSet(childCommand, flag.ContinueOnError)
	db := childDBFlags(fs)
	providerURL := fs.String("provider", "", "provider base URL")
	mode := fs.String("mode", "drain", "drain or cleanup")
	conc := fs.Int("concurrency", workflow.SweepConcurrencyDefault, "workflow.SweeperConfig.Concurrency")
	batch := fs.Int("batch", workflow.SweepBatchSizeDefault, "workflow.SweeperConfig.BatchSize")
	interval := fs.Duration("interval", 10*time.Millisecond, "workflow.SweeperConfig.Interval")
	cleanupBatch := fs.Int("cleanup-batch", workflow.CleanupBatchDefault, "workflow.SweeperConfig.CleanupBatch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	tr := &tracer{prof: &rtProfile{}}
	pool, err := db.tracedPool(ctx, appSweeper, int32(*conc+4), tr)
	if err != nil {
		return err
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng, err := workflow.New(pool, &workflow.Config{Logger: log})
	if err != nil {
		return err
	}
	client := &chargeflow.ProviderClient{BaseURL: *providerURL, HTTP: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	if err := eng.Register(chargeflow.Flow(client)); err != nil {
		return err
	}
	var mu sync.Mutex
	var rep childReport
	swCfg := &workflow.SweeperConfig{
		Interval: *interval, Grace: -1, BatchSize: *batch, Concurrency: *conc, CleanupBatch: *cleanupBatch,
		Logger: log,
		Hooks: workflow.SweeperHooks{Pass: func(_ context.Context, st workflow.SweepStats, err error) {
			mu.Lock()
			defer mu.Unlock()
			rep.addPass(st, err)
			switch {
			case st.Taken == 0:
				rep.EmptyPasses++
			case st.Taken < *batch:
				rep.ShortPasses++
			}
		}},
	}
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() {
		return errors.New("stdin closed before go")
	}
	start, t0, cpu0 := time.Now(), tr.snapshot(), cpumeter.Self()
	tr.prof.reset()
	if err := runMode(ctx, *mode, eng, swCfg, in); err != nil {
		return err
	}
	mu.Lock()
	rep.Seconds = time.Since(start).Seconds()
	rep.CPUMs = ms(cpumeter.Self() - cpu0)
	d := tr.snapshot().sub(t0)
	rep.Statements, rep.RoundTrips, rep.Commits = d.Statements, d.RoundTrips, d.Commits
	rep.RTMs, rep.RTCalls = tr.prof.totals()
	out, err := json.Marshal(rep)
	mu.Unlock()
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// addPass adds one sweeper pass's counts and error to r.
func (r *childReport) addPass(st workflow.SweepStats, err error) {
	r.Passes++
	r.Taken += st.Taken
	r.Finished += st.Finished
	r.Released += st.Released
	r.DeadLettered += st.DeadLettered
	r.LeaseLost += st.LeaseLost
	r.GivenBack += st.GivenBack
	r.Expired += st.Expired
	if err != nil {
		r.Errors++
		r.LastError = err.Error()
	}
}

// runMode runs eng's sweeper with cfg as mode says: its background loop until "stop" on
// in (drain), or one pass (cleanup).
func runMode(ctx context.Context, mode string, eng *workflow.Engine, cfg *workflow.SweeperConfig, in *bufio.Scanner) error {
	switch mode {
	case "drain":
		if err := eng.Start(ctx, cfg); err != nil {
			return err
		}
		in.Scan() // "stop", or EOF when the parent goes away
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := eng.Stop(stopCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("stop sweeper: %w", err)
		}
	case "cleanup":
		if _, err := eng.Sweep(ctx, cfg); err != nil {
			return fmt.Errorf("sweeper pass: %w", err)
		}
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	return nil
}

// startChildren starts n sweeper processes and waits until each is ready.
func (e *env) startChildren(ctx context.Context, n int, providerURL string, extra ...string) ([]*child, error) {
	var kids []*child
	for range n {
		k, err := e.startChild(ctx, "sweeper process", nil, childCommand, append([]string{"-provider", providerURL}, extra...)...)
		if err != nil {
			return kids, err
		}
		kids = append(kids, k)
	}
	for _, k := range kids {
		if !k.out.Scan() || k.out.Text() != "ready" {
			return kids, fmt.Errorf("sweeper process %d did not get ready (%q)", k.cmd.Process.Pid, k.out.Text())
		}
	}
	return kids, nil
}

// finish reads the sweeper process's report and waits for it to exit.
func (k *child) finish() (childReport, error) {
	var rep childReport
	if !k.out.Scan() {
		_ = k.cmd.Wait()
		return rep, fmt.Errorf("sweeper process %d exited without a report (%v)", k.cmd.Process.Pid, k.cmd.ProcessState)
	}
	if err := json.Unmarshal(k.out.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("sweeper process report %q: %w", k.out.Text(), err)
	}
	_ = k.stdin.Close()
	if err := k.cmd.Wait(); err != nil {
		return rep, fmt.Errorf("sweeper process: %w", err)
	}
	return rep, nil
}

// drainResult is one sweeper drain.
type drainResult struct {
	Procs       int
	Concurrency int // workflow.SweeperConfig.Concurrency of each process
	Keys        int
	Setup       time.Duration
	Elapsed     time.Duration
	KeysPerSec  float64
	Child       childReport // summed over the processes

	// Cost per drained key over the drain: the server's CPU (every process of it; NaN
	// when remote), this process's (the fake provider, the polling), and pg_stat_statements'
	// advance (nil when not loaded).
	ServerCPU, BenchCPU float64 // ms per key
	Stmts               map[int64]stmtStat
	texts               map[int64]string

	// Verification.
	FinishedKeys      int // keys finished with a 201
	Charges           int // charge rows of the drained keys
	DistinctCharges   int // distinct keys among them
	Succeeded         int // charges marked succeeded
	ProviderRequests  int
	ProviderPayments  int
	ProviderKeys      int // distinct derived keys the provider saw
	ProviderKeysTwice int // derived keys the provider saw more than once
	LockVersions      map[int64]int
	Problems          []string
}

// scopes returns the 16 scopes of a key set.
func scopes(prefix string) []string {
	out := make([]string, 16)
	for i := range out {
		out[i] = prefix + "_" + strconv.Itoa(i)
	}
	return out
}

// drain creates o.drainKeys stuck keys and lets procs sweeper processes finish them.
//
// The keys are made stuck the way clients leave them: each runs through the engine
// with a provider that answers 503, so its create_charge phase commits (the charge row
// and the recovery point) and the key is released at that point, due one second
// later. The sweepers then take them over, call a healthy provider with the derived
// key, and finalize.
func (e *env) drain(ctx context.Context, procs int) (*drainResult, error) {
	res := &drainResult{Procs: procs, Concurrency: e.o.sweepConc, Keys: e.o.drainKeys}
	sc := scopes(fmt.Sprintf("drain%d_%s", procs, e.runID))

	// The statistics of the steady state, gathered before the outage that leaves the
	// backlog: without this, whether autovacuum happened to analyse the key table
	// between the rounds and the backlog decides the plans the drain's statements get
	// (docs/BENCHMARKS.md, "The drain's per-key statements").
	if _, err := e.check.Exec(ctx, `ANALYZE idemflow_keys`); err != nil {
		return nil, fmt.Errorf("analyze the key table: %w", err)
	}
	setupStart := time.Now()
	if err := e.makeStuckKeys(ctx, e.variant(vIdem), sc, res.Keys); err != nil {
		return nil, err
	}
	res.Setup = time.Since(setupStart)

	var called atomic.Int64
	provSrv := httptest.NewServer(countCalls(chargeflow.NewProvider(0, 0).Handler(), &called))
	defer provSrv.Close()
	kids, err := e.startChildren(ctx, procs, provSrv.URL, "-mode", "drain",
		"-concurrency", strconv.Itoa(e.o.sweepConc))
	defer killAll(kids)
	if err != nil {
		return nil, err
	}
	logf("drain: %d stuck keys, %d sweeper process(es) x concurrency %d", res.Keys, procs, e.o.sweepConc)
	if err := e.runDrain(ctx, res, sc, kids, &called); err != nil {
		return nil, err
	}
	if res.Child, err = stopSweepers(kids); err != nil {
		return nil, err
	}
	logf("drain: %d processes: %.0f keys/s (%s)", procs, res.KeysPerSec, res.Elapsed.Round(time.Millisecond))
	res.logCost()
	return res, e.verifyDrain(ctx, res, sc, provSrv)
}

// drainMark is what a drain reads before the sweepers start, to measure it from.
type drainMark struct {
	stmts   map[int64]stmtStat // pg_stat_statements (nil when not loaded)
	dbStart time.Time          // the database clock
	table   tableStats
	cpu     cpumeter.Times // read just before the start signal
}

// runDrain starts the ready sweepers kids and waits until they have finished every
// key of the scopes sc (the provider has answered every key, called counting), and
// sets res's time and cost figures.
func (e *env) runDrain(ctx context.Context, res *drainResult, sc []string, kids []*child, called *atomic.Int64) error {
	mark, err := e.markDrain(ctx)
	if err != nil {
		return err
	}
	smp := e.startDrainSampler(ctx, e.o.drainSample)
	mark.cpu = e.readCPU(false)
	for _, k := range kids {
		if err := k.send("go"); err != nil {
			return err
		}
	}
	limit := max(2*time.Minute, time.Duration(res.Keys)*20*time.Millisecond)
	err = e.waitFor(ctx, limit, func() (bool, error) {
		// The database is asked only once the provider has answered every key: the
		// count is a scan whose server CPU would otherwise be the drain's.
		if called.Load() < int64(res.Keys) {
			return false, nil
		}
		var left int
		err := e.check.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys
			WHERE scope = ANY($1) AND status <> 'finished'`, sc).Scan(&left)
		return left == 0, err
	})
	cpu := e.readCPU(true)
	smp.finish()
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	return e.measureDrain(ctx, res, sc, mark, cpu)
}

// markDrain reads the figures a drain is measured from.
func (e *env) markDrain(ctx context.Context) (drainMark, error) {
	var m drainMark
	var err error
	if e.pgss {
		if m.stmts, err = e.stmtSnapshot(ctx); err != nil {
			return m, err
		}
	}
	// The drain's time runs, by the database clock, from just before the start signal to
	// the last key's finish: the polling, which notices the end later, adds nothing.
	if err := e.check.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&m.dbStart); err != nil {
		return m, err
	}
	m.table, err = e.keyTableStats(ctx)
	return m, err
}

// measureDrain sets res's time and cost figures of the drain of the scopes sc from
// mark, cpu the CPU times read at its end.
func (e *env) measureDrain(ctx context.Context, res *drainResult, sc []string, mark drainMark, cpu cpumeter.Times) error {
	table, err := e.keyTableStats(ctx)
	if err != nil {
		return err
	}
	logTableStats(mark.table, table, res.Keys)
	var last time.Time
	if err := e.check.QueryRow(ctx, `SELECT max(finished_at) FROM idemflow_keys WHERE scope = ANY($1)`, sc).Scan(&last); err != nil {
		return err
	}
	res.Elapsed = last.Sub(mark.dbStart)
	res.KeysPerSec = float64(res.Keys) / res.Elapsed.Seconds()
	res.ServerCPU, res.BenchCPU = math.NaN(), ms(cpu.Client-mark.cpu.Client)/float64(res.Keys)
	if e.cpu.Local() {
		res.ServerCPU = ms(cpu.Server-mark.cpu.Server) / float64(res.Keys)
	}
	if !e.pgss {
		return nil
	}
	stmts, err := e.stmtSnapshot(ctx)
	if err != nil {
		return err
	}
	res.Stmts = stmtDelta(mark.stmts, stmts)
	res.texts, err = e.stmtTexts(ctx)
	return err
}

// stopSweepers tells the sweepers kids to stop and sums their reports.
func stopSweepers(kids []*child) (childReport, error) {
	for _, k := range kids {
		if err := k.send("stop"); err != nil {
			return childReport{}, err
		}
	}
	var sum childReport
	for _, k := range kids {
		rep, err := k.finish()
		if err != nil {
			return childReport{}, err
		}
		sum.add(rep)
	}
	return sum, nil
}

// logCost logs where a drain's time went, per key: CPU of the server, the sweepers
// and this process; the sweepers' round trips, statements and commits; the time their
// round trips took by kind; the server's costliest statements.
func (d *drainResult) logCost() {
	n := float64(d.Keys)
	c := d.Child
	logf("drain: per key: CPU ms %.3f server, %.3f sweepers, %.3f bench (provider, polling); %.2f round trips, %.2f statements, %.2f commits; of %d passes %d short and %d empty (each then waits the interval)",
		d.ServerCPU, c.CPUMs/n, d.BenchCPU, float64(c.RoundTrips)/n, float64(c.Statements)/n, float64(c.Commits)/n, c.Passes, c.ShortPasses, c.EmptyPasses)
	type kind struct {
		label string
		ms    float64
		calls int
	}
	var ks []kind
	for l, v := range c.RTMs {
		ks = append(ks, kind{l, v, c.RTCalls[l]})
	}
	slices.SortFunc(ks, func(a, b kind) int { return -cmpFloat(a.ms, b.ms) })
	for _, k := range ks[:min(len(ks), 8)] {
		logf("drain:   round trip %-60.60q %6.3f per key, %7.3f ms each (summed over the workers)", k.label, float64(k.calls)/n, k.ms/float64(k.calls))
	}
	var ss []stmtRow
	for id, s := range d.Stmts {
		ss = append(ss, stmtRow{ID: id, Text: d.texts[id], Calls: float64(s.Calls) / n, Exec: s.Exec / n, Plan: s.Plan / n})
	}
	slices.SortFunc(ss, func(a, b stmtRow) int { return -cmpFloat(a.total(), b.total()) })
	for _, s := range ss[:min(len(ss), 8)] {
		st := d.Stmts[s.ID]
		logf("drain:   statement %-60.60q %6.3f calls, %6.3f ms per key; per call %.1f rows, %.1f buffers",
			s.Text, s.Calls, s.total(), float64(st.Rows)/float64(st.Calls), float64(st.Blks)/float64(st.Calls))
	}
}

// countCalls is h counting in n the requests it answered.
func countCalls(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		n.Add(1)
	})
}

// makeStuckKeys makes keys stuck the way clients leave them: each charge runs through
// the engine with a provider that answers 503, so create_charge commits and the key is
// released there. It returns when every key is due, by the database clock.
func (e *env) makeStuckKeys(ctx context.Context, idem *variant, sc []string, keys int) error {
	failing := httptest.NewServer(chargeflow.NewProvider(0, 1).Handler())
	defer failing.Close()
	eng, err := e.engine(idem.pool, failing.URL, workflow.Hooks{})
	if err != nil {
		return err
	}
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for w := range slices.Max(e.o.conc) {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(keys) || ctx.Err() != nil {
					return
				}
				_, err := eng.Do(ctx, workflow.Request{Scope: sc[int(i)%16], Key: fmt.Sprintf("stuck-%d", i),
					Flow: chargeflow.FlowName, Method: "POST", Route: chargeRoute, Body: chargeBody})
				var te *workflow.TransientError
				if !errors.As(err, &te) {
					failed.Add(1)
					once.Do(func() { firstErr = fmt.Errorf("worker %d: want a transient failure, got %v", w, err) })
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		return fmt.Errorf("make stuck keys: %d failed: %w", failed.Load(), firstErr)
	}
	// Wait until every key is due (released one second after its failure), by the
	// database clock.
	if err := e.waitFor(ctx, time.Minute, func() (bool, error) {
		var n, notDue int
		err := e.check.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE next_attempt_at > statement_timestamp()
				OR locked_until > statement_timestamp() OR recovery_point <> $2 OR status <> 'in_progress')
			FROM idemflow_keys WHERE scope = ANY($1)`, sc, "create_charge").Scan(&n, &notDue)
		if err == nil && n != keys {
			err = fmt.Errorf("%w: %d stuck keys made, want %d", errInvariant, n, keys)
		}
		return notDue == 0, err
	}); err != nil {
		return fmt.Errorf("wait for the stuck keys to be due: %w", err)
	}
	return nil
}

// verifyDrain checks that every stuck key was finished exactly once: one charge row
// per key, succeeded, and one provider request and payment per derived key.
func (e *env) verifyDrain(ctx context.Context, res *drainResult, sc []string, provSrv *httptest.Server) error {
	err := e.check.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys
		WHERE scope = ANY($1) AND status = 'finished' AND response_status = 201`, sc).Scan(&res.FinishedKeys)
	if err != nil {
		return err
	}
	err = e.check.QueryRow(ctx, `SELECT count(*), count(DISTINCT (account_id, idempotency_key)),
			count(*) FILTER (WHERE status = 'succeeded')
		FROM charges WHERE account_id = ANY($1)`, sc).Scan(&res.Charges, &res.DistinctCharges, &res.Succeeded)
	if err != nil {
		return err
	}
	rows, err := e.check.Query(ctx, `SELECT lock_version, count(*) FROM idemflow_keys
		WHERE scope = ANY($1) GROUP BY 1`, sc)
	if err != nil {
		return err
	}
	res.LockVersions = map[int64]int{}
	for rows.Next() {
		var v int64
		var n int
		if err := rows.Scan(&v, &n); err != nil {
			return err
		}
		res.LockVersions[v] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	resp, err := e.httpClient.Get(provSrv.URL + "/v1/stats")
	if err != nil {
		return err
	}
	var st chargeflow.ProviderStats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("provider stats: %w", err)
	}
	res.ProviderRequests, res.ProviderPayments, res.ProviderKeys = st.Requests, st.Payments, len(st.ByKey)
	for _, ks := range st.ByKey {
		if ks.Requests > 1 {
			res.ProviderKeysTwice++
		}
	}
	n := res.Keys
	check := func(ok bool, format string, args ...any) {
		if !ok {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}
	check(res.FinishedKeys == n, "%d of %d keys finished with 201", res.FinishedKeys, n)
	check(res.Charges == n && res.DistinctCharges == n, "%d charge rows for %d distinct keys, want %d each", res.Charges, res.DistinctCharges, n)
	check(res.Succeeded == n, "%d charges succeeded, want %d", res.Succeeded, n)
	check(res.ProviderPayments == n && res.ProviderKeys == n, "provider: %d payments for %d derived keys, want %d each", res.ProviderPayments, res.ProviderKeys, n)
	check(res.ProviderKeysTwice == 0, "provider: %d derived keys were called more than once", res.ProviderKeysTwice)
	check(res.Child.Finished == n, "sweepers report %d keys finished, want %d", res.Child.Finished, n)
	check(res.Child.LeaseLost == 0 && res.Child.DeadLettered == 0, "sweepers report %d leases lost and %d dead-lettered", res.Child.LeaseLost, res.Child.DeadLettered)
	return nil
}

func (e *env) waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// liveWindow is live traffic over one window of the retention run.
type liveWindow struct {
	N         int
	Elapsed   time.Duration
	RPS       float64
	P50, P99  time.Duration
	LockWaits int            // live backends seen waiting on a lock
	Waits     map[string]int // every backend seen waiting on a lock: "application: wait event" -> samples
	Samples   int
	lats      []time.Duration
}

// retentionResult is the retention run.
type retentionResult struct {
	Backlog    int
	Conc       int
	InsertTime time.Duration
	Base       liveWindow // backlog present, no cleanup
	During     liveWindow // the cleanup running in a sweeper process
	After      liveWindow // backlog gone
	// NoCleanupP99 is the p99 of the before and after windows together.
	NoCleanupP99 time.Duration
	CleanupTime  time.Duration
	Expired      int64
	Left         int
	Problems     []string
}

// retention inserts an expired backlog and measures live traffic before, during and
// after one sweeper process cleans it up.
func (e *env) retention(ctx context.Context) (*retentionResult, error) {
	res := &retentionResult{Backlog: e.o.backlog, Conc: e.o.conc[len(e.o.conc)/2]}
	prefix := "expired_" + e.runID
	sc := scopes(prefix)
	idem := e.variant(vIdem)

	if err := e.insertBacklog(ctx, prefix, res); err != nil {
		return nil, err
	}
	live := idem.fast
	window := func(w *liveWindow, l load, s *sampler) (err error) {
		*w, err = liveWindowOf(l, s)
		return err
	}
	// Baseline: backlog present, nothing cleaning it.
	s := e.startSampler(ctx, 5*time.Millisecond, nil)
	if err := window(&res.Base, e.runLoad(ctx, live, res.Conc, e.o.liveWindow, nil), s); err != nil {
		return nil, err
	}

	// During: a sweeper process deletes the backlog (one pass: batches until none left).
	rep, err := e.cleanupWindow(ctx, live, res)
	if err != nil {
		return nil, err
	}
	res.CleanupTime = time.Duration(rep.Seconds * float64(time.Second))
	res.Expired = rep.Expired

	// After: backlog gone.
	s = e.startSampler(ctx, 5*time.Millisecond, nil)
	if err := window(&res.After, e.runLoad(ctx, live, res.Conc, e.o.liveWindow, nil), s); err != nil {
		return nil, err
	}

	// The baseline is both windows without a cleanup running, before and after it.
	both := slices.Concat(res.Base.lats, res.After.lats)
	slices.Sort(both)
	res.NoCleanupP99 = quantile(both, 0.99)

	if err := e.checkRetention(ctx, sc, res, rep); err != nil {
		return nil, err
	}
	logf("retention: %d keys expired in %s; live p99 %.2f ms before, %.2f ms during, %.2f ms after (lock waits during: %v)",
		res.Expired, res.CleanupTime.Round(time.Millisecond), ms(res.Base.P99), ms(res.During.P99), ms(res.After.P99), res.During.Waits)
	return res, nil
}

// insertBacklog inserts res.Backlog finished keys that finished two days ago, under
// scopes named by prefix, and records how long it took.
func (e *env) insertBacklog(ctx context.Context, prefix string, res *retentionResult) error {
	pool := e.check
	logf("retention: inserting %d expired finished keys", res.Backlog)
	t0 := time.Now()
	_, err := pool.Exec(ctx, `
		INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body,
			recovery_point, phase_data, status, response_status, response_headers, response_body,
			created_at, updated_at, finished_at)
		SELECT $1 || '_' || (i % 16), 'old-' || i, gen_random_uuid(), 'create_charge', 'POST', '/v1/charges',
			sha256(('old-' || i)::bytea), $2::bytea, 'finished', '{"charge_id":"ch_old"}', 'finished', 201,
			'{"Content-Type":["application/json"],"Location":["/v1/charges/ch_old"]}', $3::bytea,
			t, t, t
		FROM generate_series(1, $4::int) AS i,
			LATERAL (SELECT now() - interval '2 days' - i * interval '1 millisecond' AS t) AS ts`,
		prefix, chargeBody,
		[]byte(`{"id":"ch_old","amount":1999,"currency":"usd","source":"tok_visa","status":"succeeded","provider_payment_id":"pay_000001"}`),
		res.Backlog)
	if err != nil {
		return fmt.Errorf("insert the backlog: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) idemflow_keys"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	_, _ = pool.Exec(ctx, "CHECKPOINT") // needs superuser or pg_checkpoint; optional
	res.InsertTime = time.Since(t0)
	return nil
}

// liveWindowOf is a window of live traffic: the load l and what sampler s saw meanwhile.
func liveWindowOf(l load, s *sampler) (liveWindow, error) {
	a, err := s.finish()
	if err != nil {
		return liveWindow{}, err
	}
	if l.errs > 0 {
		return liveWindow{}, fmt.Errorf("live traffic: %d requests failed: %w", l.errs, l.firstErr)
	}
	return liveWindow{N: l.n, Elapsed: l.elapsed, RPS: float64(l.n) / l.elapsed.Seconds(),
		P50: quantile(l.lats, 0.5), P99: quantile(l.lats, 0.99), LockWaits: a.LockWaitsSeen, Waits: a.Waits,
		Samples: a.Samples, lats: l.lats}, nil
}

// cleanupWindow runs live traffic while a sweeper process deletes the backlog (in
// one pass: batches until none is left), into res.During, and returns the child's report.
func (e *env) cleanupWindow(ctx context.Context, live doFunc, res *retentionResult) (childReport, error) {
	kids, err := e.startChildren(ctx, 1, e.fast.URL, "-mode", "cleanup")
	defer killAll(kids)
	if err != nil {
		return childReport{}, err
	}
	stop := make(chan struct{})
	var l load
	done := make(chan struct{})
	s := e.startSampler(ctx, 5*time.Millisecond, nil)
	go func() {
		defer close(done)
		l = e.runLoadUntil(ctx, live, res.Conc, stop, nil)
	}()
	if err := kids[0].send("go"); err != nil {
		close(stop)
		<-done
		return childReport{}, err
	}
	rep, err := kids[0].finish()
	close(stop)
	<-done
	if err != nil {
		return childReport{}, err
	}
	if res.During, err = liveWindowOf(l, s); err != nil {
		return childReport{}, err
	}
	return rep, nil
}

// checkRetention records in res.Problems what the cleanup left or deleted wrongly.
func (e *env) checkRetention(ctx context.Context, sc []string, res *retentionResult, rep childReport) error {
	if err := e.check.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE scope = ANY($1)`, sc).Scan(&res.Left); err != nil {
		return err
	}
	if res.Left != 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d expired keys left after the cleanup", res.Left))
	}
	if res.Expired != int64(res.Backlog) {
		res.Problems = append(res.Problems, fmt.Sprintf("the cleanup deleted %d keys, the backlog was %d (live keys deleted?)", res.Expired, res.Backlog))
	}
	if rep.Errors > 0 {
		res.Problems = append(res.Problems, "the cleanup pass failed: "+rep.LastError)
	}
	return nil
}
