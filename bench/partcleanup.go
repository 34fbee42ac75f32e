package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/retention"
)

// The cleanup experiment of the partitions part (issue 28), interleaved: each side
// holds N finished keys created over the -partition-cleanup-days days (ten by default)
// that end 40 days ago (on the partitioned side, partitions -partition-cleanup-width
// wide), loaded with the indexes dropped
// and built after, then a CHECKPOINT. Live fresh requests then run in pairs of windows,
// one without cleanup and one with a cleanup step started at its beginning (the order
// alternating from pair to pair), until the cleanup is done: on the partitioned side a
// step is Store.RemovePartitions with the retention that makes exactly the oldest
// remaining day's partitions due (a step a day); on the plain side it is
// Store.ExpireFinished, 1000 a statement, for the window's length. Figures pool every
// window of a kind:
//
//   - live p50/p99 of requests in windows without, in windows with, and of the requests
//     that overlapped a step itself (begun before it ended and ended after it began);
//   - live throughput and the live backends' server CPU per request (/proc), per kind;
//   - the cleanup's WAL, attributed record by record with pg_walinspect over each step's
//     WAL range: the records of the cleanup's transactions (the plain side's statements
//     report their xids; on the partitioned side, the transactions that wrote a system
//     catalog, which no live request does) and the records without a transaction that
//     touch no user table. This counts an autovacuum ANALYZE's catalog writes as the
//     cleanup's (an upper bound) and leaves out the plain side's later pruning and
//     vacuum of the deleted rows (a lower bound there). Beside it, the old estimate: the
//     steps' WAL less the live traffic's at the rate of the windows without;
//   - pg_locks every 5 ms for a live backend waiting (the cleanup has its own
//     connection and application name).

// appCleanup is the application name of the cleanup's and the WAL analysis'
// connections, so that neither counts as live.
const appCleanup = "idemflow-bench-cleanup"

// cleanupKind is one kind of window: without or with cleanup.
type cleanupKind struct {
	lats    []time.Duration
	n       int
	elapsed time.Duration
	cpu     time.Duration  // live backends
	wal     int64          // whole windows
	samples int            // of pg_locks
	waits   map[string]int // samples with a live backend waiting, by the kinds of lock waited on
}

// extendWait is a relation extension lock waited on, as pg_locks' locktype and mode
// read in the samples: live inserts extending the current partition wait on each other
// for it, whatever else runs.
const extendWait = "extend ExclusiveLock"

// waited counts the samples with a live backend waiting on a lock other than a
// relation extension lock (live inserts extending the current partition wait on each
// other for those, cleanup or not), and those with one waiting on an extension lock.
func (k *cleanupKind) waited() (other, extend int) {
	for kinds, c := range k.waits {
		if strings.Trim(strings.ReplaceAll(kinds, extendWait, ""), ", ") != "" {
			other += c
		} else {
			extend += c
		}
	}
	return other, extend
}

// cleanupRun is one side's interleaved cleanup experiment.
type cleanupRun struct {
	side, load      string
	keys            int
	width           time.Duration // of the partitions (0: the plain table)
	without, with   cleanupKind
	overlap         []time.Duration // requests overlapping a step
	pairs           []pairRatio     // each pair's p99 ratios, the spread of the pooled ones
	steps           int
	stepTime        time.Duration // all steps
	longestStep     time.Duration
	cleanupCPU      time.Duration
	stepWAL         int64 // the steps' WAL ranges, all records
	cleanupWAL      int64 // attributed to the cleanup
	doing           map[string]int
	removal, stalls []string // partitioned: each step's PartitionReport
	noInspect       bool     // pg_walinspect is not available
	modes           map[string]*modeRun
	stepMode        string      // the removal mode of the step just run
	marks           []phaseMark // its phases
	size            string      // its partition's heap and indexes
	attached        []int       // partitions attached to the key table at each step's start
}

// pairRatio is one pair of windows' live p99 with the step ÷ without it: over the
// window, and over the requests that overlapped the step.
type pairRatio struct{ window, overlap float64 }

// pairSpread is the spread over pairs of their p99 ratios: median, least and most, of
// the windows' and of the overlapping requests'.
func (run *cleanupRun) pairSpread() string {
	if len(run.pairs) == 0 {
		return "no pairs"
	}
	var w, o []float64
	for _, p := range run.pairs {
		w, o = append(w, p.window), append(o, p.overlap)
	}
	slices.Sort(w)
	slices.Sort(o)
	return fmt.Sprintf("per pair, windows with a step %.2f× (%.2f–%.2f×), requests overlapping it %.2f× (%.2f–%.2f×), %d pairs",
		median(w), w[0], w[len(w)-1], median(o), o[0], o[len(o)-1], len(run.pairs))
}

// removalModes are the two removals the partitioned side alternates, step by step,
// in one interleaved run: the library's (the detached table dropped with all its
// indexes in one transaction) and the paced experiment (its indexes shed one a
// transaction, paced, before the drop; testkit/retention.RemovePartitions).
var removalModes = [2]string{"one-drop", "paced"}

// phaseMark is the start of a phase of a removal, as its trace reported it.
type phaseMark struct {
	name string
	at   time.Time
}

// modeRun is the figures of the steps of one removal mode.
type modeRun struct {
	steps   int
	with    []time.Duration            // the live requests of its windows
	overlap []time.Duration            // those overlapping its steps
	after   []time.Duration            // those begun in the second after a step
	apart   []time.Duration            // the others of its windows
	sizes   []string                   // each removed partition's heap and indexes
	phases  map[string][]time.Duration // those overlapping each phase
	phaseT  map[string]time.Duration   // time in each phase, all steps
	order   []string                   // the phases, in their first order
}

// addMode pools window w, which ran a removal step, into its mode's figures, and
// attributes each request overlapping the step to the phases it overlapped.
func (run *cleanupRun) addMode(w *partCleanupWin) {
	if run.stepMode == "" {
		return
	}
	m := run.modes[run.stepMode]
	if m == nil {
		m = &modeRun{phases: map[string][]time.Duration{}, phaseT: map[string]time.Duration{}}
		run.modes[run.stepMode] = m
	}
	m.steps++
	m.with = append(m.with, w.lats...)
	m.overlap = append(m.overlap, w.overlap...)
	m.after = append(m.after, w.after...)
	m.apart = append(m.apart, w.apart...)
	m.sizes = append(m.sizes, run.size)
	end := func(i int) time.Time {
		if i+1 < len(run.marks) {
			return run.marks[i+1].at
		}
		return w.stepEnd
	}
	for i, p := range run.marks {
		if _, ok := m.phaseT[p.name]; !ok {
			m.order = append(m.order, p.name)
		}
		m.phaseT[p.name] += end(i).Sub(p.at)
	}
	for _, r := range w.overlapSpans {
		seen := map[string]bool{}
		for i, p := range run.marks {
			if !seen[p.name] && r.start.Before(end(i)) && r.start.Add(r.d).After(p.at) {
				seen[p.name] = true
				m.phases[p.name] = append(m.phases[p.name], r.d)
			}
		}
	}
	run.stepMode, run.marks = "", nil
}

// widthName names a partition width: day, hour, its duration, or none (the plain
// table).
func widthName(w time.Duration) string {
	switch w {
	case 0:
		return "none"
	case 24 * time.Hour:
		return "day"
	case time.Hour:
		return "hour"
	}
	return w.String()
}

// loadAvg is the machine's load averages, as uptime prints them.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// cleanupStep runs one step of a side's cleanup on conn: done when nothing is left;
// xids are the 32-bit ids of the transactions it wrote in (when it knows them).
type cleanupStep func(ctx context.Context, budget time.Duration) (done bool, xids []string, err error)

// batchedStep deletes expired keys 1000 a statement for budget (at least one
// statement), each statement in a transaction that reports its xid.
func batchedStep(conn *pgx.Conn) cleanupStep {
	return func(ctx context.Context, budget time.Duration) (bool, []string, error) {
		var xids []string
		for start := time.Now(); len(xids) == 0 || time.Since(start) < budget; {
			var k int64
			var xid string
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::xid::text`).Scan(&xid); err != nil {
					return err
				}
				var err error
				k, err = retention.ExpireFinished(ctx, tx, 30*24*time.Hour, 1000)
				return err
			})
			if err != nil {
				return false, xids, err
			}
			xids = append(xids, xid)
			if k == 0 {
				return true, xids, nil
			}
		}
		return false, xids, nil
	}
}

// removalStep removes the oldest remaining day of the expired partitions of width w
// (from oldest, the first one's start: one partition a step for day partitions, 24 for
// hour ones, each with its own detach and drop), in the removal modes in turn, and logs
// what the removal reported; each step's phases go to run.marks.
func removalStep(conn *pgx.Conn, oldest time.Time, w time.Duration, days int, run *cleanupRun) cleanupStep {
	k := 0
	perDay := int(24 * time.Hour / w)
	return func(ctx context.Context, _ time.Duration) (bool, []string, error) {
		run.stepMode, run.marks = removalModes[k%2], nil
		var heap, indexes int64
		day := oldest.Add(time.Duration(k) * 24 * time.Hour).UTC()
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(pg_relation_size(c.oid)), 0)::bigint, coalesce(sum(pg_indexes_size(c.oid)), 0)::bigint
			FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND c.relname LIKE $1 || '%'`,
			"idemflow_keys_p"+day.Format("20060102")).Scan(&heap, &indexes); err != nil {
			return false, nil, err
		}
		run.size = fmtBytes(heap) + "+" + fmtBytes(indexes)
		trace := func(phase string) { run.marks = append(run.marks, phaseMark{phase, time.Now()}) }
		var now time.Time
		if err := conn.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now); err != nil {
			return false, nil, err
		}
		upper := day.Add(24 * time.Hour)
		r, err := retention.RemovePartitions(ctx, conn, now.Sub(upper)-time.Minute, run.stepMode == "one-drop", trace)
		if err == nil && r.Removed != perDay {
			err = fmt.Errorf("step %d removed %d partitions, not %d", k+1, r.Removed, perDay)
		}
		if err != nil {
			return false, nil, err
		}
		run.removal = append(run.removal, r.Removal.Round(time.Millisecond).String())
		run.stalls = append(run.stalls, r.DropLock.Round(100*time.Microsecond).String())
		k++
		return k == days, nil, nil
	}
}

// spanPartitions detaches (attach false) or attaches again the partitions of width w
// that hold days [from, to) counted from oldest: the cleanup experiment keeps only
// -partition-cleanup-attached days of them attached at once. A detached partition keeps
// its rows and indexes, and attaching it again adopts its indexes; its partition
// constraint is checked by a scan of its ~10–50 MiB, outside the windows.
func spanPartitions(ctx context.Context, conn *pgx.Conn, oldest time.Time, w time.Duration, from, to int, attach bool) error {
	start, end := oldest.Add(time.Duration(from)*24*time.Hour).UTC(), oldest.Add(time.Duration(to)*24*time.Hour).UTC()
	for p := start; p.Before(end); p = p.Add(w) {
		name := pgx.Identifier{retention.PartitionName(p, w)}.Sanitize()
		sql := `ALTER TABLE idemflow_keys DETACH PARTITION ` + name
		if attach {
			sql = fmt.Sprintf(`ALTER TABLE idemflow_keys ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
				name, p.Format(time.RFC3339), p.Add(w).Format(time.RFC3339))
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("partitions cleanup: %s: %w", sql, err)
		}
	}
	return nil
}

// cleanupConn is a connection to s's database of its own application name.
func cleanupConn(ctx context.Context, s *growthDB) (*pgx.Conn, int, error) {
	cfg, err := poolConfig(s.db.serverURL, s.db.name, s.db.schema, appCleanup, 1)
	if err != nil {
		return nil, 0, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, 0, err
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		conn.Close(ctx)
		return nil, 0, err
	}
	return conn, pid, nil
}

// interleavedCleanup fills s with n expired keys and runs the pairs of windows until
// the cleanup is done: on partitions of width (a day's a step), or on the plain table
// (width 0).
func (e *env) interleavedCleanup(ctx context.Context, s *growthDB, width time.Duration, n, conc int) (*cleanupRun, error) {
	run := &cleanupRun{side: s.name, keys: n, width: width, doing: map[string]int{}, modes: map[string]*modeRun{}}
	run.without.waits, run.with.waits = map[string]int{}, map[string]int{}
	var midnight time.Time
	if err := s.pool.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&midnight); err != nil {
		return nil, err
	}
	days := e.o.partitionCleanupDays
	oldest := midnight.Add(-time.Duration(days+40) * 24 * time.Hour)
	if width > 0 {
		if err := attachSpan(ctx, s, oldest, oldest.Add(time.Duration(days)*24*time.Hour), width); err != nil {
			return nil, err
		}
	}
	if err := bulkKeys(ctx, s, n, oldest, oldest.Add(time.Duration(days)*24*time.Hour-time.Second)); err != nil {
		return nil, err
	}
	if l := e.runLoad(ctx, s.fresh, conc, e.o.warmup, nil); l.errs > 0 {
		return nil, l.firstErr
	}
	conn, pid, err := cleanupConn(ctx, s)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	wi, _, err := cleanupConn(ctx, s)
	if err != nil {
		return nil, err
	}
	defer wi.Close(context.WithoutCancel(ctx))
	if _, err := wi.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		logf("partitions cleanup: no pg_walinspect (%v): the cleanup's WAL is only estimated by subtraction", err)
		run.noInspect = true
	}
	step := batchedStep(conn)
	attached := e.o.partitionCleanupAttached
	if width > 0 {
		step = removalStep(conn, oldest, width, days, run)
		if attached > 0 && attached < days {
			if err := spanPartitions(ctx, conn, oldest, width, attached, days, false); err != nil {
				return nil, err
			}
		}
	}
	run.load = loadAvg()
	cpu0, _ := backendCPU(pid)
	for pair := 0; ; pair++ {
		if width > 0 {
			// The pair removes day `pair`: with attachments limited, its last day to
			// be attached joins now, and the pools plan their statements again over
			// the new set before the windows (the attach, like a detach, makes every
			// connection plan again).
			if d := pair + attached - 1; attached > 0 && pair > 0 && d < days {
				if err := spanPartitions(ctx, conn, oldest, width, d, d+1, true); err != nil {
					return nil, err
				}
				if l := e.runLoad(ctx, s.fresh, conc, e.o.warmup, nil); l.errs > 0 {
					return nil, l.firstErr
				}
			}
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idemflow_keys'::regclass`).Scan(&n); err != nil {
				return nil, err
			}
			run.attached = append(run.attached, n)
		}
		done, err := e.cleanupPair(ctx, s, conc, run, step, wi, pair%2 == 1)
		if err != nil || done {
			if err == nil {
				cpu1, _ := backendCPU(pid)
				run.cleanupCPU = cpu1 - cpu0
				run.load += " → " + loadAvg()
			}
			return run, err
		}
	}
}

// cleanupPair runs one window without and one with a cleanup step (withFirst: in that
// order), and attributes the step's WAL.
func (e *env) cleanupPair(ctx context.Context, s *growthDB, conc int, run *cleanupRun, step cleanupStep, wi *pgx.Conn, withFirst bool) (bool, error) {
	var done bool
	var without, with *partCleanupWin
	defer func() {
		if without != nil && with != nil {
			p99 := func(d []time.Duration) float64 { return float64(quantile(sortedDur(d), 0.99)) }
			base := max(p99(without.lats), 1)
			run.pairs = append(run.pairs, pairRatio{window: p99(with.lats) / base, overlap: p99(with.overlap) / base})
		}
	}()
	for i := range 2 {
		if (i == 0) != withFirst {
			w, err := e.partCleanupWindow(ctx, s, conc, nil)
			if err != nil {
				return false, err
			}
			run.add(&run.without, w)
			without = w
			continue
		}
		w, err := e.partCleanupWindow(ctx, s, conc, step)
		if err != nil {
			return false, err
		}
		run.add(&run.with, w)
		with = w
		run.overlap = append(run.overlap, w.overlap...)
		run.addMode(w)
		run.steps++
		run.stepTime += w.stepEnd.Sub(w.stepStart)
		run.longestStep = max(run.longestStep, w.stepEnd.Sub(w.stepStart))
		all, mine := w.stepLSN1-w.stepLSN0, int64(0)
		if !run.noInspect {
			var err error
			if all, mine, err = attributeWAL(ctx, wi, w.stepLSN0, w.stepLSN1, w.xids); err != nil {
				return false, err
			}
		}
		run.stepWAL += all
		run.cleanupWAL += mine
		done = w.done
	}
	return done, nil
}

// add pools window w into kind k.
func (run *cleanupRun) add(k *cleanupKind, w *partCleanupWin) {
	k.lats = append(k.lats, w.lats...)
	k.n += len(w.lats)
	k.elapsed += w.elapsed
	k.cpu += w.cpu
	k.wal += w.wal
	k.samples += w.samples
	for kinds, c := range w.waits {
		k.waits[kinds] += c
	}
	for d, c := range w.doing {
		run.doing[d] += c
	}
}

// attributeWAL reads the WAL records from lsn0 to lsn1 with pg_walinspect and returns
// their bytes (records with their full-page images) and those of the cleanup: records of the
// transactions xids, of transactions that wrote a system catalog (relfilenode below
// 16384), and records without a transaction that touch no user relation.
func attributeWAL(ctx context.Context, wi *pgx.Conn, lsn0, lsn1 int64, xids []string) (all, mine int64, err error) {
	if lsn1 <= lsn0 {
		return 0, 0, nil
	}
	err = wi.QueryRow(ctx, `WITH r AS (
	SELECT xid::text AS x, record_length::bigint AS len, -- full-page images included
		ARRAY(SELECT m[1]::bigint FROM regexp_matches(coalesce(block_ref, ''), 'rel \d+/\d+/(\d+)', 'g') AS m) AS rels
	FROM pg_get_wal_records_info(pg_lsn '0/0' + $1::numeric, pg_lsn '0/0' + $2::numeric)),
c AS (SELECT x FROM r WHERE x <> '0' GROUP BY x HAVING bool_or(EXISTS (SELECT 1 FROM unnest(rels) f WHERE f < 16384)))
SELECT coalesce(sum(len), 0)::bigint, coalesce(sum(len) FILTER (WHERE x = ANY($3::text[]) OR x IN (SELECT x FROM c)
	OR (x = '0' AND NOT EXISTS (SELECT 1 FROM unnest(rels) f WHERE f >= 16384))), 0)::bigint FROM r`,
		lsn0, lsn1, xids).Scan(&all, &mine)
	if err != nil {
		return 0, 0, fmt.Errorf("attribute WAL: %w", err)
	}
	return all, mine, nil
}

// partCleanupWin is one window of live traffic, with or without a cleanup step.
type partCleanupWin struct {
	lats, overlap      []time.Duration
	overlapSpans       []reqSpan       // the requests of overlap
	after, apart       []time.Duration // requests begun in the second after the step; the others
	elapsed, cpu       time.Duration
	wal                int64
	stepStart, stepEnd time.Time
	stepLSN0, stepLSN1 int64
	xids               []string
	done               bool
	samples            int
	waits              map[string]int // samples with a live backend waiting, by the locks waited on
	doing              map[string]int // the cleanup backend's wait event and statement, sampled
}

// reqSpan is one live request: when it began and how long it took.
type reqSpan struct {
	start time.Time
	d     time.Duration
}

// partCleanupWindow runs live fresh requests for the live window, or as long as the
// step (if any, started at the window's start) if longer, sampling pg_locks.
func (e *env) partCleanupWindow(ctx context.Context, s *growthDB, conc int, step cleanupStep) (*partCleanupWin, error) {
	w := &partCleanupWin{}
	spans := make([][]reqSpan, conc)
	fn := func(ctx context.Context, wk *worker) error {
		t0 := time.Now()
		err := s.fresh(ctx, wk)
		if err == nil {
			spans[wk.id] = append(spans[wk.id], reqSpan{t0, time.Since(t0)})
		}
		return err
	}
	stopSampler := e.lockSampler(ctx, s, w)
	cpu0, err0 := e.sideCPU(ctx, retainedSide{s.name, appLive, s})
	lsn0, err := walLSN(ctx, e)
	if err := errors.Join(err0, err); err != nil {
		return nil, err
	}
	done, stopLoad := make(chan struct{}), make(chan struct{})
	var l load
	go func() { defer close(done); l = e.runLoadUntil(ctx, fn, conc, stopLoad, nil) }()
	least := time.NewTimer(e.o.liveWindow)
	var serr error
	if step != nil {
		w.stepLSN0, serr = walLSN(ctx, e)
		w.stepStart = time.Now()
		if serr == nil {
			w.done, w.xids, serr = step(ctx, e.o.liveWindow)
		}
		w.stepEnd = time.Now()
		var err error
		w.stepLSN1, err = walLSN(ctx, e)
		serr = errors.Join(serr, err)
	}
	<-least.C
	close(stopLoad)
	<-done
	lsn1, err1 := walLSN(ctx, e)
	cpu1, err2 := e.sideCPU(ctx, retainedSide{s.name, appLive, s})
	stopSampler()
	if err := errors.Join(serr, err1, err2); err != nil {
		return nil, err
	}
	if l.errs > 0 {
		return nil, fmt.Errorf("live traffic: %d requests failed: %w", l.errs, l.firstErr)
	}
	w.lats, w.elapsed, w.cpu, w.wal = l.lats, l.elapsed, cpu1-cpu0, lsn1-lsn0
	for _, ws := range spans {
		for _, r := range ws {
			switch {
			case step == nil:
			case r.start.Before(w.stepEnd) && r.start.Add(r.d).After(w.stepStart):
				w.overlap = append(w.overlap, r.d)
				w.overlapSpans = append(w.overlapSpans, r)
			case !r.start.Before(w.stepEnd) && r.start.Before(w.stepEnd.Add(time.Second)):
				w.after = append(w.after, r.d)
			default:
				w.apart = append(w.apart, r.d)
			}
		}
	}
	return w, nil
}

// lockSampler samples pg_locks every 5 ms for a live backend of s's database waiting
// on a lock, into w, until the returned function is called.
func (e *env) lockSampler(ctx context.Context, s *growthDB, w *partCleanupWin) (stop func()) {
	quit, finished := make(chan struct{}), make(chan struct{})
	w.waits, w.doing = map[string]int{}, map[string]int{}
	go func() {
		defer close(finished)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			var kinds []string
			var doing *string
			if err := e.check.QueryRow(ctx, `SELECT coalesce(array_agg(l.locktype || ' ' || l.mode), '{}'),
	(SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') || ' ' || left(query, 44) FROM pg_stat_activity
	WHERE datname = $1 AND application_name = $3 AND state = 'active' LIMIT 1)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = $1 AND a.application_name = $2`, s.db.name, appLive, appCleanup).Scan(&kinds, &doing); err == nil {
				if doing != nil {
					w.doing[*doing]++
				}
				w.samples++
				if len(kinds) > 0 {
					slices.Sort(kinds)
					w.waits[strings.Join(slices.Compact(kinds), ", ")]++
				}
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// bulkKeys inserts n finished keys created (and finished) evenly from `from` to `to`
// into s's key table with its indexes dropped, then builds them again (a sort each,
// far faster than n random insertions into a primary key of random keys), then
// VACUUM ANALYZE and a CHECKPOINT, so that the windows do not start amid the load's
// checkpoint.
func bulkKeys(ctx context.Context, s *growthDB, n int, from, to time.Time) error {
	start := time.Now()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `SELECT c.conname, pg_get_constraintdef(c.oid), NULL FROM pg_constraint c
WHERE c.conrelid = 'idemflow_keys'::regclass AND c.contype = 'p'
UNION ALL SELECT i.indexrelid::regclass::text, NULL, pg_get_indexdef(i.indexrelid) FROM pg_index i
WHERE i.indrelid = 'idemflow_keys'::regclass AND NOT i.indisprimary`)
	if err != nil {
		return err
	}
	type def struct{ name, con, idx *string }
	defs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (def, error) {
		var d def
		return d, r.Scan(&d.name, &d.con, &d.idx)
	})
	if err != nil {
		return err
	}
	var drop, build []string
	for _, d := range defs {
		if d.con != nil {
			drop = append(drop, `ALTER TABLE idemflow_keys DROP CONSTRAINT `+pgx.Identifier{*d.name}.Sanitize())
			build = append(build, `ALTER TABLE idemflow_keys ADD CONSTRAINT `+pgx.Identifier{*d.name}.Sanitize()+` `+*d.con)
		} else {
			drop = append(drop, `DROP INDEX `+*d.name)
			// A partitioned table's index is defined ON ONLY the parent, which would
			// build it on no partition.
			build = append(build, strings.Replace(*d.idx, " ON ONLY ", " ON ", 1))
		}
	}
	if err := execAll(ctx, conn.Conn(), drop); err != nil {
		return err
	}
	if err := insertSpread(ctx, conn.Conn(), n, from, to); err != nil {
		return err
	}
	build = append([]string{`SET maintenance_work_mem = '512MB'`}, append(build, `RESET maintenance_work_mem`,
		`VACUUM (ANALYZE) idemflow_keys`, `CHECKPOINT`)...)
	if err := execAll(ctx, conn.Conn(), build); err != nil {
		return err
	}
	logf("partitions cleanup: %d keys into %s in %s (indexes built after; load %s)", n, s.name, time.Since(start).Round(time.Millisecond), loadAvg())
	return nil
}

// execAll runs the statements one by one.
func execAll(ctx context.Context, conn *pgx.Conn, stmts []string) error {
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%.60s…: %w", q, err)
		}
	}
	return nil
}

// insertSpread inserts n finished keys created (and finished) evenly from `from` to
// `to`, random UUID keys under 16 scopes, a million a statement.
func insertSpread(ctx context.Context, conn interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, n int, from, to time.Time) error {
	const chunk = 1000000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		_, err := conn.Exec(ctx, `
INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body,
	recovery_point, phase_data, status, response_status, response_headers, response_body,
	created_at, updated_at, finished_at)
SELECT 'acct_' || (i % 16), gen_random_uuid()::text, gen_random_uuid(), $5, 'POST', '/v1/charges',
	sha256(('old-' || i)::bytea), ''::bytea, 'finished', '{}', 'finished', 201,
	'{"Content-Type":["application/json"]}', $4::bytea, t, t, t
FROM generate_series($1::int, $2::int) AS i,
	LATERAL (SELECT $6::timestamptz + (i::float8 / $3) * ($7::timestamptz - $6::timestamptz) AS t) AS ts`,
			lo, hi, float64(n), []byte(`{"id":"ch_old","amount":1999,"currency":"usd","status":"succeeded","provider_payment_id":"pay_000001"}`),
			chargeflow.FlowName, from, to)
		if err != nil {
			return fmt.Errorf("insert keys: %w", err)
		}
	}
	return nil
}

// sortedDur is d sorted (a copy).
func sortedDur(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}
