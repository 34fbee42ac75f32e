package keytable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// partitionLockSalt is mixed into the maintenance lock's id (with the key table's oid,
// as the claim lock's): the FNV-1a hash of "idemflow partitions".
const partitionLockSalt int64 = 0x1dfb3a64f0c59e27

// SetupPartitioned turns the key table, freshly migrated and empty, into the
// partitioned layout (docs/PARTITIONS.md) with partitions of width w (PartitionDay, PartitionWeek,
// PartitionHour, or any width that divides a day into whole minutes), and creates
// partitions from the current one to ahead from now (0: partitionsAheadDefault, or ten
// partitions for widths under an hour). It
// runs in one transaction: the table keeps its columns, defaults, state checks and
// indexes; its primary key becomes (scope, idempotency_key, created_at). A table
// already partitioned is left as it is, and only its partitions are ensured. It fails
// with ErrNotEmpty when the table has rows, ErrNotPartitioned when it does not exist.
func (s *Store) SetupPartitioned(ctx context.Context, db PartitionDB, w, ahead time.Duration) error {
	if err := validWidth(w); err != nil {
		return fmt.Errorf("set up partitions: %w", err)
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlPartitionLockTimeout); err != nil {
			return err
		}
		l, err := s.layout(ctx, tx)
		if err != nil || l.partitioned {
			return err
		}
		dist, err := readCitusDistribution(ctx, tx, l)
		if err != nil {
			return err
		}
		var rows bool
		if err := queryRow(ctx, tx, []any{&rows}, sqlHasRows(l.ident(keyTable))); err != nil {
			return err
		}
		if rows {
			return ErrNotEmpty
		}
		if err := repartition(ctx, tx, l); err != nil {
			return err
		}
		if err := dist.distribute(ctx, tx, l); err != nil {
			return err
		}
		l.partitioned = true
		_, err = createAhead(ctx, tx, l, w, ahead)
		return err
	})
	if err != nil {
		return fmt.Errorf("set up partitions: %w", Classify(err))
	}
	_, err = s.EnsurePartitions(ctx, db, ahead)
	return err
}

// repartition replaces the empty key table of l by a partitioned one with the same
// columns, defaults, checks and (non-primary) indexes, in tx.
func repartition(ctx context.Context, tx pgx.Tx, l *partitionLayout) error {
	table, old := l.ident(keyTable), l.ident(keyTable+"_unpartitioned")
	// The indexes' definitions, read before the rename: they name the table as
	// idemflow_keys, so they are re-run on the new table as they are.
	rows, err := tx.Query(ctx, sqlIndexDefs, table)
	if err != nil {
		return err
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	stmts := append(sqlRepartition(table, old), readCommittedOnly(l)...)
	for _, sql := range append(stmts, indexes...) {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%.60s…: %w", sql, err)
		}
	}
	return nil
}

// readCommittedOnly are the statements that make l's partitioned key table refuse an
// insert outside READ COMMITTED: a statement trigger on the table. Without a unique
// index across partitions, one row per (scope, key) rests on the claim lock and a
// look-up in a snapshot taken after it, which REPEATABLE READ and SERIALIZABLE do not
// give (their snapshot is taken before the lock): such a claim would insert a second
// row where the default layout's primary key refuses it (docs/PARTITIONS.md). The
// refusal is SQLSTATE 0A000, which Classify makes ErrRefused.
func readCommittedOnly(l *partitionLayout) []string {
	return sqlReadCommittedOnly(l.ident(keyTable+"_read_committed"), l.ident(keyTable))
}

// EnsurePartitions creates the partitions missing from the current one to ahead from
// now by the database clock (0: partitionsAheadDefault, or ten partitions for widths
// under an hour), each by creating a table and
// then attaching it, which no live statement waits on (docs/PARTITIONS.md). It runs in
// one short transaction under the key table's maintenance lock, taken without waiting:
// when another process holds it, nothing is created and the report says Busy. A table
// left created but not attached by an interrupted step is attached. A transaction
// PostgreSQL cancelled in a deadlock (40P01) with a removal's DETACH … FINALIZE
// (finalizeDeadlock: the ATTACH waits for the key table's lock, which the FINALIZE
// holds while it waits for the ATTACH's snapshot) is tried again, up to removalTries
// times. It returns ErrNotPartitioned when the key table is not partitioned.
func (s *Store) EnsurePartitions(ctx context.Context, db PartitionDB, ahead time.Duration) (PartitionReport, error) {
	return tryAgainOn(func() (PartitionReport, error) { return s.ensurePartitionsOnce(ctx, db, ahead) }, "40P01")
}

// tryAgainOn calls f until it returns no error of SQLSTATE codes, at most removalTries
// times, and returns its last answer.
func tryAgainOn[T any](f func() (T, error), codes ...string) (T, error) {
	for try := 1; ; try++ {
		v, err := f()
		if try == removalTries || !isPgCode(err, codes...) {
			return v, err
		}
	}
}

// ensurePartitionsOnce is one try of EnsurePartitions. When it fails its report's
// Ahead counts the partitions that were there before (its transaction rolled back
// what it created), so that Low still warns when creation keeps failing.
func (s *Store) ensurePartitionsOnce(ctx context.Context, db PartitionDB, ahead time.Duration) (PartitionReport, error) {
	var r, done PartitionReport // done: as the transaction leaves it, once committed
	local := time.Now()
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlPartitionLockTimeout); err != nil {
			return err
		}
		var locked bool
		if err := queryRow(ctx, tx, []any{&locked}, sqlPartitionLock, s.tableName(), partitionLockSalt); err != nil {
			return err
		}
		l, err := s.layout(ctx, tx)
		switch {
		case err != nil:
			return err
		case !l.partitioned:
			return ErrNotPartitioned
		}
		w, err := l.width()
		if err != nil {
			return err
		}
		r.Ahead, r.Want = l.ahead(), int(defaultAhead(w)/w)
		if !locked {
			r.Busy = true
			done = r
			return nil
		}
		done = r
		if done.Created, err = createAhead(ctx, tx, l, w, ahead); err != nil {
			return err
		}
		done.Ahead = l.ahead()
		s.learnAddress(ctx, tx, l, local)
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("ensure partitions: %w", Classify(err))
	}
	return done, nil
}

// createAhead creates and attaches, in tx, the partitions of width w missing from the
// one holding l.now to the one holding l.now+ahead, and adds them to l. It returns
// how many.
func createAhead(ctx context.Context, tx pgx.Tx, l *partitionLayout, w, ahead time.Duration) (int, error) {
	if ahead <= 0 {
		ahead = defaultAhead(w)
	}
	orphan := map[string]bool{}
	for _, o := range l.orphans {
		orphan[o] = true
	}
	n := 0
	for from := l.now.UTC().Truncate(w); !from.After(l.now.Add(ahead)); from = from.Add(w) {
		if l.overlaps(from, w) {
			continue
		}
		name := partitionName(from, w)
		if !orphan[name] {
			_, err := tx.Exec(ctx, sqlCreatePartition(l.ident(name), l.ident(keyTable)))
			if err != nil {
				return n, fmt.Errorf("create partition %s: %w", name, err)
			}
		}
		if err := attach(ctx, tx, l, name, from, from.Add(w)); err != nil {
			return n, err
		}
		to := from.Add(w)
		l.parts = append(l.parts, Partition{Name: name, From: &from, To: &to})
		n++
	}
	return n, nil
}

// attach attaches the table name as the partition [from, to) of l's key table.
func attach(ctx context.Context, db DBTX, l *partitionLayout, name string, from, to time.Time) error {
	_, err := db.Exec(ctx, sqlAttach(l.ident(keyTable), l.ident(name), from, to))
	if err != nil {
		return fmt.Errorf("attach partition %s: %w", name, err)
	}
	return nil
}

// RemovePartitions removes the partitions whose every row was created more than
// retention ago (by the database clock) and that hold no unfinished and no
// dead-lettered key: it detaches each with DETACH PARTITION CONCURRENTLY (finishing a
// detach left pending by an interrupted step), checks the detached table once more,
// and drops it. No live statement waits on either (docs/PARTITIONS.md). A partition
// that still holds such a key is kept and counted in the report's Kept; its finished
// keys are left to the batched expiry. A detached table found to hold such a key after
// all is attached back, never dropped, and the error is ErrLiveKeysInDetached. It
// returns ErrNotPartitioned when the key table is not partitioned, and an error for
// a retention that is not positive.
func (s *Store) RemovePartitions(ctx context.Context, db PartitionDB, retention time.Duration) (PartitionReport, error) {
	return s.removePartitions(ctx, db, retention, nil)
}

// removePartitions is RemovePartitions that, when at is not nil, removes nothing
// unless at says yes to the database clock as it reads the layout (a sweeper's
// removal window: MaintainPartitions). It answers Ahead either way.
func (s *Store) removePartitions(ctx context.Context, db PartitionDB, retention time.Duration, at func(time.Time) bool) (r PartitionReport, err error) {
	if retention <= 0 {
		return r, fmt.Errorf("remove partitions: retention %s is not positive", retention)
	}
	start := time.Now()
	defer func() { r.Removal = time.Since(start) }()
	l, err := s.layout(ctx, db)
	switch {
	case err != nil:
		return r, fmt.Errorf("remove partitions: %w", err)
	case !l.partitioned:
		return r, fmt.Errorf("remove partitions: %w", ErrNotPartitioned)
	}
	w, err := l.width()
	if err != nil {
		return r, fmt.Errorf("remove partitions: %w", err)
	}
	r.Ahead = l.ahead()
	if at != nil && !at(l.now) {
		return r, nil
	}
	citus, _, err := s.scanLayout(ctx, db)
	if err != nil {
		return r, fmt.Errorf("remove partitions: %w", err)
	}
	horizon := l.now.Add(-retention)
	var errs []error
	for _, p := range l.parts {
		if p.To == nil || p.To.After(horizon) {
			continue
		}
		out, err := removePartition(ctx, db, l, p, citus, &r, s.remove)
		switch {
		case err != nil:
			errs = append(errs, err)
		case out == partitionRemoved:
			r.Removed++
		case out == partitionKept:
			r.Kept++
		case out == partitionBusy:
			r.Contended++
		}
	}
	// Tables of the layout detached (or created) and not dropped by an interrupted
	// step: dropped when past retention, after the same check.
	for _, name := range l.orphans {
		from, ok := partitionStart(name)
		if !ok || from.Add(w).After(horizon) {
			continue
		}
		to := from.Add(w)
		dropped, err := dropDetached(ctx, db, l, Partition{Name: name, From: &from, To: &to}, &r, s.remove)
		switch {
		case err != nil:
			errs = append(errs, err)
		case dropped:
			r.Removed++
		default: // dropped by another process meanwhile
			r.Contended++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("remove partitions: %w", err)
	}
	return r, nil
}

// What removePartition did with a partition.
const (
	partitionKept    = iota // it holds a live key
	partitionRemoved        // detached and dropped
	partitionBusy           // another process is removing it (Contended)
)

// removePartition removes the attached partition p if it holds no live key. On Citus
// (citus) the detach is the plain one (detachBounded), whose stall it adds to r.
func removePartition(ctx context.Context, db PartitionDB, l *partitionLayout, p Partition, citus bool, r *PartitionReport, o removalOptions) (int, error) {
	if !p.DetachPending {
		o.at("check")
		live, err := holdsLiveKeys(ctx, db, l, p.Name)
		// 42P01: dropped by another process since the listing. 40P01: cancelled in a
		// deadlock with another removal's DETACH … FINALIZE of it (finalizeDeadlock),
		// which goes on and removes it.
		if isPgCode(err, "42P01", "40P01") {
			return partitionBusy, nil
		}
		if err != nil || live {
			return partitionKept, err
		}
	}
	how := "CONCURRENTLY"
	if p.DetachPending {
		how = "FINALIZE"
	}
	var err error
	o.at("detach")
	if citus && !p.DetachPending {
		var stall time.Duration
		stall, err = detachBounded(ctx, db, l, p)
		r.Stall = max(r.Stall, stall)
	} else {
		_, err = db.Exec(ctx, sqlDetach(l.ident(keyTable), l.ident(p.Name), how))
	}
	switch {
	// 42P01: not a partition any more, 55000: a detach already pending (another
	// process removes it); the next step sees how it ended. 40P01: this detach was
	// cancelled in a deadlock with another removal's FINALIZE (finalizeDeadlock),
	// which goes on: the same case.
	case isPgCode(err, "42P01", "55000", "40P01"):
		return partitionBusy, nil
	case err != nil:
		return partitionKept, fmt.Errorf("detach partition %s: %w", p.Name, Classify(err))
	}
	switch dropped, err := dropDetached(ctx, db, l, p, r, o); {
	case err != nil:
		return partitionKept, err
	case !dropped: // dropped by another process once detached (an orphan to it)
		return partitionBusy, nil
	}
	return partitionRemoved, nil
}

// On Citus 12.1 there is no DETACH … CONCURRENTLY: the plain detach takes ACCESS
// EXCLUSIVE on the key table, and every statement on it queues behind the detach while
// it waits for that lock and while it runs. The wait is bounded by a short lock
// timeout, and a detach that timed out is retried after a pause (live traffic runs in
// between), a few times, then left for the next pass.
const (
	citusDetachTimeout = 200 * time.Millisecond
	citusDetachTries   = 5
)

// detachBounded detaches p with the plain DETACH PARTITION in a transaction whose
// lock_timeout is citusDetachTimeout, retried up to citusDetachTries times on a lock
// timeout (55P03). It returns the longest of its transactions: how long a live
// statement on the key table may have waited behind it. After the last timeout the
// error names the backends that still hold a lock on the key table (lockHolders).
func detachBounded(ctx context.Context, db PartitionDB, l *partitionLayout, p Partition) (time.Duration, error) {
	var stall time.Duration
	pause := citusDetachTimeout
	for try := 1; ; try++ {
		start := time.Now()
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			// Citus sends the transaction's SET LOCAL commands to the workers with the
			// detach when asked to, so that the timeout bounds the shards' locks too.
			if _, err := tx.Exec(ctx, sqlCitusPropagateLocal); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, sqlLockTimeoutMs(citusDetachTimeout)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlDetach(l.ident(keyTable), l.ident(p.Name), ""))
			return err
		})
		stall = max(stall, time.Since(start))
		if isPgCode(err, "55P03") && try == citusDetachTries {
			return stall, lockHolders(ctx, db, l, err)
		}
		if err == nil || !isPgCode(err, "55P03") {
			return stall, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return stall, ctx.Err()
		case <-t.C:
		}
		pause *= 2
	}
}

// sqlLockHolders lists, on the server it runs on, the other backends holding a lock on
// the table $1, longest in their transaction first: pid, lock mode, backend type,
// application name, state and seconds in the transaction. Never their query text,
// which may hold an application's data.
const sqlLockHolders = `SELECT a.pid, l.mode, coalesce(a.backend_type, ''), coalesce(a.application_name, ''),
	coalesce(a.state, ''), coalesce(extract(epoch FROM statement_timestamp() - a.xact_start)::float8, 0)
FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = to_regclass($1) AND l.granted AND l.pid <> pg_backend_pid()
ORDER BY a.xact_start NULLS LAST, a.pid
LIMIT 5`

// lockHolders returns err (a detach's lock timeout) with the backends that hold a lock
// on l's key table named after it, for an operator to look up (on Citus the usual one
// is DDL elsewhere in the key table's colocation group: docs/PARTITIONS.md, "Citus
// 12.1"); err as it is when none is seen or the query fails.
func lockHolders(ctx context.Context, db PartitionDB, l *partitionLayout, err error) error {
	rows, qerr := db.Query(ctx, sqlLockHolders, l.ident(keyTable))
	if qerr != nil {
		return err
	}
	var held []string
	for rows.Next() {
		var pid int
		var mode, backend, app, state string
		var secs float64
		if rows.Scan(&pid, &mode, &backend, &app, &state, &secs) != nil {
			break
		}
		held = append(held, fmt.Sprintf("pid %d (%s, %s, application %q, %s, %.1f s in its transaction)", pid, mode, backend, app, state, secs))
	}
	rows.Close()
	if len(held) == 0 {
		return err
	}
	return fmt.Errorf("%w; the key table is held by %s", err, strings.Join(held, ", "))
}

// dropDetached drops the detached partition p after checking that it holds no
// unfinished or dead-lettered key; if it does, p is attached back. The whole check
// (which reads the table only when a newer release widened the status check) runs before the ACCESS
// EXCLUSIVE lock, and only the index probes again under it: a live statement whose
// cached generic plan still names the partition locks it as the statement starts (and
// then replans), so it waits while the lock is held, which must be as short as the
// DROP itself; how long it was held (to the commit) goes to r.DropLock when longer.
// Between the two, once the probes under the lock found no such key, the indexes the
// probes do not use are dropped one a transaction (shedIndexes), so that the files
// removed at each commit are a part of the table's (docs/PARTITIONS.md). A
// table already dropped (by another process) is not an error; the result says whether
// this call dropped it. On Citus two removals racing over one table can fail each
// other with a distributed error (XX000) while the table is still there, the other
// not yet committed: such a try is made again, up to removalTries times, its lock
// waiting for the other's end. So is a try that PostgreSQL cancelled in a deadlock
// (40P01) with another removal's DETACH … FINALIZE of the table (finalizeDeadlock):
// once that try is cancelled, the FINALIZE finds the table no longer a partition and
// gives up.
//
// finalizeDeadlock: a DETACH … FINALIZE holds the key table's SHARE UPDATE EXCLUSIVE
// lock and the partition's ACCESS EXCLUSIVE lock while it waits for every backend
// whose snapshot's horizon (xmin) is not newer than its own snapshot's. Another
// removal's statement under such a snapshot (begun before it, or after it while no
// transaction ended) that waits for one of those locks closes a cycle: its detach or
// FINALIZE of the same pending partition, its check, its recheck or index drop of a
// table it detached itself. PostgreSQL cancels one side (docs/PARTITIONS.md, removal
// step 8).
func dropDetached(ctx context.Context, db PartitionDB, l *partitionLayout, p Partition, r *PartitionReport, o removalOptions) (bool, error) {
	return tryAgainOn(func() (bool, error) { return dropDetachedOnce(ctx, db, l, p, r, o) }, "XX000", "40P01")
}

// removalTries is how many times dropDetached tries a table that a distributed error
// or a deadlock left in place, and EnsurePartitions a creation cancelled in a deadlock.
const removalTries = 3

// dropDetachedOnce is one try of dropDetached.
func dropDetachedOnce(ctx context.Context, db PartitionDB, l *partitionLayout, p Partition, r *PartitionReport, o removalOptions) (bool, error) {
	back := false
	o.at("recheck")
	live, err := holdsLiveKeys(ctx, db, l, p.Name)
	if !live && err == nil && o.paced {
		o.at("verify")
		if live, err = lockedProbe(ctx, db, l, p.Name, r); err == nil && !live {
			err = shedIndexes(ctx, db, l, p.Name, r, o)
		}
	}
	if isPgCode(err, "42P01") || err != nil && droppedMeanwhile(ctx, db, l, p.Name) { // dropped by another process
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("drop partition %s: %w", p.Name, Classify(err))
	}
	o.at("drop")
	var locked time.Time
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlPartitionLockTimeout); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlLockExclusive(l.ident(p.Name))); err != nil {
			return err
		}
		locked = time.Now()
		if !live {
			var err error
			live, err = holdsLiveKeysProbe(ctx, tx, l, p.Name)
			if err != nil {
				return err
			}
		}
		switch {
		case !live:
			_, err := tx.Exec(ctx, sqlDropTable(l.ident(p.Name)))
			return err
		case p.From == nil || p.To == nil:
			return fmt.Errorf("%w: %s, left detached (no bounds to attach it back by)", ErrLiveKeysInDetached, p.Name)
		}
		back = true
		return attach(ctx, tx, l, p.Name, *p.From, *p.To)
	})
	if !locked.IsZero() {
		r.DropLock = max(r.DropLock, time.Since(locked))
	}
	switch {
	case isPgCode(err, "42P01"), err != nil && droppedMeanwhile(ctx, db, l, p.Name): // dropped by another process
		return false, nil
	case err != nil:
		return false, fmt.Errorf("drop partition %s: %w", p.Name, Classify(err))
	case back:
		return false, fmt.Errorf("%w: %s, attached back", ErrLiveKeysInDetached, p.Name)
	}
	return true, nil
}

// droppedMeanwhile reports whether the table name is gone, after an error in its
// removal: another process removed it. PostgreSQL says so (42P01); Citus 12.1, when
// the other process's drop reached the shards first, can report a failure of its own
// ("failure on connection marked as essential", XX000), which this tells apart from a
// real one by asking again. A look-up that fails says nothing: the error stands.
func droppedMeanwhile(ctx context.Context, db PartitionDB, l *partitionLayout, name string) bool {
	var gone bool
	err := queryRow(ctx, db, []any{&gone}, sqlRelationGone, l.ident(name))
	return err == nil && gone
}

// removalOptions are the bench's and the tests' knobs on RemovePartitions; the zero
// value is the library's removal, one drop of a detached table with all its indexes.
type removalOptions struct {
	// paced sheds a detached table's indexes one a transaction, resting between them,
	// before the drop (shedIndexes). An experiment the bench compares with the one
	// drop: no gain in live p99 where the file system discards freed blocks online,
	// some where it does not (docs/PARTITIONS.md, removal step 6), so it is not the
	// library's removal yet. A CI run met a deadlock between two concurrent removals
	// in it (its log is gone); the deadlocks such removals can meet are with a DETACH …
	// FINALIZE (removePartition, dropDetached), and the one drop meets them as well
	// (partition_finalize_test.go): the index drops are only more statements that can.
	paced bool
	// trace, when not nil, is called with each phase's name as the phase starts.
	trace func(phase string)
}

// at reports the start of phase to the trace.
func (o removalOptions) at(phase string) {
	if o.trace != nil {
		o.trace(phase)
	}
}

// SetRemovalOptions sets, before s is used, how its RemovePartitions removes a
// detached table: paced sheds its indexes one a transaction before the drop (the
// experiment the bench compares with the library's one drop), and trace, when not
// nil, is called with the name of each phase of a removal as it starts: "check",
// "detach", "recheck", "verify", "shed" (an index dropped), "rest", "drop".
func (s *Store) SetRemovalOptions(paced bool, trace func(phase string)) {
	s.remove = removalOptions{paced: paced, trace: trace}
}

// removalRestMax bounds the rest after each of shedIndexes' steps, which is as long
// as the step took: the removal leaves the machine to the live traffic at least half
// of the time, and its steps no longer than a few hundred milliseconds.
const removalRestMax = 250 * time.Millisecond

// lockedProbe takes the ACCESS EXCLUSIVE lock of the detached table name and runs
// holdsLiveKeysProbe under it, in a transaction of its own. After it found no key,
// nothing writes the table any more: a live statement whose cached plan named it
// waited for the lock and replans without it (docs/PARTITIONS.md).
func lockedProbe(ctx context.Context, db PartitionDB, l *partitionLayout, name string, r *PartitionReport) (bool, error) {
	var live bool
	var locked time.Time
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlPartitionLockTimeout); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlLockExclusive(l.ident(name))); err != nil {
			return err
		}
		locked = time.Now()
		var err error
		live, err = holdsLiveKeysProbe(ctx, tx, l, name)
		return err
	})
	if !locked.IsZero() {
		r.DropLock = max(r.DropLock, time.Since(locked))
	}
	return live, err
}

// shedIndexes drops the indexes of the detached table name that holdsLiveKeysProbe
// does not use (all but those whose predicate is the unfinished or the dead-lettered
// status), largest first, each in a transaction of its own, and rests after each as
// long as it took (at most removalRestMax). An index or constraint already dropped
// (by another process) is skipped. Interrupted, it leaves the table detached with
// its rows and the probes' indexes: the next removal checks it as any other.
func shedIndexes(ctx context.Context, db PartitionDB, l *partitionLayout, name string, r *PartitionReport, o removalOptions) error {
	rows, err := db.Query(ctx, sqlSheddable, l.ident(name))
	if err != nil {
		return err
	}
	type index struct{ name, constraint string }
	indexes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (index, error) {
		var x index
		return x, row.Scan(&x.name, &x.constraint)
	})
	if err != nil {
		return err
	}
	for _, x := range indexes {
		sql := sqlShed(l.ident(name), l.ident(x.name), x.constraint)
		o.at("shed")
		start := time.Now()
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlPartitionLockTimeout); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
		took := time.Since(start)
		r.DropLock = max(r.DropLock, took)
		switch {
		case isPgCode(err, "42704"): // dropped by another process
			continue
		case err != nil:
			return err
		}
		o.at("rest")
		t := time.NewTimer(min(took, removalRestMax))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// holdsLiveKeysProbe is holdsLiveKeys' index probes alone: an unfinished or a
// dead-lettered key.
func holdsLiveKeysProbe(ctx context.Context, db DBTX, l *partitionLayout, name string) (bool, error) {
	var live bool
	err := queryRow(ctx, db, []any{&live}, sqlLiveProbe(l.ident(name)))
	if err != nil {
		return false, fmt.Errorf("check partition %s: %w", name, Classify(err))
	}
	return live, nil
}

// holdsLiveKeys reports whether the table name (a partition, attached or not) holds a
// key that is not finished: unfinished, dead-lettered, or in a status a newer release
// wrote. The first two are index probes. The last is asked with constraint exclusion
// on, so that the planner refutes it from the table's validated status check
// (idemflow_keys_status: in_progress, finished, dead) without reading a row; only a
// table whose check a newer release widened (or dropped) is read in full. Reading
// every row of a partition past retention (gigabytes for a busy day) cost the live
// traffic its share of the machine's I/O and CPU for as long as the read ran
// (docs/PARTITIONS.md, "Removing, never losing").
func holdsLiveKeys(ctx context.Context, db PartitionDB, l *partitionLayout, name string) (bool, error) {
	var live bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlConstraintExclusion); err != nil {
			return err
		}
		return queryRow(ctx, tx, []any{&live}, sqlLive(l.ident(name)))
	})
	if err != nil {
		return false, fmt.Errorf("check partition %s: %w", name, Classify(err))
	}
	return live, nil
}

// KnownUnpartitioned reports whether s has learnt that its key table is not
// partitioned (MaintainPartitions returned ErrNotPartitioned, or a sweep found it so),
// so that a caller can skip even acquiring a connection for MaintainPartitions.
func (s *Store) KnownUnpartitioned() bool { return s.learnt.partitioned.Load() == 1 }

// MaintainPartitions is one maintenance step of a partitioned key table, as the
// sweepers run it every pass: EnsurePartitions with the default ahead, then
// RemovePartitions with retention (skipped when retention is not positive), only when
// at, if not nil, says yes to the database clock (a sweeper's removal window). The
// removal runs when the creation failed too, and the error joins both: the two are
// independent, and a creation that keeps failing (a table of another shape named as a
// partition to come, a refused CREATE) must not stop retention as well. On a key
// table that is not partitioned it returns ErrNotPartitioned, and after the first time
// it does so without asking the database again (a table is moved to the layout with
// the sweepers stopped: docs/PARTITIONS.md).
func (s *Store) MaintainPartitions(ctx context.Context, db PartitionDB, retention time.Duration, at func(time.Time) bool) (PartitionReport, error) {
	if s.learnt.partitioned.Load() == 1 {
		return PartitionReport{}, ErrNotPartitioned
	}
	r, err := s.EnsurePartitions(ctx, db, 0)
	if errors.Is(err, ErrNotPartitioned) {
		s.learnt.partitioned.Store(1)
		return r, ErrNotPartitioned
	}
	if err == nil {
		s.learnt.partitioned.Store(2)
	}
	if retention <= 0 {
		return r, err
	}
	rr, rerr := s.removePartitions(ctx, db, retention, at)
	if errors.Is(rerr, ErrNotPartitioned) {
		s.learnt.partitioned.Store(1)
		return r, ErrNotPartitioned
	}
	r.Removed, r.Kept, r.Contended, r.Stall, r.Removal, r.DropLock = rr.Removed, rr.Kept, rr.Contended, rr.Stall, rr.Removal, rr.DropLock
	return r, errors.Join(err, rerr)
}

// CheckPartitions reads the key table's layout without changing anything: on a
// partitioned key table it reports how many partitions exist ahead of now and how
// many the default ahead calls for (Ahead, Want; Low says when a warning is due), and
// s learns the layout, so that its look-up prunes partitions from then on
// (sqlLookupPartitioned). On a plain key table it returns ErrNotPartitioned, and s
// keeps its statements. An engine calls it once as it starts.
func (s *Store) CheckPartitions(ctx context.Context, db DBTX) (PartitionReport, error) {
	var r PartitionReport
	local := time.Now()
	l, err := s.layout(ctx, db)
	switch {
	case err != nil:
		return r, fmt.Errorf("check partitions: %w", err)
	case !l.partitioned:
		s.learnt.partitioned.Store(1)
		return r, fmt.Errorf("check partitions: %w", ErrNotPartitioned)
	}
	s.learnt.partitioned.Store(2)
	s.learnAddress(ctx, db, l, local)
	r.Ahead = l.ahead()
	if w, err := l.width(); err == nil {
		r.Want = int(defaultAhead(w) / w)
	}
	return r, nil
}
