package main

import (
	"cmp"
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
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/retention"
	"github.com/idemflow/idemflow/workflow"
)

// The partitioned key table side by side with batched deletes (issue 28,
// docs/PARTITIONS.md), -phases partitions with -partition-keys N:
//
//   - cleanup: two databases, each with N finished keys expired 40 to 50 days ago
//     (-partition-batched-keys on the plain one), cleaned up by batched deletes
//     (Store.ExpireFinished) on the plain table and by Store.RemovePartitions on the
//     partitioned one, in interleaved pairs of live windows without and with a cleanup
//     step, the cleanup's WAL attributed with pg_walinspect (partcleanup.go); then the
//     partitions of the next 60 days created under live traffic, pg_locks sampled.
//     Skipped with -partition-cleanup=false.
//   - retained (-partition-retained): fresh and replay latency, and the server CPU per request, in
//     interleaved cells, on a plain empty key table, an empty partitioned one with the
//     same 38 day partitions (30 past, the current, 7 ahead), one holding N finished
//     keys spread over 30 day partitions (a 30-day retention), and the same two with
//     week partitions; with -partition-custom-plans also the day sides through pools
//     whose connections force custom plans. This separates the partition count from
//     the data.

// liveStats are a window of live traffic.
type liveStats struct {
	N        int
	RPS      float64
	P50, P99 time.Duration
	walBytes int64
	elapsed  time.Duration
}

// partitionsRun runs the experiment on each configuration of -partition-configs, one
// after the other (issue 40 item 5: production-like beside the defaults); the budget
// figures come from the first configuration, the others are logged.
func (e *env) partitionsRun(ctx context.Context) error {
	configs, err := growthConfigsOf(e.o.partitionConfigs, memTotalKB())
	if err != nil {
		return fmt.Errorf("-partition-configs: %w", err)
	}
	for i, c := range configs {
		url, stop, err := e.growthServer(ctx, c)
		if err != nil {
			return err
		}
		e.partFS = discardNote(dataFileSystem(ctx, url))
		logf("partitions: the %s configuration %v; %s", c.name, c.settings, e.partFS)
		err = e.partitionsOn(ctx, url, i == 0)
		stop()
		if err != nil {
			return fmt.Errorf("partitions (%s configuration): %w", c.name, err)
		}
	}
	return nil
}

// partitionsOn runs the experiment on the server at serverURL; its figures go to the
// report when judged. The part's server-wide reads (pg_locks, the WAL position, the
// backends' pids) go through e.check, which points at that server meanwhile.
func (e *env) partitionsOn(ctx context.Context, serverURL string, judged bool) error {
	if serverURL != e.db.serverURL {
		check, err := pgxpool.New(ctx, serverURL)
		if err != nil {
			return err
		}
		defer check.Close()
		prev := e.check
		e.check = check
		defer func() { e.check = prev }()
	}
	if !judged {
		prev := e.figs
		e.figs = &figures{}
		defer func() { e.figs = prev }()
	}
	n := e.o.partitionKeys
	prov := httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
	defer prov.Close()
	conc := e.o.partitionConc
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
		s, err := e.newGrowthDB(ctx, serverURL, name, prov.URL, conc+2)
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
		if err := e.cleanupSides(ctx, sideW, n, conc); err != nil {
			return err
		}
	}
	if e.o.partitionDayKeys > 0 {
		if err := e.weekSizes(ctx, side, e.o.partitionDayKeys); err != nil {
			return fmt.Errorf("partitions: week of sizes: %w", err)
		}
	}
	if n <= 0 || !e.o.partitionRetained {
		return nil
	}
	var dbs []retainedSpec
	for _, sp := range retainedSpecs {
		if sp.name != "pt_empty" && !slices.Contains(e.o.partitionSides, sp.flag) {
			continue
		}
		s, err := sideW(sp.name, sp.width)
		if err != nil {
			return err
		}
		sp.s = s
		dbs = append(dbs, sp)
	}
	return e.retainedCells(ctx, prov.URL, dbs, n, conc)
}

// retainedSpec is one side of the retained-keys cells: a key table of the plain
// layout (width 0) or partitioned by width, with the past 30 days' partitions
// attached, holding the part's keys over those 30 days or none.
type retainedSpec struct {
	name, flag string // the side's name in the log; its name in -partition-sides
	width      time.Duration
	keys       bool
	s          *growthDB
}

// retainedSpecs are the sides the retained-keys cells can run, pt_empty (the empty
// plain table, every ratio's reference) first. The chosen layout for a 30-day
// retention is week partitions (docs/PARTITIONS.md): pt_retainedweek is judged
// against pt_retainedplain, the plain table holding the same keys.
var retainedSpecs = []retainedSpec{
	{name: "pt_empty", flag: "empty"},
	{name: "pt_retainedplain", flag: "plain", keys: true},
	{name: "pt_emptypart", flag: "emptyday", width: store.PartitionDay},
	{name: "pt_retained", flag: "day", width: store.PartitionDay, keys: true},
	{name: "pt_emptyweek", flag: "emptyweek", width: store.PartitionWeek},
	{name: "pt_retainedweek", flag: "week", width: store.PartitionWeek, keys: true},
}

// partitionSideNames are the names -partition-sides takes.
var partitionSideNames = func() []string {
	var out []string
	for _, sp := range retainedSpecs {
		out = append(out, sp.flag)
	}
	return out
}()

// partitionSidesOf parses -partition-sides.
func partitionSidesOf(list string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(partitionSideNames, n) {
			return nil, fmt.Errorf("-partition-sides: %q: want some of %s", n, strings.Join(partitionSideNames, ","))
		}
		out = append(out, n)
	}
	return out, nil
}

// cleanupSides runs the interleaved cleanup experiment (partcleanup.go) on a plain side
// (batched deletes of -partition-batched-keys keys) and a partitioned one (removal of
// n keys' -partition-cleanup-days days of partitions, -partition-cleanup-width wide).
func (e *env) cleanupSides(ctx context.Context, side func(string, time.Duration) (*growthDB, error), n, conc int) error {
	var results []*cleanupRun // batched, then partitioned
	defer func() { e.cleanupFigures(results) }()
	for _, c := range []struct {
		name  string
		width time.Duration // 0: the plain table
		keys  int
	}{{"pt_batched", 0, cmp.Or(e.o.partitionBatchedKeys, n)}, {"pt_partitioned", e.o.partitionCleanupWidth, n}} {
		s, err := side(c.name, c.width)
		if err != nil {
			return err
		}
		res, err := e.interleavedCleanup(ctx, s, c.width, c.keys, conc)
		if err != nil {
			return fmt.Errorf("partitions: cleanup %s: %w", c.name, err)
		}
		res.log()
		results = append(results, res)
		if c.width > 0 {
			if err := e.creationLocks(ctx, s, c.width, conc); err != nil {
				return fmt.Errorf("partitions: creation %s: %w", c.name, err)
			}
		}
	}
	return nil
}

// p99Ratio is the live p99 with cleanup (or overlapping a step) ÷ without.
func (r *cleanupRun) p99Ratio(with []time.Duration) float64 {
	return float64(quantile(sortedDur(with), 0.99)) / float64(max(quantile(sortedDur(r.without.lats), 0.99), 1))
}

// walPerKey is the cleanup's attributed WAL per expired key, and the old estimate's
// (the steps' WAL less the live traffic's at the windows-without rate; also the first
// without pg_walinspect).
func (r *cleanupRun) walPerKey() (attributed, estimated float64) {
	rate := float64(r.without.wal) / max(r.without.elapsed.Seconds(), 1e-9)
	est := max(float64(r.stepWAL)-rate*r.stepTime.Seconds(), 0) / float64(max(r.keys, 1))
	if r.noInspect {
		return est, est
	}
	return float64(r.cleanupWAL) / float64(max(r.keys, 1)), est
}

// log logs one side's figures.
func (r *cleanupRun) log() {
	q := func(d []time.Duration, x float64) float64 { return ms(quantile(sortedDur(d), x)) }
	perReq := func(k cleanupKind) float64 { return float64(k.cpu) / float64(max(k.n, 1)) / float64(time.Microsecond) }
	rps := func(k cleanupKind) float64 { return float64(k.n) / max(k.elapsed.Seconds(), 1e-9) }
	att, est := r.walPerKey()
	logf("partitions cleanup %-14s keys=%d partitions=%s steps=%d (%s in all, longest %s; cleanup backend CPU %s) load %s",
		r.side, r.keys, widthName(r.width), r.steps, r.stepTime.Round(time.Millisecond), r.longestStep.Round(time.Millisecond), r.cleanupCPU, r.load)
	logf("partitions cleanup %-14s live without: n=%d %.0f req/s p50 %.2f p99 %.2f ms CPU %.0f µs/req; with: n=%d %.0f req/s p50 %.2f p99 %.2f ms CPU %.0f µs/req (p99 ×%.3f); overlapping a step: n=%d p50 %.2f p99 %.2f ms (×%.3f)",
		r.side, r.without.n, rps(r.without), q(r.without.lats, 0.5), q(r.without.lats, 0.99), perReq(r.without),
		r.with.n, rps(r.with), q(r.with.lats, 0.5), q(r.with.lats, 0.99), perReq(r.with), r.p99Ratio(r.with.lats),
		len(r.overlap), q(r.overlap, 0.5), q(r.overlap, 0.99), r.p99Ratio(r.overlap))
	logf("partitions cleanup %-14s WAL: steps' ranges %s, the cleanup's (pg_walinspect) %s = %.2f B/key; estimate by subtraction %.2f B/key; live WAL %.0f B/req without, %.0f B/req with (whole windows); samples with a live lock wait: with %v of %d, without %v of %d",
		r.side, fmtBytes(r.stepWAL), fmtBytes(r.cleanupWAL), att, est,
		float64(r.without.wal)/float64(max(r.without.n, 1)), float64(r.with.wal-r.cleanupWAL)/float64(max(r.with.n, 1)),
		r.with.waits, r.with.samples, r.without.waits, r.without.samples)
	logf("partitions cleanup %-14s live p99 %s", r.side, r.pairSpread())
	if len(r.attached) > 0 {
		logf("partitions cleanup %-14s partitions attached to the key table at each step's start: %v", r.side, r.attached)
	}
	if len(r.removal) > 0 {
		logf("partitions cleanup %-14s each removal's time: %v; longest drop lock hold: %v", r.side, r.removal, r.stalls)
	}
	logf("partitions cleanup %-14s the cleanup backend, sampled every 5 ms while active (wait event, statement): %v", r.side, r.doing)
	r.logModes()
}

// logModes logs the partitioned side's figures per removal mode and, within each,
// per phase of the removal: the live requests that overlapped it against those of
// the windows without.
func (r *cleanupRun) logModes() {
	q := func(d []time.Duration, x float64) float64 { return ms(quantile(sortedDur(d), x)) }
	ratio := func(d []time.Duration, x float64) float64 {
		return float64(quantile(sortedDur(d), x)) / float64(max(quantile(sortedDur(r.without.lats), x), 1))
	}
	for _, name := range removalModes {
		m := r.modes[name]
		if m == nil {
			continue
		}
		logf("partitions cleanup %-14s removal %-8s steps=%d: windows with n=%d p50 %.2f p99 %.2f ms (p99 ×%.3f); overlapping a step n=%d p50 %.2f p99 %.2f ms (p50 ×%.3f, p99 ×%.3f)",
			r.side, name, m.steps, len(m.with), q(m.with, 0.5), q(m.with, 0.99), ratio(m.with, 0.99),
			len(m.overlap), q(m.overlap, 0.5), q(m.overlap, 0.99), ratio(m.overlap, 0.5), ratio(m.overlap, 0.99))
		logf("partitions cleanup %-14s removal %-8s begun in the second after a step n=%d p50 %.2f p99 %.2f ms (p50 ×%.3f, p99 ×%.3f); the rest of its windows n=%d p50 %.2f p99 %.2f ms (p50 ×%.3f, p99 ×%.3f); partitions removed (heap+indexes): %v",
			r.side, name, len(m.after), q(m.after, 0.5), q(m.after, 0.99), ratio(m.after, 0.5), ratio(m.after, 0.99),
			len(m.apart), q(m.apart, 0.5), q(m.apart, 0.99), ratio(m.apart, 0.5), ratio(m.apart, 0.99), m.sizes)
		for _, ph := range m.order {
			d := m.phases[ph]
			logf("partitions cleanup %-14s removal %-8s phase %-7s %s a step; requests overlapping it n=%d p50 %.2f p99 %.2f ms (p50 ×%.3f, p99 ×%.3f)",
				r.side, name, ph, (m.phaseT[ph] / time.Duration(max(m.steps, 1))).Round(time.Millisecond),
				len(d), q(d, 0.5), q(d, 0.99), ratio(d, 0.5), ratio(d, 0.99))
		}
	}
}

// creationLocks creates partitions of width w on s up to 60 widths ahead (a week more
// for partitions narrower than a day, whose set-up made a week ahead) with
// Store.EnsurePartitions while live fresh requests run, sampling pg_locks, and hands
// the report the samples in which a live request waited.
func (e *env) creationLocks(ctx context.Context, s *growthDB, w time.Duration, conc int) error {
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
		ahead := 60 * w
		if w < 24*time.Hour {
			ahead += 7 * 24 * time.Hour // the set-up made a week ahead already
		}
		rep, err = store.New().EnsurePartitions(ctx, conn, ahead)
		if err == nil && rep.Created == 0 {
			err = errors.New("created no partition")
		}
		return err
	}
	lw, err := e.liveWindow(ctx, s, conc, e.o.liveWindow, create, pid)
	if err != nil {
		return err
	}
	logf("partitions creation %s: %d partitions created under live traffic; lock waits seen: %v", s.name, rep.Created, lw.kinds)
	e.figs.set(figPartLockWaitsCreate, float64(lw.lockWaits), fmt.Sprintf("%d of %d samples (pg_locks every 5 ms) with a live backend waiting on a lock other than relation extension, while %d partitions were created and attached (live inserts waiting on each other to extend the current partition: %d samples)",
		lw.lockWaits, lw.samples, rep.Created, lw.extendWaits))
	return nil
}

// cleanupFigures hands the report issue 28's cleanup figures, when both sides ran.
func (e *env) cleanupFigures(rs []*cleanupRun) {
	if len(rs) < 2 {
		return
	}
	b, p := rs[0], rs[1]
	bk, _ := b.walPerKey()
	pk, _ := p.walPerKey()
	e.figs.set(figPartWALFactor, bk/max(pk, 0.001), fmt.Sprintf("%.1f B vs %.3f B of WAL per key (%.0f× below; %s; %d keys removed, %d deleted)",
		bk, pk, bk/max(pk, 0.001), map[bool]string{false: "pg_walinspect, the cleanup's records only", true: "estimated by subtraction: no pg_walinspect"}[p.noInspect || b.noInspect],
		p.keys, b.keys))
	x, y := p.p99Ratio(p.with.lats), p.p99Ratio(p.overlap)
	nw, no, steps, alt := p.with.n, len(p.overlap), p.steps, ""
	if pm, om := p.modes[removalModes[0]], p.modes[removalModes[1]]; pm != nil && om != nil {
		// the library's removal (one drop); the paced experiment beside it
		x, y, nw, no, steps = p.p99Ratio(pm.with), p.p99Ratio(pm.overlap), len(pm.with), len(pm.overlap), pm.steps
		alt = fmt.Sprintf("; the same run's %d paced removals (indexes shed first): %.2f× and %.2f×", om.steps, p.p99Ratio(om.with), p.p99Ratio(om.overlap))
	}
	attached := ""
	if len(p.attached) > 0 {
		attached = fmt.Sprintf(", %d–%d partitions attached at a step's start", slices.Min(p.attached), slices.Max(p.attached))
	}
	e.figs.set(figPartCleanupP99, max(x, y), fmt.Sprintf("%s-wide partitions: windows with removal %.2f× (%d requests), requests overlapping a removal %.2f× (%d), against %d without, %d interleaved pairs%s (batched deletes: %.2f×); both modes %s; %d closed loops of live requests%s; %s",
		widthName(p.width), x, nw, y, no, p.without.n, steps, alt, b.p99Ratio(b.with.lats), p.pairSpread(), e.o.partitionConc, attached, e.partFS))
	other, extend := p.with.waited()
	_, extendWithout := p.without.waited()
	e.figs.set(figPartLockWaitsRemove, float64(other), fmt.Sprintf("%d of %d samples (pg_locks every 5 ms) in windows with a removal with a live backend waiting on a lock other than relation extension (live inserts waiting on each other to extend the current partition: %d samples with, %d of %d without)",
		other, p.with.samples, extend, extendWithout, p.without.samples))
}

// liveWindow runs fresh requests for dur, or until cleanup (if given, run from the
// window's start) ends if that is later, sampling pg_locks every 5 ms for a live
// backend of s's database (not the cleanup's, cleanupPid) waiting on a lock, those
// waiting only to extend a relation (live inserts into the current partition wait on
// each other for that, cleanup or not, as in cleanupKind.waited) counted apart; it
// returns the window with the WAL written during the cleanup (or the whole window
// without one).
func (e *env) liveWindow(ctx context.Context, s *growthDB, conc int, dur time.Duration, cleanup func() error, cleanupPid int) (liveStatsSampled, error) {
	var out liveStatsSampled
	stop := make(chan struct{})
	sampled := make(chan [3]int, 1)
	out.kinds = map[string]int{}
	go func() {
		waits, extends, samples := 0, 0, 0
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				sampled <- [3]int{waits, extends, samples}
				return
			case <-t.C:
			}
			var kinds []string
			if err := e.check.QueryRow(ctx, `SELECT coalesce(array_agg(l.locktype || ' ' || l.mode), '{}') FROM pg_locks l
	JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = $1 AND a.application_name = $2 AND a.pid <> $3`, s.db.name, appLive, cleanupPid).Scan(&kinds); err == nil {
				samples++
				other := false
				for _, k := range kinds {
					out.kinds[k]++ // read after stop
					other = other || k != extendWait
				}
				switch {
				case other:
					waits++
				case len(kinds) > 0:
					extends++
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
	out.lockWaits, out.extendWaits, out.samples = ws[0], ws[1], ws[2]
	return out, nil
}

// liveStatsSampled is a live window and its lock samples.
type liveStatsSampled struct {
	liveStats
	lockWaits, samples int            // samples with a live backend waiting on a lock other than relation extension; all samples
	extendWaits        int            // samples with live backends waiting on relation extension only
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
// days ago (from ≥ to), by the database clock, skipping those that exist.
func attachDays(ctx context.Context, s *growthDB, from, to int) error {
	var midnight time.Time
	if err := s.pool.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&midnight); err != nil {
		return err
	}
	day := 24 * time.Hour
	return attachSpan(ctx, s, midnight.Add(-time.Duration(from)*day), midnight.Add(-time.Duration(to-1)*day), day)
}

// attachWeeks creates and attaches the week partitions (Monday to Monday, UTC) from the
// one holding `days` days ago up to the current one, which SetupPartitioned created.
func attachWeeks(ctx context.Context, s *growthDB, days int) error {
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return err
	}
	w := store.PartitionWeek
	return attachSpan(ctx, s, now.UTC().Add(-time.Duration(days)*24*time.Hour).Truncate(w), now.UTC().Truncate(w), w)
}

// attachSpan creates and attaches the partitions of width w from from to to, under
// the names the Store gives its own, skipping those that exist.
func attachSpan(ctx context.Context, s *growthDB, from, to time.Time, w time.Duration) error {
	for p := from.UTC(); p.Before(to); p = p.Add(w) {
		name := pgx.Identifier{retention.PartitionName(p, w)}.Sanitize()
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
			return err
		}
		if exists {
			continue
		}
		_, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION %[1]s FOR VALUES FROM ('%s') TO ('%s')`, name,
			p.Format(time.RFC3339), p.Add(w).Format(time.RFC3339)))
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
	var from, to time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now() - $1::interval, now() - $2::interval`, oldest, newest).Scan(&from, &to); err != nil {
		return err
	}
	if err := insertSpread(ctx, s.pool, n, from, to); err != nil {
		return err
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

// planModeSide is another pool and engine on s's database whose connections plan
// their statements as mode (plan_cache_mode: force_custom_plan plans every statement
// for its parameters, force_generic_plan once for all).
func (e *env) planModeSide(ctx context.Context, s *growthDB, providerURL, name, mode string, conc int) (*growthDB, error) {
	cfg, err := poolConfig(s.db.serverURL, s.db.name, s.db.schema, "bench-"+name, int32(conc+2))
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = mode
	c := &growthDB{name: name, db: benchDB{serverURL: s.db.serverURL, name: s.db.name, schema: s.db.schema}, replay: newRecentRing(200000)}
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

// retainedSides fills the sides of the retained-keys cells (their past 30 days'
// partitions attached, the part's n keys inserted where the spec says) and returns
// them, with the custom-plan sides of the day-partitioned ones when asked; closeAll
// closes their pools.
func (e *env) retainedSides(ctx context.Context, providerURL string, dbs []retainedSpec, n, conc int) (sides []retainedSide, closeAll func(), err error) {
	closeAll = func() {}
	parts := map[string]int{}
	for _, sp := range dbs {
		switch sp.width {
		case store.PartitionDay:
			err = attachDays(ctx, sp.s, 30, 0)
		case store.PartitionWeek:
			err = attachWeeks(ctx, sp.s, 30)
		}
		if err != nil {
			return nil, closeAll, err
		}
		if sp.keys {
			if err := insertKeys(ctx, sp.s, n, "30 days", "1 hour"); err != nil {
				return nil, closeAll, err
			}
		}
		if sp.width > 0 {
			var p int
			if err := sp.s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idemflow_keys'::regclass`).Scan(&p); err != nil {
				return nil, closeAll, err
			}
			parts[sp.name] = p
		}
		sides = append(sides, retainedSide{sp.name, appLive, sp.s})
	}
	logf("partitions: partitions of each side: %v", parts)
	for _, sp := range dbs {
		suffix, mode := "_custom", "force_custom_plan"
		switch {
		case e.o.partitionCustom && sp.width == store.PartitionDay:
		case e.o.partitionGeneric && sp.width == store.PartitionWeek:
			suffix, mode = "_generic", "force_generic_plan"
		default:
			continue
		}
		name := sp.name + suffix
		c, err := e.planModeSide(ctx, sp.s, providerURL, name, mode, conc)
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
func (e *env) retainedCells(ctx context.Context, providerURL string, dbs []retainedSpec, n, conc int) error {
	empty := dbs[0].s
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
	e.logSideStatements(ctx, sides)
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
		e.chosenLayoutFigure(mode, p50, cpu, n)
	}
	return nil
}

// chosenLayoutFigure hands the report issue 40's line for mode: the chosen layout
// (week partitions, for the 30-day retention) holding the part's keys against the
// plain table holding the same keys, the median of the per-round ratios of p50, with
// the rounds' range and the server CPU per request beside it.
func (e *env) chosenLayoutFigure(mode string, p50, cpu map[string][]time.Duration, n int) {
	week, plain := p50["pt_retainedweek "+mode], p50["pt_retainedplain "+mode]
	if len(week) == 0 || len(week) != len(plain) {
		return
	}
	var ratios []float64
	for r := range week {
		ratios = append(ratios, float64(week[r])/float64(plain[r]))
	}
	slices.Sort(ratios)
	med := ratios[len(ratios)/2]
	cw, cp := medianDur(cpu["pt_retainedweek "+mode]), medianDur(cpu["pt_retainedplain "+mode])
	cpuRatio := 0.0
	if cp > 0 {
		cpuRatio = float64(cw) / float64(cp)
	}
	id := map[string]string{"fresh": figChosenFresh, "replay": figChosenReplay}[mode]
	e.figs.set(id, med, fmt.Sprintf("%.2f× (rounds %.2f–%.2f; p50 %.2f vs %.2f ms; server CPU %.0f vs %.0f µs/req, %.2f×; %d keys over 30 days in week partitions against the plain table, %d rounds)",
		med, ratios[0], ratios[len(ratios)-1], ms(medianDur(week)), ms(medianDur(plain)),
		float64(cw)/float64(time.Microsecond), float64(cp)/float64(time.Microsecond), cpuRatio, n, len(ratios)))
	logf("partitions retained %-6s chosen layout (week) ÷ plain, both holding %d keys: %s", mode, n, e.figs.text(id))
}

// logSideStatements logs, for each side, the statements its backends spent the most
// time in over the cells (pg_stat_statements, where the server has it loaded:
// the bench's own server; the production-like one does not load it), with their mean
// execution and planning time and shared buffers read: where a side's extra cost is.
func (e *env) logSideStatements(ctx context.Context, sides []retainedSide) {
	if _, err := e.check.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		logf("partitions statements: not read (%v)", err)
		return
	}
	for _, sd := range sides {
		rows, err := e.check.Query(ctx, `SELECT calls, total_exec_time / calls, total_plan_time / calls,
	(shared_blks_hit + shared_blks_read)::float8 / calls, left(regexp_replace(query, '\s+', ' ', 'g'), 110)
FROM pg_stat_statements(true) s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1 AND calls > 100 ORDER BY total_exec_time + total_plan_time DESC LIMIT 8`, sd.s.db.name)
		if err != nil {
			logf("partitions statements %s: not read (%v)", sd.name, err)
			return
		}
		for rows.Next() {
			var calls int64
			var exec, plan, blks float64
			var q string
			if err := rows.Scan(&calls, &exec, &plan, &blks, &q); err != nil {
				rows.Close()
				return
			}
			logf("partitions statements %-21s %8d calls exec %7.3f ms plan %6.3f ms %6.1f blocks  %s", sd.name, calls, exec, plan, blks, q)
		}
		rows.Close()
	}
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
		st := store.New()
		var sizes []string
		var cleanup time.Duration
		for d := range days {
			from := base.Add(time.Duration(d) * 24 * time.Hour)
			if err := insertSpread(ctx, s.pool, perDay, from, from.Add(24*time.Hour-time.Second)); err != nil {
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
func weekCleanup(ctx context.Context, s *growthDB, st *store.Store, partitioned bool, cutoff time.Time) error {
	age := func() (time.Duration, error) {
		var now time.Time
		err := s.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now)
		return now.Sub(cutoff), err
	}
	if partitioned {
		r, err := age()
		if err == nil {
			_, err = st.RemovePartitions(ctx, s.pool, r)
		}
		return err
	}
	for {
		r, err := age()
		if err != nil {
			return err
		}
		k, err := retention.ExpireFinished(ctx, s.pool, r, 1000)
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
