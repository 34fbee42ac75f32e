package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cell is one variant at one concurrency in one round.
type cell struct {
	Variant string
	Conc    int
	Round   int
	Slow    bool
	N       int
	Elapsed time.Duration
	RPS     float64
	P50     time.Duration
	P99     time.Duration
	Per     perReq
	Stmts   map[int64]stmtStat // pg_stat_statements' advance over the cell, when loaded
}

// perReq are a cell's costs divided by its requests.
type perReq struct {
	Statements    float64 // tracer
	RoundTrips    float64 // tracer: queries + batches
	Wire          float64 // sockets: client-to-server turns
	TracerCommits float64 // tracer: COMMITs and autocommit statements/batches
	Commits       float64 // pg_stat_database.xact_commit (read-only transactions included)
	Writes        float64 // transactions that wrote: the xid counter's advance
	WAL           float64 // bytes: pg_current_wal_insert_lsn() advance
	ClientCPU     float64 // ms of this process's CPU (client, provider, tracer)
	ServerCPU     float64 // ms of the database server's CPU (all its processes); NaN when remote
	Allocs        float64 // heap objects allocated by this process (client, provider, tracer)
}

func (p perReq) vals() []float64 {
	return []float64{p.Statements, p.RoundTrips, p.Wire, p.TracerCommits, p.Commits, p.Writes, p.WAL, p.ClientCPU, p.ServerCPU, p.Allocs}
}

func perReqOf(v []float64) perReq {
	return perReq{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]}
}

// dbStats is a snapshot of the server's counters.
type dbStats struct {
	commits, rollbacks int64
	wal                int64 // bytes since 0/0
	nextXID            int64
}

// snapshot reads the bench database's commit counters (fresh: the admin connection has
// stats_fetch_consistency = none), the WAL insert position and the next transaction id.
// It must be called while no bench transaction is open, so that the snapshot's xmax is
// the next xid to be assigned.
func (e *env) snapshot(ctx context.Context) (dbStats, error) {
	var s dbStats
	err := e.admin.QueryRow(ctx, `
		SELECT d.xact_commit, d.xact_rollback,
			(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint,
			pg_snapshot_xmax(pg_current_snapshot())::text::bigint
		FROM pg_stat_database d WHERE d.datname = $1`, e.db.name).Scan(&s.commits, &s.rollbacks, &s.wal, &s.nextXID)
	if err != nil {
		return s, fmt.Errorf("read database counters: %w", err)
	}
	return s, nil
}

// flush makes every idle connection of pool report its pending statistics now: a
// backend reports them at most once a second, and an idle one only after a timeout, so
// without this pg_stat_database lags. Each call is one (read-only) transaction in the
// bench database; flush returns how many it made, to subtract. The call reads a table
// so that the backend has pending statistics: one with none pending skips the flush,
// and with it the count of the call's own commit.
func flush(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	for _, c := range pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush() FROM bench_flush")
		c.Release()
		if err != nil {
			return n, fmt.Errorf("flush statistics: %w", err)
		}
		n++
	}
	return n, nil
}

// load is the outcome of a closed-loop run.
type load struct {
	n        int
	errs     int
	firstErr error
	elapsed  time.Duration
	lats     []time.Duration // sorted
}

// runLoad runs fn in conc closed loops for dur, then waits for the requests in flight.
// With a tracker, each request carries its state in its context.
func (e *env) runLoad(ctx context.Context, fn doFunc, conc int, dur time.Duration, k *tracker) load {
	stop := make(chan struct{})
	t := time.AfterFunc(dur, func() { close(stop) })
	defer t.Stop()
	return e.runLoadUntil(ctx, fn, conc, stop, k)
}

// runLoadUntil is runLoad until stop is closed.
func (e *env) runLoadUntil(ctx context.Context, fn doFunc, conc int, stop <-chan struct{}, k *tracker) load {
	type result struct {
		lats     []time.Duration
		errs     int
		firstErr error
	}
	results := make([]result, conc)
	var wg sync.WaitGroup
	seed := rand.Uint64()
	start := time.Now()
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for i := range conc {
		wg.Go(func() {
			w := &worker{id: i, rng: rand.New(rand.NewPCG(seed, uint64(i))), e: e}
			r := &results[i]
			r.lats = make([]time.Duration, 0, 4096)
			// Every worker sends at least one request, so that dur 0 touches conc connections.
			for first := true; ctx.Err() == nil && (first || !stopped()); first = false {
				rctx := ctx
				var rs *reqState
				if k != nil {
					rs = &reqState{k: k}
					k.begin(rs)
					rctx = withReq(ctx, rs)
				}
				t0 := time.Now()
				err := fn(rctx, w)
				d := time.Since(t0)
				if k != nil {
					k.end(rs)
				}
				if err != nil {
					if r.errs == 0 {
						r.firstErr = err
					}
					r.errs++
					continue
				}
				r.lats = append(r.lats, d)
			}
		})
	}
	wg.Wait()
	out := load{elapsed: time.Since(start)}
	for _, r := range results {
		out.lats = append(out.lats, r.lats...)
		out.errs += r.errs
		if out.firstErr == nil {
			out.firstErr = r.firstErr
		}
	}
	out.n = len(out.lats)
	slices.Sort(out.lats)
	return out
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// measure runs one cell and reads what it cost.
func (e *env) measure(ctx context.Context, v *variant, fn doFunc, conc int, dur time.Duration, k *tracker) (cell, error) {
	c := cell{Variant: v.name, Conc: conc}
	// Whatever any pool did before (other cells, warm-up, profiles, verification) is
	// reported now, so that it is not counted in this cell.
	for _, p := range e.pools() {
		if _, err := flush(ctx, p); err != nil {
			return c, err
		}
	}
	t0 := v.tr.snapshot()
	s0, err := e.snapshot(ctx)
	if err != nil {
		return c, err
	}
	var st0 map[int64]stmtStat
	if e.pgss {
		if st0, err = e.stmtSnapshot(ctx); err != nil {
			return c, err
		}
	}
	cpu0, allocs0 := e.readCPU(false), heapAllocs()
	l := e.runLoad(ctx, fn, conc, dur, k)
	if err := ctx.Err(); err != nil {
		return c, err
	}
	cpu1, allocs1 := e.readCPU(true), heapAllocs()
	if e.pgss {
		st1, err := e.stmtSnapshot(ctx)
		if err != nil {
			return c, err
		}
		c.Stmts = stmtDelta(st0, st1)
	}
	t1 := v.tr.snapshot()
	flushed, err := flush(ctx, v.pool)
	if err != nil {
		return c, err
	}
	s1, err := e.snapshot(ctx)
	if err != nil {
		return c, err
	}
	if l.errs > 0 {
		return c, fmt.Errorf("%s at concurrency %d: %d of %d requests failed; the first: %w", v.name, conc, l.errs, l.errs+l.n, l.firstErr)
	}
	if l.n == 0 {
		return c, fmt.Errorf("%s at concurrency %d: no request completed", v.name, conc)
	}
	c.N, c.Elapsed = l.n, l.elapsed
	c.RPS = float64(l.n) / l.elapsed.Seconds()
	c.P50, c.P99 = quantile(l.lats, 0.50), quantile(l.lats, 0.99)
	d := t1.sub(t0)
	n := float64(l.n)
	c.Per = perReq{
		Statements:    float64(d.Statements) / n,
		RoundTrips:    float64(d.RoundTrips) / n,
		Wire:          float64(d.Wire) / n,
		TracerCommits: float64(d.Commits) / n,
		Commits:       float64(s1.commits-s0.commits-flushed) / n,
		Writes:        float64(s1.nextXID-s0.nextXID) / n,
		WAL:           float64(s1.wal-s0.wal) / n,
		ClientCPU:     ms(cpu1.Client-cpu0.Client) / n,
		ServerCPU:     math.NaN(),
		Allocs:        float64(allocs1-allocs0) / n,
	}
	if e.cpu.Local() {
		c.Per.ServerCPU = ms(cpu1.Server-cpu0.Server) / n
	}
	return c, nil
}

// heapAllocs is how many heap objects this process has allocated so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// pools are every pool on the bench database.
func (e *env) pools() []*pgxpool.Pool {
	out := []*pgxpool.Pool{e.check}
	for _, v := range e.variants {
		out = append(out, v.pool)
	}
	return out
}

// openAll makes pool hold n open connections, acquiring them at once and giving them
// back.
func openAll(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
	return errors.Join(errs...)
}

// warmup runs every variant for a while so that connections exist, statement caches
// are warm and there are finished keys to replay; then flushes all statistics.
func (e *env) warmup(ctx context.Context, dur time.Duration) error {
	conc := slices.Max(e.o.conc)
	for _, v := range e.variants {
		// Replays need keys that idemflow finished.
		if !e.o.runs(v.name) && !(v.name == vIdem && e.o.runs(vReplay)) {
			continue
		}
		logf("warm-up: %s", v.name)
		// The pool's connections are opened first, all at once, outside any engine: a
		// burst of attempts on a cold pool waits for connections to be made, and on a
		// loaded machine the engine's admission rightly turns the later ones away
		// (Config.AdmitWait) before the warm-up has warmed anything.
		if err := openAll(ctx, v.pool, conc); err != nil {
			return fmt.Errorf("warm-up %s: %w", v.name, err)
		}
		// Every connection of the pool gets used: first one request per connection at
		// once, then the closed loop.
		if l := e.runLoad(ctx, v.fast, conc, 0, nil); l.errs > 0 {
			return fmt.Errorf("warm-up %s: %w", v.name, l.firstErr)
		}
		if l := e.runLoad(ctx, v.fast, conc, dur, nil); l.errs > 0 {
			return fmt.Errorf("warm-up %s: %w", v.name, l.firstErr)
		}
	}
	for _, v := range e.variants {
		if _, err := flush(ctx, v.pool); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// round runs every variant at every concurrency once, provider latency 0. The order of
// the variants rotates from one concurrency and round to the next, so that none always
// runs first or last.
func (e *env) round(ctx context.Context, r int, slow bool) ([]cell, error) {
	var out []cell
	for ci, conc := range e.o.conc {
		order := rotate(e.variants, r+ci)
		for _, v := range order {
			if !e.o.runs(v.name) {
				continue
			}
			c, err := e.measure(ctx, v, v.fast, conc, e.o.cell, nil)
			if err != nil {
				return out, err
			}
			c.Round = r
			logf("round %d/%d  c=%-3d %-16s %7.0f req/s  p50 %6.2f ms  p99 %6.2f ms  %4.1f RT  %4.2f writes  %5.0f WAL B  CPU ms %5.2f server %5.2f client  %4.0f allocs",
				r+1, e.o.rounds, conc, v.name, c.RPS, ms(c.P50), ms(c.P99), c.Per.RoundTrips, c.Per.Writes, c.Per.WAL, c.Per.ServerCPU, c.Per.ClientCPU, c.Per.Allocs)
			out = append(out, c)
		}
	}
	return out, nil
}

func rotate[T any](s []T, by int) []T {
	out := make([]T, 0, len(s))
	for i := range s {
		out = append(out, s[(i+by)%len(s)])
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// activity is what the slow run saw of connections while calls were in flight.
type activity struct {
	Variant string
	Conc    int
	// pg_stat_activity samples of the bench database's client backends.
	Samples       int
	IdleTxSeen    int            // idle-in-transaction backends seen, over all samples
	IdleTxMax     time.Duration  // the longest time a backend had been idle in transaction
	IdleTxInCall  int            // idle-in-transaction backends held by a request in its call phase
	LockWaitsSeen int            // live backends seen waiting on a lock other than relation extension
	Waits         map[string]int // every backend seen waiting on a lock: "application: wait event" -> samples
	// The tracker's exact counts.
	Acquires    int
	MaxInUse    int
	HeldInCall  int // acquisitions by a request in its call phase
	CallHolding int // call phases started while holding a connection
	OverUse     int // acquisitions that made connections in use exceed requests outside a call phase
	Untracked   int
}

// sampleLoop calls a sample function every interval, on a goroutine of its own, until
// stopped, ctx's end or the function's first error.
type sampleLoop struct {
	stop, done chan struct{}
	err        error
}

// startSampleLoop starts calling sample every interval.
func startSampleLoop(ctx context.Context, every time.Duration, sample func(context.Context) error) *sampleLoop {
	l := &sampleLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if l.err = sample(ctx); l.err != nil {
				return
			}
		}
	}()
	return l
}

// end stops the loop and returns the error that ended it, if any. What the sample
// function wrote may be read after end.
func (l *sampleLoop) end() error {
	close(l.stop)
	<-l.done
	return l.err
}

// sampler samples pg_stat_activity until stopped.
type sampler struct {
	loop *sampleLoop
	act  activity
}

const sqlActivity = `
SELECT pid, state, coalesce(extract(epoch FROM statement_timestamp() - state_change), 0)::float8,
	coalesce(wait_event_type, ''), coalesce(wait_event, ''), application_name
FROM pg_stat_activity
WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()
	AND (state LIKE 'idle in transaction%' OR wait_event_type = 'Lock')`

func (e *env) startSampler(ctx context.Context, every time.Duration, k *tracker) *sampler {
	s := &sampler{}
	s.loop = startSampleLoop(ctx, every, func(ctx context.Context) error { return s.sample(ctx, e, k) })
	return s
}

func (s *sampler) sample(ctx context.Context, e *env, k *tracker) error {
	rows, err := e.sampler.Query(ctx, sqlActivity, e.db.name)
	if err != nil {
		return err
	}
	defer rows.Close()
	s.act.Samples++
	for rows.Next() {
		var pid uint32
		var state, wait, event, app string
		var idleFor float64
		if err := rows.Scan(&pid, &state, &idleFor, &wait, &event, &app); err != nil {
			return err
		}
		if wait == "Lock" {
			// Relation extension waits are live inserts queueing for new pages among
			// themselves: counted apart.
			if app == appLive && event != "extend" {
				s.act.LockWaitsSeen++
			}
			if s.act.Waits == nil {
				s.act.Waits = map[string]int{}
			}
			s.act.Waits[app+": "+event]++
		}
		if state == "idle in transaction" || state == "idle in transaction (aborted)" {
			s.act.IdleTxSeen++
			s.act.IdleTxMax = max(s.act.IdleTxMax, time.Duration(idleFor*float64(time.Second)))
			if k != nil && k.holderInCall(pid) {
				s.act.IdleTxInCall++
			}
		}
	}
	return rows.Err()
}

func (s *sampler) finish() (activity, error) {
	err := s.loop.end()
	return s.act, err
}

// slowRun runs every variant at every concurrency once with the slow provider, with
// the tracker on and pg_stat_activity sampled, then the negative control.
func (e *env) slowRun(ctx context.Context) ([]cell, []activity, error) {
	var cells []cell
	var acts []activity
	one := func(v *variant, conc int) error {
		k := newTracker()
		v.tr.setTracker(k)
		defer v.tr.setTracker(nil)
		s := e.startSampler(ctx, 2*time.Millisecond, k)
		c, err := e.measure(ctx, v, v.slow, conc, e.o.cell, k)
		a, serr := s.finish()
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("sample pg_stat_activity: %w", serr)
		}
		c.Slow = true
		k.mu.Lock()
		a.Variant, a.Conc = v.name, conc
		a.Acquires, a.MaxInUse, a.HeldInCall, a.CallHolding, a.OverUse, a.Untracked =
			k.acquires, k.maxInUse, k.heldInCall, k.callHolding, k.overUse, k.unknown
		k.mu.Unlock()
		logf("slow     c=%-3d %-16s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  idle-in-tx max %5.2f ms, in a call %d; conns held in a call %d",
			conc, v.name, c.RPS, ms(c.P50), ms(c.P99), ms(a.IdleTxMax), a.IdleTxInCall, a.HeldInCall+a.CallHolding)
		cells = append(cells, c)
		acts = append(acts, a)
		return nil
	}
	for ci, conc := range e.o.conc {
		for _, v := range rotate(e.variants, ci) {
			if err := one(v, conc); err != nil {
				return cells, acts, err
			}
		}
	}
	controlConc := e.o.conc[len(e.o.conc)/2]
	if err := one(e.control, controlConc); err != nil {
		return cells, acts, err
	}
	return cells, acts, nil
}
