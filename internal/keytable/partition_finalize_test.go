package keytable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The deadlocks of a DETACH … FINALIZE with a concurrent removal. A FINALIZE takes the
// key table's SHARE UPDATE EXCLUSIVE lock and the partition's ACCESS EXCLUSIVE lock,
// then waits for every backend whose snapshot's horizon (xmin) is not newer than its
// own snapshot's (WaitForOlderSnapshots): one that began before it, and one that began
// after it as long as no transaction ended in between. A statement of another removal
// under such a snapshot that waits for one of those locks closes a cycle, which
// PostgreSQL ends by cancelling one of the two after deadlock_timeout. The tests line
// the two up with the removals' trace and a reader that holds the FINALIZE back, the
// key table's lock taken, until the other statement has queued; pinHorizon keeps the
// horizons equal however many transactions end meanwhile (without it, a write load
// on the same server broke the cycle and failed the tests). They are not parallel:
// under the pinned horizon the FINALIZE would wait for every statement in the
// database, other tests' included.

// heldRemoval is a RemovePartitions on a pool of its own, named app, held at the
// first start of phase until the test frees it.
type heldRemoval struct {
	app     string
	at      chan struct{}
	release chan struct{}
	once    sync.Once
	done    chan heldOut
}

type heldOut struct {
	r   keytable.PartitionReport
	err error
}

// free lets x go on past the phase it is held at.
func (x *heldRemoval) free() { x.once.Do(func() { close(x.release) }) }

// startHeld starts a removal of db's partitions past 10 minutes, paced or not, to be
// held at phase. When the test ends (a failed requirement included) the removal is
// freed and cancelled, and its pool closed once it has returned: a removal left
// waiting for a lock would otherwise hold its connection, and the pool's Close, for
// ever.
func startHeld(t *testing.T, db *pgtest.DB, name string, paced bool, phase string) *heldRemoval {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	x := &heldRemoval{app: name + "_" + db.Schema, at: make(chan struct{}), release: make(chan struct{}), done: make(chan heldOut, 1)}
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = x.app
	// PostgreSQL looks for the cycle deadlock_timeout after a backend began to wait
	// (1 s by default), and untilWaits must see it formed before then: 3 s leaves a
	// loaded machine's polls room.
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "3s"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	returned := make(chan struct{})
	t.Cleanup(func() {
		x.free()
		cancel()
		<-returned
		pool.Close()
	})
	st, held := keytable.New(), false
	st.SetRemovalOptions(paced, func(p string) {
		if p == phase && !held {
			held = true
			select {
			case x.at <- struct{}{}:
				<-x.release
			case <-ctx.Done():
			}
		}
	})
	go func() {
		defer close(returned)
		r, err := st.RemovePartitions(ctx, pool, 10*time.Minute)
		x.done <- heldOut{r, err}
	}()
	return x
}

// pinHorizon holds a transaction with a transaction id open until the test ends, so
// that every snapshot taken meanwhile has the same horizon (its xmin is that id)
// whatever other transactions end: the FINALIZE then waits for the other removal's
// statement however busy the server is. Idle in its transaction it has no snapshot,
// so nothing waits for it.
func pinHorizon(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
}

// arrive waits until x is held at its phase. It fails the test if x returns first.
func arrive(t *testing.T, x *heldRemoval) {
	t.Helper()
	select {
	case <-x.at:
	case out := <-x.done:
		t.Fatalf("%s returned before the phase it is held at: %+v", x.app, out)
	}
}

// untilWaits polls until the backend of x waits, running a statement LIKE one of
// patterns, for a lock of locktype held (when holder is not nil) by holder's backend.
// It fails the test if one of removals returns first.
func untilWaits(t *testing.T, db *pgtest.DB, x *heldRemoval, patterns []string, locktype string, holder *heldRemoval, removals ...*heldRemoval) {
	t.Helper()
	holderApp := ""
	if holder != nil {
		holderApp = holder.app
	}
	for {
		var waits bool
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1
FROM pg_catalog.pg_locks w JOIN pg_catalog.pg_stat_activity wa ON wa.pid = w.pid
WHERE wa.application_name = $1 AND wa.query LIKE ANY($2) AND NOT w.granted AND w.locktype = $3
	AND ($4 = '' OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks h JOIN pg_catalog.pg_stat_activity ha ON ha.pid = h.pid
		WHERE h.granted AND h.locktype = 'virtualxid' AND h.virtualxid = w.virtualxid AND ha.application_name = $4)))`,
			x.app, patterns, locktype, holderApp).Scan(&waits))
		if waits {
			return
		}
		for _, r := range removals {
			require.Empty(t, r.done, "%s returned before %s waited for a %s lock", r.app, x.app, locktype)
		}
	}
}

// addFinished adds the minute partition beginning at from, holding one finished key.
func addFinished(t *testing.T, db *pgtest.DB, from time.Time) string {
	t.Helper()
	name := addPartition(t, db, from)
	at := `'` + from.Add(time.Second).Format(time.RFC3339) + `'`
	insertRaw(t, db, "old", "00000000-0000-4000-8000-000000000002", "f", at, finishedSet+`, finished_at = `+at)
	return name
}

// readPartition begins a transaction that holds a lock on the table name, rolled back
// when the test ends.
func readPartition(t *testing.T, db *pgtest.DB, name string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT count(*) FROM `+name)
	require.NoError(t, err)
	return tx
}

// requireRemovedOnce requires that neither removal failed and that the table name was
// removed once and is gone. PostgreSQL cancels either side of the cycle; when both
// removals counted the partition busy (the FINALIZE cancelled, and the other one's
// detach then found the detach pending), the next removal, run here, removes it.
func requireRemovedOnce(t *testing.T, db *pgtest.DB, name string, a, b *heldRemoval) {
	t.Helper()
	ra, rb := <-a.done, <-b.done
	require.NoError(t, ra.err, a.app)
	require.NoError(t, rb.err, b.app)
	removed := ra.r.Removed + rb.r.Removed
	if removed == 0 {
		r, err := keytable.New().RemovePartitions(context.Background(), db.Pool, 10*time.Minute)
		require.NoError(t, err, "the next removal")
		removed = r.Removed
	}
	require.Equal(t, 1, removed, "removed once: %+v %+v", ra.r, rb.r)
	for _, r := range []keytable.PartitionReport{ra.r, rb.r} {
		require.Equal(t, 1, r.Removed+r.Contended, "each removal removed the partition or left it to the other: %+v %+v", ra.r, rb.r)
		require.Zero(t, r.Kept)
	}
	var gone bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NULL`, name).Scan(&gone))
	require.True(t, gone, "dropped")
}

// leavePending leaves the detach of db's partition past retention pending: a removal
// terminated in its detach's second phase, where a reader of the key table holds it.
func leavePending(t *testing.T, db *pgtest.DB) {
	t.Helper()
	holder := readPartition(t, db, "idemflow_keys")
	err := killRemoval(t, db, keytable.New(), "idemflow_pending", "%DETACH PARTITION%CONCURRENTLY")
	require.ErrorIs(t, err, keytable.ErrUnavailable, "the removal's backend was terminated")
	require.NoError(t, holder.Rollback(context.Background()))
}

var finalizing = []string{"%DETACH PARTITION%FINALIZE"}

// closeCycle makes the cycle, a and b both held: b's FINALIZE of the table old waits
// for its lock behind a reader, a's statement (LIKE one of patterns) then queues for a
// lock b's FINALIZE holds, and once the reader ends the FINALIZE waits for a's snapshot
// (seen in pg_locks). It requires that the table is then removed once, neither failing.
func closeCycle(t *testing.T, db *pgtest.DB, old string, a, b *heldRemoval, patterns []string) {
	t.Helper()
	reader := readPartition(t, db, old)
	b.free()
	untilWaits(t, db, b, finalizing, "relation", nil, a, b)
	a.free()
	untilWaits(t, db, a, patterns, "relation", nil, a, b)
	require.NoError(t, reader.Rollback(context.Background()))
	untilWaits(t, db, b, finalizing, "virtualxid", a, a, b)
	requireRemovedOnce(t, db, old, a, b)
}

// TestRemovePartitionsConcurrentFinalize: two removals find the same detach left
// pending by an interrupted removal and both finalize it; the second FINALIZE queues
// for the key table's lock, which the first holds while it waits for the second's
// snapshot. PostgreSQL cancels one of the two; that one counts the partition as
// busy, the other removes it, and neither fails. The cycle is the detach's, the same
// with the paced removal and without.
func TestRemovePartitionsConcurrentFinalize(t *testing.T) {
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: 12.1 has no DETACH … CONCURRENTLY, so no detach is ever left pending there")
	}
	for _, paced := range []bool{false, true} {
		t.Run(fmt.Sprintf("paced=%t", paced), func(t *testing.T) {
			ctx := context.Background()
			db := setupPartitioned(t)
			old := addFinished(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-41*time.Minute))
			pinHorizon(t, db)
			leavePending(t, db)
			parts, err := keytable.New().Partitions(ctx, db.Pool)
			require.NoError(t, err)
			require.True(t, parts[0].DetachPending)

			a, b := startHeld(t, db, "idemflow_a", paced, "detach"), startHeld(t, db, "idemflow_b", paced, "detach")
			arrive(t, a)
			arrive(t, b)
			closeCycle(t, db, old, a, b, finalizing) // a's FINALIZE waits for the key table's lock
		})
	}
}

// TestRemovePartitionsFinalizeAfterDetach: a removal's layout shows a partition whose
// detach another removal is running; that detach finishes, and the first removal
// finalizes it all the same: its FINALIZE takes the detached table's lock and waits
// for the snapshot of the other removal's next statement on the table, which waits
// for that lock: its check (either removal), or the paced removal's first index drop.
// PostgreSQL cancels one of the two: the FINALIZE then counts the table as busy, the
// other removal's step is tried again and removes it, and neither fails.
func TestRemovePartitionsFinalizeAfterDetach(t *testing.T) {
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: 12.1 has no DETACH … CONCURRENTLY, so no layout ever shows a detach pending there")
	}
	for _, c := range []struct {
		paced    bool
		phase    string   // where a is held once its detach is done
		patterns []string // a's statement there
	}{
		{false, "recheck", []string{"SELECT EXISTS%"}},
		{true, "shed", []string{"DROP INDEX%", "ALTER TABLE%DROP CONSTRAINT%"}},
	} {
		t.Run(fmt.Sprintf("paced=%t/%s", c.paced, c.phase), func(t *testing.T) {
			ctx := context.Background()
			db := setupPartitioned(t)
			old := addFinished(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-43*time.Minute))
			pinHorizon(t, db)
			// A transaction that has read the key table holds a's detach in its second
			// phase, the detach pending, while b reads the layout.
			holder := readPartition(t, db, "idemflow_keys")
			a := startHeld(t, db, "idemflow_a", c.paced, c.phase)
			untilWaits(t, db, a, []string{"%DETACH PARTITION%CONCURRENTLY"}, "virtualxid", nil, a)
			b := startHeld(t, db, "idemflow_b", c.paced, "detach")
			arrive(t, b)
			require.NoError(t, holder.Rollback(ctx))
			arrive(t, a)
			require.NotContains(t, partitionNames(t, db), old, "detached by a")

			closeCycle(t, db, old, a, b, c.patterns)
		})
	}
}

// TestRemovePartitionsCheckWhileFinalized: a removal's layout shows a partition
// attached; another process then leaves its detach pending, and a second removal
// finalizes it while the first one's check of it waits for the partition's lock under
// the same horizon. PostgreSQL cancels one of the two: the check (the first removal
// counts the partition as busy, the second removes it) or the FINALIZE (both count it
// busy, the next removal finishes it); neither fails.
func TestRemovePartitionsCheckWhileFinalized(t *testing.T) {
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: 12.1 has no DETACH … CONCURRENTLY, so no detach is ever left pending there")
	}
	db := setupPartitioned(t)
	old := addFinished(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-45*time.Minute))
	pinHorizon(t, db)
	a := startHeld(t, db, "idemflow_a", false, "check")
	arrive(t, a)
	leavePending(t, db)
	b := startHeld(t, db, "idemflow_b", false, "detach")
	arrive(t, b)

	closeCycle(t, db, old, a, b, []string{"SELECT EXISTS%"}) // a's check waits for the partition's lock
}

// TestRemovePartitionsDroppedByAnother: a removal detaches a partition, and before it
// drops the table another removal finds the table detached (a table of the layout
// attached to nothing) and drops it. The first one then finds the table gone: the
// partition is removed once and counted once, Removed by the one that dropped it and
// Contended by the other (before, both counted it Removed).
func TestRemovePartitionsDroppedByAnother(t *testing.T) {
	ctx := context.Background()
	db := setupPartitioned(t)
	old := addFinished(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-47*time.Minute))
	a := startHeld(t, db, "idemflow_a", false, "recheck")
	arrive(t, a)
	require.NotContains(t, partitionNames(t, db), old, "detached by a")

	r, err := keytable.New().RemovePartitions(ctx, db.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, keytable.PartitionReport{Removed: 1}, keytable.PartitionReport{Removed: r.Removed, Kept: r.Kept, Contended: r.Contended},
		"the other removal drops the detached table")
	a.free()
	out := <-a.done
	require.NoError(t, out.err)
	require.Equal(t, keytable.PartitionReport{Contended: 1}, keytable.PartitionReport{Removed: out.r.Removed, Kept: out.r.Kept, Contended: out.r.Contended},
		"the first one finds it gone")
	var gone bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, old).Scan(&gone))
	require.True(t, gone)
}

// TestEnsurePartitionsWhileFinalized: partitions are created ahead while a removal
// finalizes a detach left pending. The FINALIZE holds the key table's lock while it
// waits for older snapshots, one of them the creation's ATTACH, which waits for that
// lock. PostgreSQL cancels one of the two: the ATTACH (its creation is tried again, the
// FINALIZE then done) or the FINALIZE (the removal counts the partition busy, and the
// next removal finishes it); neither fails, and the partitions are created.
func TestEnsurePartitionsWhileFinalized(t *testing.T) {
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: 12.1 has no DETACH … CONCURRENTLY, so no detach is ever left pending there")
	}
	ctx := context.Background()
	db := setupPartitioned(t)
	old := addFinished(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-49*time.Minute))
	pinHorizon(t, db)
	leavePending(t, db)
	b := startHeld(t, db, "idemflow_b", false, "detach")
	arrive(t, b)

	reader := readPartition(t, db, old)
	b.free()
	untilWaits(t, db, b, finalizing, "relation", nil, b) // the FINALIZE holds the key table's lock
	ens := &heldRemoval{app: "idemflow_ensure_" + db.Schema}
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = ens.app
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "3s" // as the FINALIZE's: see startHeld
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ensured := make(chan heldOut, 1)
	go func() {
		r, err := keytable.New().EnsurePartitions(ctx, pool, 30*time.Minute)
		ensured <- heldOut{r, err}
	}()
	untilWaits(t, db, ens, []string{"%ATTACH PARTITION%"}, "relation", nil, b)
	require.NoError(t, reader.Rollback(ctx))
	untilWaits(t, db, b, finalizing, "virtualxid", ens, b) // the cycle

	out := <-ensured
	require.NoError(t, out.err, "creation ahead")
	require.Positive(t, out.r.Created)
	rb := <-b.done
	require.NoError(t, rb.err, "the removal")
	if rb.r.Removed == 0 {
		require.Equal(t, 1, rb.r.Contended, "%+v", rb.r)
		r, err := keytable.New().RemovePartitions(ctx, db.Pool, 10*time.Minute)
		require.NoError(t, err, "the next removal")
		require.Equal(t, 1, r.Removed)
	}
	require.NotContains(t, partitionNames(t, db), old)
}
