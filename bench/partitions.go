package main

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// The partitioned key table side by side with batched deletes (issue 28,
// docs/PARTITIONS.md), -phases partitions with -partition-keys N:
//
//   - cleanup: two databases, each with N finished keys expired 40 days ago; live
//     fresh requests run for a window without cleanup, then for a window while the
//     cleanup runs: batched deletes (Store.ExpireFinished, 1000 a statement, until
//     none is left) on the plain table, Store.RemovePartitions (DETACH … CONCURRENTLY,
//     DROP) on the partitioned one. Live p50/p99 of both windows, the cleanup's WAL
//     (pg_current_wal_lsn difference, less the live traffic's WAL at the baseline
//     window's rate), the cleanup backend's CPU (/proc/<pid>/stat: the server must run
//     on this machine) and pg_locks sampled every 5 ms for a live backend waiting.
//     Skipped with -partition-cleanup=false.
//   - retained: fresh and replay latency, and the server CPU per request, in
//     interleaved cells, on a plain empty key table, an empty partitioned one with the
//     same 38 day partitions (30 past, the current, 7 ahead), one holding N finished
//     keys spread over 30 day partitions (a 30-day retention), and the same two with
//     week partitions; with -partition-custom-plans also the day sides through pools
//     whose connections force custom plans. This separates the partition count from
//     the data.

// partitionCleanup is one side of the cleanup run.
type partitionCleanup struct {
	Side                   string
	Keys                   int
	Base, During           liveStats
	Cleanup                time.Duration
	WALBytes, LiveWALBytes int64 // during the cleanup; the live share estimated
	CPU                    time.Duration
	LockWaitSamples        int // samples with a live backend waiting on a lock
	Samples                int
	TableBytes             int64 // key table and indexes before the cleanup
}

// liveStats are a window of live traffic.
type liveStats struct {
	N        int
	RPS      float64
	P50, P99 time.Duration
	walBytes int64
	elapsed  time.Duration
}

// partitionsRun runs the experiment and logs its figures.
func (e *env) partitionsRun(ctx context.Context) error {
	n := e.o.partitionKeys
	prov := httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
	defer prov.Close()
	conc := 8
	var sides []*growthDB
	defer func() {
		for _, s := range sides {
			s.pool.Close()
			if s.db.drop != nil && !e.o.keep {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				_ = s.db.drop(dctx)
				cancel()
			}
		}
	}()
	sideW := func(name string, w time.Duration) (*growthDB, error) {
		s, err := e.newGrowthDB(ctx, name, prov.URL, conc+2)
		if s != nil && s.pool != nil {
			sides = append(sides, s)
		}
		if err == nil && w > 0 {
			err = store.New().SetupPartitioned(ctx, s.pool, w, 0)
		}
		return s, err
	}
	side := func(name string, partitioned bool) (*growthDB, error) {
		if partitioned {
			return sideW(name, store.PartitionDay)
		}
		return sideW(name, 0)
	}
	if e.o.partitionCleanup {
		if err := e.cleanupSides(ctx, side, n, conc); err != nil {
			return err
		}
	}
	if e.o.partitionDayKeys > 0 {
		if err := e.weekSizes(ctx, side, e.o.partitionDayKeys); err != nil {
			return fmt.Errorf("partitions: week of sizes: %w", err)
		}
	}
	if n <= 0 {
		return nil
	}
	dbs := []*growthDB{}
	for _, c := range []struct {
		name string
		w    time.Duration
	}{{"pt_empty", 0}, {"pt_emptypart", store.PartitionDay}, {"pt_retained", store.PartitionDay},
		{"pt_emptyweek", store.PartitionWeek}, {"pt_retainedweek", store.PartitionWeek}} {
		if c.w == store.PartitionWeek && !e.o.partitionWeekSides {
			break
		}
		s, err := sideW(c.name, c.w)
		if err != nil {
			return err
		}
		dbs = append(dbs, s)
	}
	return e.retainedCells(ctx, prov.URL, dbs, n, conc)
}

// cleanupSides runs the cleanup experiment on a plain and a partitioned side.
func (e *env) cleanupSides(ctx context.Context, side func(string, bool) (*growthDB, error), n, conc int) error {
	var results []*partitionCleanup // batched, then partitioned
	defer func() { e.cleanupFigures(results) }()
	for _, c := range []struct {
		name        string
		partitioned bool
	}{{"pt_batched", false}, {"pt_partitioned", true}} {
		s, err := side(c.name, c.partitioned)
		if err != nil {
			return err
		}
		res, err := e.cleanupSide(ctx, s, c.partitioned, n, conc)
		if err != nil {
			return fmt.Errorf("partitions: cleanup %s: %w", c.name, err)
		}
		logf("partitions cleanup %-14s keys=%d table+indexes=%s live p50 %.2f/%.2f ms p99 %.2f/%.2f ms (without/with cleanup, ×%.3f) cleanup %s WAL %s (%.1f B/key; live share %s) CPU %s lock-wait samples %d of %d",
			c.name, res.Keys, fmtBytes(res.TableBytes), ms(res.Base.P50), ms(res.During.P50), ms(res.Base.P99), ms(res.During.P99),
			float64(res.During.P99)/float64(res.Base.P99), res.Cleanup.Round(time.Millisecond), fmtBytes(res.WALBytes),
			float64(res.WALBytes)/float64(max(res.Keys, 1)), fmtBytes(res.LiveWALBytes), res.CPU, res.LockWaitSamples, res.Samples)
		results = append(results, res)
		if c.partitioned {
			if err := e.creationLocks(ctx, s, conc); err != nil {
				return fmt.Errorf("partitions: creation %s: %w", c.name, err)
			}
		}
	}
	return nil
}

// creationLocks creates the partitions of the next 60 days on s (Store.EnsurePartitions)
// while live fresh requests run, sampling pg_locks, and hands the report the samples in
// which a live request waited.
func (e *env) creationLocks(ctx context.Context, s *growthDB, conc int) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return err
	}
	var rep store.PartitionReport
	create := func() (err error) {
		rep, err = store.New().EnsurePartitions(ctx, conn, 60*24*time.Hour)
		if err == nil && rep.Created == 0 {
			err = errors.New("created no partition")
		}
		return err
	}
	w, err := e.liveWindow(ctx, s, conc, e.o.liveWindow, create, pid)
	if err != nil {
		return err
	}
	logf("partitions creation %s: %d partitions created under live traffic; lock waits seen: %v", s.name, rep.Created, w.kinds)
	e.figs.set(figPartLockWaitsCreate, float64(w.lockWaits), fmt.Sprintf("%d of %d samples (pg_locks every 5 ms) with a live backend waiting, while %d partitions were created and attached",
		w.lockWaits, w.samples, rep.Created))
	return nil
}

// cleanupFigures hands the report issue 28's cleanup figures, when both sides ran.
func (e *env) cleanupFigures(rs []*partitionCleanup) {
	if len(rs) < 2 {
		return
	}
	b, p := rs[0], rs[1]
	perKey := func(r *partitionCleanup) float64 { return float64(r.WALBytes) / float64(max(r.Keys, 1)) }
	e.figs.set(figPartWALFactor, perKey(b)/max(perKey(p), 0.01), fmt.Sprintf("%.1f B vs %.2f B of WAL per key (%.0f× below; %d keys each side)",
		perKey(b), perKey(p), perKey(b)/max(perKey(p), 0.01), p.Keys))
	x := float64(p.During.P99) / float64(p.Base.P99)
	e.figs.set(figPartCleanupP99, x, fmt.Sprintf("%.2f ms vs %.2f ms = %.2f× (batched deletes: %.2f×)", ms(p.During.P99), ms(p.Base.P99), x,
		float64(b.During.P99)/float64(b.Base.P99)))
	e.figs.set(figPartLockWaitsRemove, float64(p.LockWaitSamples), fmt.Sprintf("%d of %d samples (pg_locks every 5 ms) with a live backend waiting",
		p.LockWaitSamples, p.Samples))
}

// cleanupSide fills s with n keys expired 40 days ago and measures live traffic
// without and with their cleanup.
func (e *env) cleanupSide(ctx context.Context, s *growthDB, partitioned bool, n, conc int) (*partitionCleanup, error) {
	res := &partitionCleanup{Side: s.name, Keys: n}
	if partitioned {
		if err := attachDays(ctx, s, 41, 39); err != nil {
			return nil, err
		}
	}
	if err := insertKeys(ctx, s, n, "40 days 1 hour", "40 days"); err != nil {
		return nil, err
	}
	if err := s.pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c
WHERE c.relname LIKE 'idemflow\_keys%' AND c.relkind IN ('r', 'p')`).Scan(&res.TableBytes); err != nil {
		return nil, err
	}
	// Warm-up, then the baseline window.
	if l := e.runLoad(ctx, s.fresh, conc, e.o.warmup, nil); l.errs > 0 {
		return nil, l.firstErr
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return nil, err
	}
	base, err := e.liveWindow(ctx, s, conc, e.o.liveWindow, nil, pid)
	if err != nil {
		return nil, err
	}
	res.Base = base.liveStats
	cpu0, _ := backendCPU(pid)
	cleanup := func() error {
		st := keytable.New()
		start := time.Now()
		defer func() { res.Cleanup = time.Since(start) }()
		if partitioned {
			r, err := st.RemovePartitions(ctx, conn, 30*24*time.Hour)
			if err == nil && r.Removed == 0 {
				err = errors.New("removed no partition")
			}
			return err
		}
		for {
			k, err := st.ExpireFinished(ctx, conn, 30*24*time.Hour, 1000)
			if err != nil || k == 0 {
				return err
			}
		}
	}
	during, err := e.liveWindow(ctx, s, conc, e.o.liveWindow, cleanup, pid)
	if err != nil {
		return nil, err
	}
	res.During = during.liveStats
	cpu1, err := backendCPU(pid)
	if err == nil {
		res.CPU = cpu1 - cpu0
	}
	res.LiveWALBytes = int64(float64(base.walBytes) / base.elapsed.Seconds() * res.Cleanup.Seconds())
	res.WALBytes = max(during.walBytes-res.LiveWALBytes, 0)
	res.LockWaitSamples, res.Samples = during.lockWaits, during.samples
	logf("partitions cleanup %s: lock waits seen during the cleanup: %v; without it: %v", s.name, during.kinds, base.kinds)
	var left int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE created_at < now() - interval '30 days'`).Scan(&left); err != nil || left != 0 {
		return nil, errors.Join(err, fmt.Errorf("%d expired keys left", left))
	}
	return res, nil
}

// liveWindow runs fresh requests for dur, or until cleanup (if given, run from the
// window's start) ends if that is later, sampling pg_locks every 5 ms for a live
// backend of s's database (not the cleanup's, cleanupPid) waiting on a lock; it
// returns the window with the WAL written during the cleanup (or the whole window
// without one).
func (e *env) liveWindow(ctx context.Context, s *growthDB, conc int, dur time.Duration, cleanup func() error, cleanupPid int) (liveStatsSampled, error) {
	var out liveStatsSampled
	stop := make(chan struct{})
	sampled := make(chan [2]int, 1)
	out.kinds = map[string]int{}
	go func() {
		waits, samples := 0, 0
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				sampled <- [2]int{waits, samples}
				return
			case <-t.C:
			}
			var kinds []string
			if err := e.check.QueryRow(ctx, `SELECT coalesce(array_agg(l.locktype || ' ' || l.mode), '{}') FROM pg_locks l
	JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = $1 AND a.application_name = $2 AND a.pid <> $3`, s.db.name, appLive, cleanupPid).Scan(&kinds); err == nil {
				samples++
				if len(kinds) > 0 {
					waits++
				}
				for _, k := range kinds {
					out.kinds[k]++ // read after stop
				}
			}
		}
	}()
	lsn0, err := walLSN(ctx, e)
	if err != nil {
		return out, err
	}
	done := make(chan struct{})
	stopLoad := make(chan struct{})
	var l load
	go func() { defer close(done); l = e.runLoadUntil(ctx, s.fresh, conc, stopLoad, nil) }()
	least := time.NewTimer(dur) // the window lasts dur, or the cleanup if longer
	var cerr error
	if cleanup != nil {
		cerr = cleanup()
	}
	lsn1, err := walLSN(ctx, e)
	<-least.C
	close(stopLoad)
	<-done
	if cleanup == nil {
		lsn1, err = walLSN(ctx, e)
	}
	close(stop)
	ws := <-sampled
	if err := errors.Join(cerr, err); err != nil {
		return out, err
	}
	if l.errs > 0 {
		return out, fmt.Errorf("live traffic: %d requests failed: %w", l.errs, l.firstErr)
	}
	out.liveStats = liveStats{N: l.n, RPS: float64(l.n) / l.elapsed.Seconds(), P50: quantile(l.lats, 0.5), P99: quantile(l.lats, 0.99),
		walBytes: lsn1 - lsn0, elapsed: l.elapsed}
	out.lockWaits, out.samples = ws[0], ws[1]
	return out, nil
}

// liveStatsSampled is a live window and its lock samples.
type liveStatsSampled struct {
	liveStats
	lockWaits, samples int
	kinds              map[string]int // lock type and mode of each wait seen
}

// walLSN is the server's current WAL position in bytes.
func walLSN(ctx context.Context, e *env) (int64, error) {
	var lsn int64
	err := e.check.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&lsn)
	return lsn, err
}

// backendCPU is the user and system CPU a server process has used, from /proc.
func backendCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis; utime and stime are the
	// 14th and 15th of the line, in clock ticks (100 a second on Linux).
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}

// attachDays creates and attaches the day partitions from `from` days ago to `to`
// days ago (from ≥ to), named as the Store names its own.
func attachDays(ctx context.Context, s *growthDB, from, to int) error {
	for d := from; d >= to; d-- {
		var day time.Time
		if err := s.pool.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - $1 * interval '1 day'`, d).Scan(&day); err != nil {
			return err
		}
		name := pgx.Identifier{"idemflow_keys_p" + day.UTC().Format("20060102")}.Sanitize()
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil || exists {
			if err != nil {
				return err
			}
			continue
		}
		_, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION %[1]s FOR VALUES FROM ('%s') TO ('%s')`, name,
			day.UTC().Format(time.RFC3339), day.Add(24*time.Hour).UTC().Format(time.RFC3339)))
		if err != nil {
			return fmt.Errorf("attach %s: %w", name, err)
		}
	}
	return nil
}

// attachWeeks creates and attaches the week partitions (Monday to Monday, UTC, named
// as the Store names its own) from the one holding `days` days ago up to the current
// one, which SetupPartitioned created.
func attachWeeks(ctx context.Context, s *growthDB, days int) error {
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return err
	}
	cur := now.UTC().Truncate(store.PartitionWeek)
	for from := now.UTC().Add(-time.Duration(days) * 24 * time.Hour).Truncate(store.PartitionWeek); from.Before(cur); from = from.Add(store.PartitionWeek) {
		name := pgx.Identifier{"idemflow_keys_p" + from.Format("20060102")}.Sanitize()
		_, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION %[1]s FOR VALUES FROM ('%s') TO ('%s')`, name,
			from.Format(time.RFC3339), from.Add(store.PartitionWeek).Format(time.RFC3339)))
		if err != nil {
			return fmt.Errorf("attach %s: %w", name, err)
		}
	}
	return nil
}

// insertKeys inserts n finished keys with generate_series, created (and finished)
// evenly from `oldest` ago to `newest` ago (intervals), random UUID keys under 16
// scopes, then VACUUM ANALYZE.
func insertKeys(ctx context.Context, s *growthDB, n int, oldest, newest string) error {
	start := time.Now()
	const chunk = 500000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		_, err := s.pool.Exec(ctx, `
INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body,
	recovery_point, phase_data, status, response_status, response_headers, response_body,
	created_at, updated_at, finished_at)
SELECT 'acct_' || (i % 16), gen_random_uuid()::text, gen_random_uuid(), $5, 'POST', '/v1/charges',
	sha256(('old-' || i)::bytea), ''::bytea, 'finished', '{}', 'finished', 201,
	'{"Content-Type":["application/json"]}', $4::bytea, t, t, t
FROM generate_series($1::int, $2::int) AS i,
	LATERAL (SELECT now() - $6::interval + (i::float8 / $3) * ($6::interval - $7::interval) AS t) AS ts`,
			lo, hi, float64(n), []byte(`{"id":"ch_old","amount":1999,"currency":"usd","status":"succeeded","provider_payment_id":"pay_000001"}`),
			chargeflow.FlowName, oldest, newest)
		if err != nil {
			return fmt.Errorf("insert keys: %w", err)
		}
	}
	if _, err := s.pool.Exec(ctx, "VACUUM (ANALYZE) idemflow_keys"); err != nil {
		return err
	}
	logf("partitions: %d keys into %s in %s", n, s.name, time.Since(start).Round(time.Millisecond))
	return nil
}

// retainedSide is one side of the retained-keys cells: a database and the engine
// that serves it, named by name (application_name appName, so that its backends'
// CPU can be read from /proc).
type retainedSide struct {
	name, appName string
	s             *growthDB
}

// customPlanSide is another pool and engine on s's database whose connections plan
// every statement for its parameters (plan_cache_mode = force_custom_plan).
func (e *env) customPlanSide(ctx context.Context, s *growthDB, providerURL, name string, conc int) (*growthDB, error) {
	cfg, err := poolConfig(s.db.serverURL, s.db.name, s.db.schema, "bench-"+name, int32(conc+2))
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	c := &growthDB{name: name, db: benchDB{serverURL: s.db.serverURL, name: s.db.name, schema: s.db.schema}, replay: newKeyRing(50000)}
	if c.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if c.eng, err = e.engine(c.pool, providerURL, workflow.Hooks{}); err != nil {
		c.pool.Close()
		return nil, err
	}
	return c, nil
}

// sideCPU is the CPU the server backends of one side (its database and application
// name) have used so far, read from /proc (the server must run on this machine).
func (e *env) sideCPU(ctx context.Context, r retainedSide) (time.Duration, error) {
	rows, err := e.check.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2`, r.s.db.name, r.appName)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, pid := range pids {
		c, err := backendCPU(int(pid))
		if err != nil {
			return 0, err
		}
		sum += c
	}
	return sum, nil
}

// retainedSides fills the sides of the retained-keys cells (dbs: empty plain, empty
// day-partitioned, day-partitioned with n keys, empty week-partitioned,
// week-partitioned with n keys) and returns them, with the custom-plan sides when
// asked; closeAll closes their pools.
func (e *env) retainedSides(ctx context.Context, providerURL string, dbs []*growthDB, n, conc int) (sides []retainedSide, closeAll func(), err error) {
	closeAll = func() {}
	emptyPart, grown := dbs[1], dbs[2]
	for _, s := range []*growthDB{grown, emptyPart} {
		if err := attachDays(ctx, s, 30, 0); err != nil {
			return nil, closeAll, err
		}
	}
	retained := []*growthDB{grown}
	if len(dbs) == 5 { // the week sides
		for _, s := range dbs[3:] {
			if err := attachWeeks(ctx, s, 30); err != nil {
				return nil, closeAll, err
			}
		}
		retained = append(retained, dbs[4])
	}
	for _, s := range retained {
		if err := insertKeys(ctx, s, n, "30 days", "1 hour"); err != nil {
			return nil, closeAll, err
		}
	}
	parts := map[string]int{}
	for _, s := range dbs[1:] {
		var p int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idemflow_keys'::regclass`).Scan(&p); err != nil {
			return nil, closeAll, err
		}
		parts[s.name] = p
	}
	logf("partitions: partitions of each side: %v", parts)
	for _, s := range dbs {
		sides = append(sides, retainedSide{s.name, appLive, s})
	}
	for _, base := range []*growthDB{emptyPart, grown} {
		if !e.o.partitionCustom {
			break
		}
		name := base.name + "_custom"
		c, err := e.customPlanSide(ctx, base, providerURL, name, conc)
		if err != nil {
			return nil, closeAll, err
		}
		prev := closeAll
		closeAll = func() { prev(); c.pool.Close() }
		sides = append(sides, retainedSide{name, "bench-" + name, c})
	}
	return sides, closeAll, nil
}

// retainedCells compares fresh and replay latency, and the server CPU per request, on
// the sides retainedSides fills (dbs[0], the empty plain table, is the reference), in
// interleaved cells.
func (e *env) retainedCells(ctx context.Context, providerURL string, dbs []*growthDB, n, conc int) error {
	empty := dbs[0]
	sides, closeSides, err := e.retainedSides(ctx, providerURL, dbs, n, conc)
	defer closeSides()
	if err != nil {
		return err
	}
	type job struct {
		side retainedSide
		mode string
		fn   doFunc
	}
	var jobs []job
	for _, mode := range []string{"fresh", "replay"} {
		for _, sd := range sides {
			fn := sd.s.fresh
			if mode == "replay" {
				fn = sd.s.replayDo
			}
			jobs = append(jobs, job{sd, mode, fn})
		}
	}
	for _, sd := range sides {
		if l := e.runLoad(ctx, sd.s.fresh, conc, e.o.warmup, nil); l.errs > 0 {
			return l.firstErr
		}
	}
	p50 := map[string][]time.Duration{}
	cpu := map[string][]time.Duration{}
	for r := range e.o.rounds {
		for _, j := range rotate(jobs, r) {
			c0, cerr0 := e.sideCPU(ctx, j.side)
			l := e.runLoad(ctx, j.fn, conc, e.o.cell, nil)
			if l.errs > 0 {
				return fmt.Errorf("%s %s: %w", j.side.name, j.mode, l.firstErr)
			}
			c1, cerr1 := e.sideCPU(ctx, j.side)
			var perReq time.Duration
			if cerr0 == nil && cerr1 == nil && l.n > 0 {
				perReq = (c1 - c0) / time.Duration(l.n)
			}
			k := j.side.name + " " + j.mode
			p50[k], cpu[k] = append(p50[k], quantile(l.lats, 0.5)), append(cpu[k], perReq)
			logf("partitions retained round %d c=%d %-21s %-6s %7.0f req/s p50 %6.2f ms p99 %6.2f ms server CPU %4.0f µs/req", r+1, conc, j.side.name, j.mode,
				float64(l.n)/l.elapsed.Seconds(), ms(quantile(l.lats, 0.5)), ms(quantile(l.lats, 0.99)), float64(perReq)/float64(time.Microsecond))
		}
	}
	for _, mode := range []string{"fresh", "replay"} {
		a := medianDur(p50[empty.name+" "+mode])
		for _, sd := range sides {
			b := medianDur(p50[sd.name+" "+mode])
			logf("partitions retained %-6s %-21s p50 %.2f ms (×%.2f empty plain) server CPU %.0f µs/req (median of rounds; %d keys on the retained sides)",
				mode, sd.name, ms(b), float64(b)/float64(a), float64(medianDur(cpu[sd.name+" "+mode]))/float64(time.Microsecond), n)
			if sd.name == "pt_retained" {
				id := map[string]string{"fresh": figPartFresh, "replay": figPartReplay}[mode]
				e.figs.set(id, float64(b)/float64(a), fmt.Sprintf("%.2f× (%.2f vs %.2f ms, medians of %d rounds; %d keys over 30 day partitions)",
					float64(b)/float64(a), ms(b), ms(a), e.o.rounds, n))
			}
		}
	}
	return nil
}

// medianDur is the median of durations (unsorted).
func medianDur(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// weekSizes simulates a week of traffic on a plain key table cleaned by batched
// deletes (Store.ExpireFinished, 1000 a statement, then a plain VACUUM, as autovacuum
// would run) and on a day-partitioned one cleaned by partition removal
// (Store.RemovePartitions), with a two-day retention: each simulated day inserts
// perDay finished keys created (and finished) through that day, then cleans up what
// is past retention, then logs the key table's size with its indexes. Days are the
// eight UTC days before today, so that the partitions' bounds are real ones.
func (e *env) weekSizes(ctx context.Context, side func(string, bool) (*growthDB, error), perDay int) error {
	const days, keepDays = 7, 2
	for _, c := range []struct {
		name        string
		partitioned bool
	}{{"pt_weekbatched", false}, {"pt_weekdropped", true}} {
		s, err := side(c.name, c.partitioned)
		if err != nil {
			return err
		}
		var midnight time.Time
		if err := s.pool.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&midnight); err != nil {
			return err
		}
		base := midnight.Add(-(days + 1) * 24 * time.Hour)
		if c.partitioned {
			if err := attachDays(ctx, s, days+1, 1); err != nil {
				return err
			}
		}
		st := keytable.New()
		var sizes []string
		var cleanup time.Duration
		for d := range days {
			from := base.Add(time.Duration(d) * 24 * time.Hour)
			if err := insertKeysBetween(ctx, s, perDay, from, from.Add(24*time.Hour-time.Second)); err != nil {
				return err
			}
			// Keep the keys created in the last keepDays simulated days.
			start := time.Now()
			if err := weekCleanup(ctx, s, st, c.partitioned, from.Add(time.Duration(1-keepDays)*24*time.Hour)); err != nil {
				return fmt.Errorf("%s day %d: %w", c.name, d+1, err)
			}
			cleanup += time.Since(start)
			var bytes, rows int64
			if err := s.pool.QueryRow(ctx, `SELECT (SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c
	WHERE c.relname LIKE 'idemflow\_keys%' AND c.relkind IN ('r', 'p')), (SELECT count(*) FROM idemflow_keys)`).Scan(&bytes, &rows); err != nil {
				return err
			}
			sizes = append(sizes, fmt.Sprintf("day %d: %s (%d rows)", d+1, fmtBytes(bytes), rows))
		}
		logf("partitions week of sizes %-14s %d keys a day, %d-day retention, cleanup %s in all; table+indexes after each day's cleanup: %s",
			c.name, perDay, keepDays, cleanup.Round(time.Millisecond), strings.Join(sizes, "; "))
	}
	return nil
}

// weekCleanup removes the keys created before cutoff on one side of weekSizes: the
// retention of each statement is the database clock's distance to cutoff.
func weekCleanup(ctx context.Context, s *growthDB, st *keytable.Store, partitioned bool, cutoff time.Time) error {
	retention := func() (time.Duration, error) {
		var now time.Time
		err := s.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now)
		return now.Sub(cutoff), err
	}
	if partitioned {
		r, err := retention()
		if err == nil {
			_, err = st.RemovePartitions(ctx, s.pool, r)
		}
		return err
	}
	for {
		r, err := retention()
		if err != nil {
			return err
		}
		k, err := st.ExpireFinished(ctx, s.pool, r, 1000)
		if err != nil {
			return err
		}
		if k == 0 {
			break
		}
	}
	_, err := s.pool.Exec(ctx, `VACUUM idemflow_keys`)
	return err
}

// insertKeysBetween inserts n finished keys created (and finished) evenly from `from`
// to `to`, as insertKeys does, without the VACUUM ANALYZE.
func insertKeysBetween(ctx context.Context, s *growthDB, n int, from, to time.Time) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body,
	recovery_point, phase_data, status, response_status, response_headers, response_body,
	created_at, updated_at, finished_at)
SELECT 'acct_' || (i % 16), gen_random_uuid()::text, gen_random_uuid(), $3, 'POST', '/v1/charges',
	sha256(('old-' || i)::bytea), ''::bytea, 'finished', '{}', 'finished', 201,
	'{"Content-Type":["application/json"]}', $2::bytea, t, t, t
FROM generate_series(1, $1::int) AS i,
	LATERAL (SELECT $4::timestamptz + (i::float8 / $1) * ($5::timestamptz - $4::timestamptz) AS t) AS ts`,
		n, []byte(`{"id":"ch_old","amount":1999,"currency":"usd","status":"succeeded","provider_payment_id":"pay_000001"}`),
		chargeflow.FlowName, from, to)
	if err != nil {
		return fmt.Errorf("insert keys: %w", err)
	}
	return nil
}
