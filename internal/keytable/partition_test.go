package keytable_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// setupPartitioned returns a test schema whose key table is partitioned by the minute,
// with partitions three minutes ahead.
func setupPartitioned(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	require.NoError(t, keytable.New().SetupPartitioned(context.Background(), db.Pool, keytable.PartitionMinute, 3*time.Minute))
	return db
}

// dbNow is the database clock.
func dbNow(t *testing.T, db *pgtest.DB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT statement_timestamp()`).Scan(&now))
	return now
}

// addPartition creates and attaches the minute partition beginning at from, named as
// the Store names its own.
func addPartition(t *testing.T, db *pgtest.DB, from time.Time) string {
	t.Helper()
	name := "idemflow_keys_p" + from.UTC().Format("200601021504")
	// Two statements, not one string of two: a Citus coordinator refuses to attach a
	// table to a distributed one in the statement string that created it.
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+name+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(context.Background(), `ALTER TABLE idemflow_keys ATTACH PARTITION `+name+` FOR VALUES FROM ('`+
		from.UTC().Format(time.RFC3339)+`') TO ('`+from.Add(time.Minute).UTC().Format(time.RFC3339)+`')`)
	require.NoError(t, err)
	return name
}

func partitionNames(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	parts, err := keytable.New().Partitions(context.Background(), db.Pool)
	require.NoError(t, err)
	var names []string
	for _, p := range parts {
		names = append(names, p.Name)
	}
	return names
}

func TestSetupPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()

	var kind string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'idemflow_keys'::regclass`).Scan(&kind))
	require.Equal(t, "p", kind)
	var indexes []string
	rows, err := db.Pool.Query(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'idemflow_keys'::regclass ORDER BY 1`)
	require.NoError(t, err)
	indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"idemflow_keys_dead_idx", "idemflow_keys_due_idx", "idemflow_keys_finished_idx", "idemflow_keys_pkey"}, indexes)

	parts, err := st.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(parts), 4, "the current minute and three ahead")
	now := dbNow(t, db)
	require.False(t, parts[0].From.After(now), "the first partition holds now")
	for i, p := range parts {
		require.Equal(t, time.Minute, p.To.Sub(*p.From), p.Name)
		require.Equal(t, "idemflow_keys_p"+p.From.UTC().Format("200601021504"), p.Name)
		if i > 0 {
			require.Equal(t, *parts[i-1].To, *p.From, "contiguous")
		}
	}

	row := claimNow(t, db, claim("s", "k", "00000000-0000-4000-8000-000000000001"))
	require.Equal(t, "k", row.Key)

	require.NoError(t, st.SetupPartitioned(ctx, db.Pool, keytable.PartitionMinute, 3*time.Minute), "a second set-up changes nothing")
	requireOnlyDueAdded(t, db, parts, 3*time.Minute)
	require.Error(t, st.SetupPartitioned(ctx, db.Pool, 7*time.Minute, 0), "a width that does not divide a day")
}

// requireOnlyDueAdded checks that a second set-up dropped none of the partitions the
// first made and added only those the database clock has made due since: a minute
// boundary may pass between the two, and then the minute now+ahead is new.
func requireOnlyDueAdded(t *testing.T, db *pgtest.DB, before []keytable.Partition, ahead time.Duration) {
	t.Helper()
	after := partitionNames(t, db)
	require.GreaterOrEqual(t, len(after), len(before))
	for i, p := range before {
		require.Equal(t, p.Name, after[i], "a second set-up drops nothing")
	}
	end := dbNow(t, db).Truncate(time.Minute).Add(ahead)
	from := *before[len(before)-1].To
	for _, name := range after[len(before):] {
		require.Equal(t, "idemflow_keys_p"+from.UTC().Format("200601021504"), name, "contiguous")
		require.False(t, from.After(end), "%s: only partitions the clock has made due", name)
		from = from.Add(time.Minute)
	}
}

func TestSetupPartitionedRefusesRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	claimNow(t, db, claim("s", "k", "00000000-0000-4000-8000-000000000001"))
	err := keytable.New().SetupPartitioned(ctx, db.Pool, keytable.PartitionDay, 0)
	require.ErrorIs(t, err, keytable.ErrNotEmpty)
	var kind string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'idemflow_keys'::regclass`).Scan(&kind))
	require.Equal(t, "r", kind, "the table is left as it was")
	_, err = keytable.New().EnsurePartitions(ctx, db.Pool, 0)
	require.ErrorIs(t, err, keytable.ErrNotPartitioned)
}

func TestEnsurePartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()

	r, err := st.EnsurePartitions(ctx, db.Pool, 3*time.Minute)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Ahead, 3)
	before := partitionNames(t, db)

	r, err = st.EnsurePartitions(ctx, db.Pool, 6*time.Minute)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Created, 3, "three more minutes ahead")
	require.GreaterOrEqual(t, r.Ahead, 6)
	after := partitionNames(t, db)
	require.Equal(t, before, after[:len(before)])

	t.Run("Interrupted", func(t *testing.T) {
		// A step that created its table but did not attach it: the next attaches it.
		last := after[len(after)-1]
		_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+last)
		require.NoError(t, err)
		r, err := st.EnsurePartitions(ctx, db.Pool, 6*time.Minute)
		require.NoError(t, err)
		require.Equal(t, after, partitionNames(t, db)[:len(after)])
		require.GreaterOrEqual(t, r.Created, 1)
	})

	t.Run("Busy", func(t *testing.T) {
		// Another process holds the maintenance lock: nothing is created.
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		var locked bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1::bigint # 'idemflow_keys'::regclass::oid::bigint)`,
			keytable.PartitionLockSalt).Scan(&locked))
		require.True(t, locked)
		n := len(partitionNames(t, db))
		r, err := st.EnsurePartitions(ctx, db.Pool, time.Hour)
		require.NoError(t, err)
		require.True(t, r.Busy)
		require.Zero(t, r.Created)
		require.Len(t, partitionNames(t, db), n)
	})
}

// TestRemovePartitions: partitions past retention are removed only when they hold no
// unfinished and no dead-lettered key.
func TestRemovePartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()
	base := dbNow(t, db).UTC().Truncate(time.Minute).Add(-20 * time.Minute)
	at := func(m int) string {
		return `'` + base.Add(time.Duration(m)*time.Minute+time.Second).Format(time.RFC3339) + `'`
	}
	pFinished, pUnfinished := addPartition(t, db, base), addPartition(t, db, base.Add(time.Minute))
	pDead, pEmpty := addPartition(t, db, base.Add(2*time.Minute)), addPartition(t, db, base.Add(3*time.Minute))
	insertRaw(t, db, "finished", "00000000-0000-4000-8000-000000000001", "f", at(0), finishedSet+`, finished_at = `+at(0))
	insertRaw(t, db, "unfinished", "00000000-0000-4000-8000-000000000002", "f", at(1), releasedSet)
	insertRaw(t, db, "dead", "00000000-0000-4000-8000-000000000003", "f", at(2), `status = 'dead', locked_until = NULL`)
	claimNow(t, db, claim("s", "current", "00000000-0000-4000-8000-000000000004"))

	_, err := st.RemovePartitions(ctx, db.Pool, 0)
	require.Error(t, err, "no retention")
	r, err := st.RemovePartitions(ctx, db.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 2, r.Removed)
	require.Equal(t, 2, r.Kept)
	names := partitionNames(t, db)
	require.NotContains(t, names, pFinished)
	require.NotContains(t, names, pEmpty)
	require.Contains(t, names, pUnfinished)
	require.Contains(t, names, pDead)
	for _, key := range []string{"unfinished", "dead", "current"} {
		_, err := st.Lookup(ctx, db.Pool, "s", key)
		require.NoError(t, err, key)
	}
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN ($1, $2)`, pFinished, pEmpty).Scan(&tables))
	require.Zero(t, tables, "dropped, not only detached")

	t.Run("DetachedWithLiveKeys", func(t *testing.T) {
		// A table of the layout left detached, past retention, holding an unfinished
		// key (only a path that broke the rules could put it there): attached back,
		// not dropped.
		_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+pUnfinished)
		require.NoError(t, err)
		r, err := st.RemovePartitions(ctx, db.Pool, 10*time.Minute)
		require.ErrorIs(t, err, keytable.ErrLiveKeysInDetached)
		require.Zero(t, r.Removed)
		require.Contains(t, partitionNames(t, db), pUnfinished)
		_, err = st.Lookup(ctx, db.Pool, "s", "unfinished")
		require.NoError(t, err)
	})
}

// TestRemovePartitionsFinishesDetach: the backend of a removal is terminated while
// its concurrent detach waits for an older transaction, leaving the partition pending;
// the next removal finishes the detach and drops it, and the other keys are intact.
func TestRemovePartitionsFinishesDetach(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: 12.1 has no DETACH … CONCURRENTLY, so no detach is ever left pending there; TestDetachBounded covers its plain detach")
	}
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()
	old := addPartition(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-30*time.Minute))
	claimNow(t, db, claim("s", "live", "00000000-0000-4000-8000-000000000001"))

	// A transaction that has read the key table makes the detach wait in its second
	// phase, where the removal's backend is terminated.
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT count(*) FROM idemflow_keys`)
	require.NoError(t, err)
	err = killRemoval(t, db, st, "idemflow_remove", "%DETACH PARTITION%CONCURRENTLY")
	require.ErrorIs(t, err, keytable.ErrUnavailable, "the removal's backend was terminated")
	require.NoError(t, holder.Rollback(ctx))
	parts, err := st.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, old, parts[0].Name)
	require.True(t, parts[0].DetachPending)

	r, err := st.RemovePartitions(ctx, db.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, r.Removed)
	require.NotContains(t, partitionNames(t, db), old)
	_, err = st.Lookup(ctx, db.Pool, "s", "live")
	require.NoError(t, err)
}

// TestPartitionMissing: a claim whose creation time has no partition is refused as
// ErrUnavailable (retryable), writes nothing, and succeeds once the partition exists.
func TestPartitionMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	for _, name := range partitionNames(t, db) {
		_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+name)
		require.NoError(t, err)
	}
	c := claim("s", "k", "00000000-0000-4000-8000-000000000001")
	err := tryClaim(t, db, c)
	require.ErrorIs(t, err, keytable.ErrUnavailable)
	require.NotErrorIs(t, err, keytable.ErrInvalid)

	r, err := keytable.New().EnsurePartitions(ctx, db.Pool, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Created, 1, "the detached tables attached again")
	require.NoError(t, tryClaim(t, db, c))
}

// TestPartitionedRepeatableReadClaim: a claim at REPEATABLE READ whose snapshot was
// taken before another claim of the same key committed. On the default layout the
// primary key refuses its insert (ErrClaimExists); on the partitioned layout, with no
// unique index across partitions, its insert is refused outright (ErrRefused) instead
// of making a second row for the key. Either way the key keeps one row.
//
// The snapshot is taken by reading the key table ("KeyTable") or by a statement that
// reads no table ("Session"). On plain PostgreSQL both take the transaction's one
// snapshot. On Citus only the first reaches the key's shard: a worker's transaction,
// and its snapshot, begin with the first statement the coordinator routes to it, so
// after "Session" that is the claim's look-up, under the claim lock, which finds the
// other row (ErrClaimExists) as a claim at READ COMMITTED would.
func TestPartitionedRepeatableReadClaim(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"Default", "Partitioned"} {
		for _, snapshot := range []string{"KeyTable", "Session"} {
			t.Run(layout+"/"+snapshot, func(t *testing.T) {
				t.Parallel()
				partitioned, onShard := layout == "Partitioned", snapshot == "KeyTable" || !pgtest.CitusMode()
				err := repeatableReadClaimAfter(t, partitioned, snapshot == "KeyTable")
				if partitioned && onShard {
					require.ErrorIs(t, err, keytable.ErrRefused)
					require.ErrorContains(t, err, "READ COMMITTED only")
				} else {
					require.ErrorIs(t, err, keytable.ErrClaimExists)
				}
			})
		}
	}
}

// repeatableReadClaimAfter claims the key (s, k) at REPEATABLE READ in a transaction
// whose first statement (reading the key table if readKeys) ran before another claim
// of the key committed, then commits, and returns the claim's error, having checked
// that the key has one row.
func repeatableReadClaimAfter(t *testing.T, partitioned, readKeys bool) error {
	t.Helper()
	ctx := context.Background()
	var db *pgtest.DB
	if partitioned {
		db = setupPartitioned(t)
	} else {
		db = pgtest.New(t)
	}
	const count = `SELECT count(*) FROM idemflow_keys WHERE scope = 's' AND idempotency_key = 'k'`
	first := `SELECT 1`
	if readKeys {
		first = count
	}
	late, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer late.Rollback(ctx) //nolint:errcheck
	_, err = late.Exec(ctx, first)
	require.NoError(t, err)
	claimNow(t, db, claim("s", "k", "00000000-0000-4000-8000-000000000001"))
	var n int
	if readKeys {
		require.NoError(t, late.QueryRow(ctx, count).Scan(&n))
		require.Zero(t, n, "the snapshot predates the other claim")
	}

	b := &pgx.Batch{}
	c := claim("s", "k", "00000000-0000-4000-8000-000000000002")
	q := keytable.New().QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, RecoveryPoint: "started", Data: []byte(`{}`)})
	br := late.SendBatch(ctx, b)
	_, claimErr := q.Read(br)
	_ = br.Close()       // the error is claimErr's
	_ = late.Commit(ctx) // a claim that did not fail would commit a second row
	require.NoError(t, db.Pool.QueryRow(ctx, count).Scan(&n))
	require.Equal(t, 1, n, "one row for the key")
	return claimErr
}

// TestRemovePartitionsConcurrent: two removals race over the same partitions past
// retention: each partition is removed once, neither fails.
func TestRemovePartitionsConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	base := dbNow(t, db).UTC().Truncate(time.Minute).Add(-40 * time.Minute)
	for i := range 4 {
		addPartition(t, db, base.Add(time.Duration(i)*time.Minute))
	}
	_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION idemflow_keys_p`+base.Add(3*time.Minute).Format("200601021504"))
	require.NoError(t, err) // one left detached by an interrupted removal
	other := db.NewPool(t)
	type out struct {
		r   keytable.PartitionReport
		err error
	}
	res := make(chan out, 2)
	for _, pool := range []*pgxpool.Pool{db.Pool, other} {
		go func() {
			r, err := keytable.New().RemovePartitions(ctx, pool, 10*time.Minute)
			res <- out{r, err}
		}()
	}
	a, b := <-res, <-res
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	require.Equal(t, 4, a.r.Removed+b.r.Removed, "each removed once: %+v %+v", a.r, b.r)
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'idemflow\_keys\_p%' AND relname < $1`,
		"idemflow_keys_p"+base.Add(4*time.Minute).Format("200601021504")).Scan(&left))
	require.Zero(t, left)
}

// TestPartitionsThroughPgbouncer: set-up, creation ahead and removal (a concurrent
// detach is one statement outside a transaction) through pgbouncer in transaction
// mode, and a claim on the partitioned table.
func TestPartitionsThroughPgbouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := pgtest.NewPooled(t)
	st := keytable.New()
	require.NoError(t, st.SetupPartitioned(ctx, p.DB.Pool, keytable.PartitionMinute, 3*time.Minute))
	claimNow(t, p.DB, claim("s", "live", "00000000-0000-4000-8000-000000000001"))
	from := dbNow(t, p.Direct).UTC().Truncate(time.Minute).Add(-30 * time.Minute)
	old := addPartition(t, p.Direct, from)
	// Into the partition just made, by its own minute: the clock's may have turned.
	insertRaw(t, p.Direct, "old", "00000000-0000-4000-8000-000000000002", "f", `'`+from.Format(time.RFC3339)+`'`,
		finishedSet+`, finished_at = now() - interval '29 minutes'`)

	r, err := st.EnsurePartitions(ctx, p.DB.Pool, 5*time.Minute)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Ahead, 5)
	r, err = st.RemovePartitions(ctx, p.DB.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, r.Removed)
	require.NotContains(t, partitionNames(t, p.DB), old)
	row, err := st.Lookup(ctx, p.DB.Pool, "s", "live")
	require.NoError(t, err)
	// A fenced statement, sent to the row's partition by name (the Store learnt the
	// layout above), through the pooler.
	require.NoError(t, st.Release(ctx, p.DB.Pool, row.Fence(), keytable.Release{RecoveryPoint: row.RecoveryPoint,
		Data: []byte(`{}`), LastError: "pooled", RetryIn: time.Second, Stored: row.RecoveryPoint}))
	row, err = st.Lookup(ctx, p.DB.Pool, "s", "live")
	require.NoError(t, err)
	require.Equal(t, "pooled", *row.LastError)
}

// TestPartitionedInSchema: a Store with a schema sets up and maintains the partitioned
// table of that schema on connections whose search_path does not name it.
func TestPartitionedInSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "idemflow_no_such_schema"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	st, err := keytable.NewWith(keytable.Options{Schema: db.Schema})
	require.NoError(t, err)

	require.NoError(t, st.SetupPartitioned(ctx, pool, keytable.PartitionMinute, 3*time.Minute))
	parts, err := st.Partitions(ctx, pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(parts), 4)
	r, err := st.MaintainPartitions(ctx, pool, time.Hour, nil)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Ahead, 3)

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	c := claim("s", "k", "00000000-0000-4000-8000-000000000001")
	st.QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, RecoveryPoint: "started", Data: []byte(`{}`)})
	b.Queue("COMMIT")
	require.NoError(t, pool.SendBatch(ctx, b).Close())
	_, err = st.Lookup(ctx, pool, "s", "k")
	require.NoError(t, err)
	var kind string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'idemflow_keys'::regclass`).Scan(&kind))
	require.Equal(t, "p", kind, "the schema's table is the partitioned one")
}

// TestMaintainPartitionsPlain: on the default layout the maintenance step learns once
// that the table is not partitioned, then answers without the database.
func TestMaintainPartitionsPlain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	require.False(t, st.KnownUnpartitioned())
	_, err := st.MaintainPartitions(ctx, db.Pool, time.Hour, nil)
	require.ErrorIs(t, err, keytable.ErrNotPartitioned)
	require.True(t, st.KnownUnpartitioned())
	closed := db.NewPool(t)
	closed.Close()
	_, err = st.MaintainPartitions(ctx, closed, time.Hour, nil)
	require.ErrorIs(t, err, keytable.ErrNotPartitioned, "answered without the (closed) pool")
}

// TestSetupPartitionedWeek: week-wide partitions (for long retentions) run from Monday
// 00:00 UTC to the next Monday, are named by their first day, cover now and the
// default week ahead, and a key claimed now lands in the current one.
func TestSetupPartitionedWeek(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	require.NoError(t, st.SetupPartitioned(ctx, db.Pool, keytable.PartitionWeek, 0))
	parts, err := st.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, parts, 2, "the current week and the next (a week ahead)")
	now := dbNow(t, db)
	require.False(t, parts[0].From.After(now), "the first partition holds now")
	require.True(t, parts[1].To.After(now.Add(7*24*time.Hour)), "a week ahead is covered")
	for i, p := range parts {
		require.Equal(t, keytable.PartitionWeek, p.To.Sub(*p.From), p.Name)
		from := p.From.UTC()
		require.Equal(t, time.Monday, from.Weekday(), p.Name)
		require.Equal(t, from, from.Truncate(24*time.Hour), "midnight UTC")
		require.Equal(t, "idemflow_keys_p"+from.Format("20060102"), p.Name)
		if i > 0 {
			require.Equal(t, *parts[i-1].To, *p.From, "contiguous")
		}
	}
	row := claimNow(t, db, claim("s", "k", "00000000-0000-4000-8000-000000000001"))
	var inCurrent int // read from the partition, not by tableoid: on Citus that names a shard
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+parts[0].Name+` WHERE idempotency_key = $1`, row.Key).Scan(&inCurrent))
	require.Equal(t, 1, inCurrent, "the key is in the current week's partition")

	r, err := st.CheckPartitions(ctx, db.Pool)
	require.NoError(t, err)
	require.False(t, r.Low(), "%+v", r)
	r, err = st.EnsurePartitions(ctx, db.Pool, 0)
	require.NoError(t, err)
	require.Zero(t, r.Created, "a second pass creates nothing")
	require.Error(t, st.SetupPartitioned(ctx, db.Pool, 2*24*time.Hour, 0), "two days is neither a week nor a divisor of a day")
}

// TestRemovePartitionsKilledAtDrop: the backend of a removal is terminated while its
// drop waits for the lock of a table left detached by an earlier interrupted removal
// (another transaction reads it): nothing is lost or half done, the table is still
// there, detached, with its rows; the next removal drops it, and a live key of the
// current partition is intact.
func TestRemovePartitionsKilledAtDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()
	// A minute no other test of the package uses: tables of the same name in other
	// schemas would count below.
	from := dbNow(t, db).UTC().Truncate(time.Minute).Add(-53 * time.Minute)
	old := addPartition(t, db, from)
	insertRaw(t, db, "old", "00000000-0000-4000-8000-000000000002", "f", `'`+from.Add(time.Second).Format(time.RFC3339)+`'`,
		finishedSet+`, finished_at = '`+from.Add(time.Second).Format(time.RFC3339)+`'`)
	claimNow(t, db, claim("s", "live", "00000000-0000-4000-8000-000000000001"))
	_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+old)
	require.NoError(t, err)

	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT count(*) FROM `+old)
	require.NoError(t, err)
	err = killRemoval(t, db, st, "idemflow_drop", "LOCK TABLE%ACCESS EXCLUSIVE%")
	require.ErrorIs(t, err, keytable.ErrUnavailable, "the removal's backend was terminated")
	require.NoError(t, holder.Rollback(ctx))
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+old).Scan(&rows))
	require.Equal(t, 1, rows, "the detached table is intact")
	require.NotContains(t, partitionNames(t, db), old, "and still detached")

	r, err := st.RemovePartitions(ctx, db.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, r.Removed)
	require.Positive(t, r.DropLock)
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, old).Scan(&tables))
	require.Zero(t, tables, "dropped by the next removal")
	_, err = st.Lookup(ctx, db.Pool, "s", "live")
	require.NoError(t, err)
}

// TestRemovePartitionsKilledWhileShedding: the backend of a removal is terminated
// between its shedding steps (it waits for the lock of its second index drop, which
// another transaction holds, the first index already dropped): nothing is lost, the
// table is still there, detached, with its rows and the indexes the checks use; the
// next removal drops it, and a live key of the current partition is intact.
func TestRemovePartitionsKilledWhileShedding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	from := dbNow(t, db).UTC().Truncate(time.Minute).Add(-59 * time.Minute) // a minute of its own
	old := addPartition(t, db, from)
	insertRaw(t, db, "old", "00000000-0000-4000-8000-000000000002", "f", `'`+from.Add(time.Second).Format(time.RFC3339)+`'`,
		finishedSet+`, finished_at = '`+from.Add(time.Second).Format(time.RFC3339)+`'`)
	claimNow(t, db, claim("s", "live", "00000000-0000-4000-8000-000000000001"))
	indexes := func() (n, probes int) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pg_get_expr(indpred, indrelid) ~ '''(in_progress|dead)''')
FROM pg_index WHERE indrelid = to_regclass($1)`, old).Scan(&n, &probes))
		return n, probes
	}
	before, probes := indexes()
	require.Greater(t, before-probes, 1, "at least two indexes to shed")

	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	st, sheds := keytable.New(), 0
	st.SetRemovalOptions(true, func(phase string) {
		if phase == "shed" {
			if sheds++; sheds == 2 { // the first index is dropped: hold the table
				_, err := holder.Exec(ctx, `SELECT count(*) FROM `+old)
				require.NoError(t, err)
			}
		}
	})
	err = killRemoval(t, db, st, "idemflow_shed", "DROP INDEX%", "ALTER TABLE%DROP CONSTRAINT%")
	require.ErrorIs(t, err, keytable.ErrUnavailable, "the removal's backend was terminated")
	require.NoError(t, holder.Rollback(ctx))
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+old).Scan(&rows))
	require.Equal(t, 1, rows, "the detached table is intact")
	require.NotContains(t, partitionNames(t, db), old, "and still detached")
	after, left := indexes()
	require.Equal(t, before-1, after, "one index was shed before the kill")
	require.Equal(t, probes, left, "the checks' indexes are kept")

	r, err := keytable.New().RemovePartitions(ctx, db.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, r.Removed)
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, old).Scan(&tables))
	require.Zero(t, tables, "dropped by the next removal")
	_, err = keytable.New().Lookup(ctx, db.Pool, "s", "live")
	require.NoError(t, err)
}

// killRemoval runs st.RemovePartitions(10 minutes) on a pool of its own, named by app
// and db's schema, terminates its backend once it waits on a lock while running a
// statement LIKE one of patterns, and returns the removal's error. It fails the test
// if the removal returns before it waited so.
func killRemoval(t *testing.T, db *pgtest.DB, st *keytable.Store, app string, patterns ...string) error {
	t.Helper()
	return killWaiting(t, db, app, func(maint *pgxpool.Pool) error {
		_, err := st.RemovePartitions(context.Background(), maint, 10*time.Minute)
		return err
	}, patterns...)
}

// killWaiting runs run on a pool of its own, named by app and db's schema, terminates
// its backend once it waits on a lock while running a statement LIKE one of patterns,
// and returns run's error. It fails the test if run returns before it waited so.
func killWaiting(t *testing.T, db *pgtest.DB, app string, run func(*pgxpool.Pool) error, patterns ...string) error {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	app += "_" + db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	maint, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer maint.Close()
	done := make(chan error, 1)
	go func() { done <- run(maint) }()
	var killed bool
	for !killed && len(done) == 0 { // run returning first is a failure
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(a.pid)) > 0
FROM pg_stat_activity a WHERE a.application_name = $1 AND a.wait_event_type = 'Lock'
	AND a.query LIKE ANY($2)`, app, patterns).Scan(&killed))
	}
	require.True(t, killed, "%s waited for a lock at %q", app, patterns)
	return <-done
}

// TestExpireFinishedPartitioned: on a partitioned key table the expiry of finished
// keys deletes only the keys of partitions past their removal (one kept attached by a
// live key); a key that finished long enough ago, in a partition not yet past its
// removal, is left to go with its partition. Its backend terminated while its delete
// waits for the old partition's lock (the candidates chosen), the expiry deletes
// nothing; the next one deletes that key, once, and nothing else.
func TestExpireFinishedPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()
	now := dbNow(t, db).UTC()
	from := now.Truncate(time.Minute).Add(-41 * time.Minute)
	old := addPartition(t, db, from)
	at := func(ts time.Time) string { return `'` + ts.Format(time.RFC3339Nano) + `'` }
	insertRaw(t, db, "old-finished", "00000000-0000-4000-8000-000000000001", "f", at(from.Add(time.Second)),
		finishedSet+`, finished_at = `+at(from.Add(time.Second)))
	insertRaw(t, db, "old-live", "00000000-0000-4000-8000-000000000002", "f", at(from.Add(2*time.Second)), releasedSet)
	// In the current partition, finished (as the expiry reads it) 30 minutes ago: past
	// the 10 minutes' retention, its partition not.
	insertRaw(t, db, "recent-finished", "00000000-0000-4000-8000-000000000003", "f", at(now.Truncate(time.Minute)),
		finishedSet+`, finished_at = `+at(now.Add(-30*time.Minute)))
	// Created more than the retention ago but less than the retention and a width (a
	// minute) ago, half a width's margin either side: its partition may not be past its
	// removal yet, so it is left too.
	within := now.Add(-10*time.Minute - 30*time.Second)
	addPartition(t, db, within.Truncate(time.Minute))
	insertRaw(t, db, "within-width", "00000000-0000-4000-8000-000000000004", "f", at(within),
		finishedSet+`, finished_at = `+at(within))
	keys := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT idempotency_key FROM idemflow_keys ORDER BY 1`)
		require.NoError(t, err)
		k, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return k
	}

	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `LOCK TABLE `+old+` IN SHARE MODE`) // lets the scan read, not the delete write
	require.NoError(t, err)
	err = killWaiting(t, db, "idemflow_expire", func(maint *pgxpool.Pool) error {
		_, err := st.ExpireFinished(ctx, maint, 10*time.Minute, 100)
		return err
	}, "WITH c AS%")
	require.ErrorIs(t, err, keytable.ErrUnavailable, "the expiry's backend was terminated")
	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, []string{"old-finished", "old-live", "recent-finished", "within-width"}, keys(), "nothing deleted")

	n, err := st.ExpireFinished(ctx, db.Pool, 10*time.Minute, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"old-live", "recent-finished", "within-width"}, keys(),
		"the old partition's finished key deleted; the current partition's, and one created within a width of the retention, left for their removal")
	n, err = st.ExpireFinished(ctx, db.Pool, 10*time.Minute, 100)
	require.NoError(t, err)
	require.Zero(t, n)
	r, err := st.Lookup(ctx, db.Pool, "s", "recent-finished")
	require.NoError(t, err)
	require.Equal(t, keytable.StatusFinished, r.Status, "a retry of it is still a replay")
}

// TestPartitionsListedPastALock: the layout is read from the catalogs without locking
// a partition (its bounds deparsed with no relation), so that reading it never waits
// behind a lock on one: a removal's drop, which holds the detached table's ACCESS
// EXCLUSIVE lock, another removal's locked probes, or an operator's LOCK TABLE.
func TestPartitionsListedPastALock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	old := addPartition(t, db, dbNow(t, db).UTC().Truncate(time.Minute).Add(-30*time.Minute))
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `LOCK TABLE `+old+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	type listed struct {
		parts []keytable.Partition
		err   error
	}
	done := make(chan listed, 1)
	go func() {
		parts, err := keytable.New().Partitions(ctx, conn)
		done <- listed{parts, err}
	}()
	got := false
	defer func() { // a listing that waits ends with the lock, before conn goes back
		_ = holder.Rollback(ctx)
		if !got {
			<-done
		}
	}()
	for {
		select {
		case l := <-done:
			got = true
			require.NoError(t, l.err)
			var names []string
			for _, p := range l.parts {
				names = append(names, p.Name)
			}
			require.Contains(t, names, old)
			return
		default:
		}
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE pid = $1 AND NOT granted)`, pid).Scan(&waiting))
		require.False(t, waiting, "listing the partitions waits for the lock on %s", old)
	}
}

// TestEnsurePartitionsFailedReportsWhatExists: a creation step that fails part of the
// way (a table named as a partition to come, of another shape, cannot be attached)
// rolls back the partitions it had created, and its report says what exists: nothing
// created, no more partitions ahead than before, so that Low still warns (before, it
// counted the rolled-back ones, and a creation that kept failing silenced the warning).
func TestEnsurePartitionsFailedReportsWhatExists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	st := keytable.New()
	before, err := st.CheckPartitions(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, before.Low(), "3 minute partitions ahead of the 10 wanted: %+v", before)
	names := partitionNames(t, db)
	blocker := "idemflow_keys_p" + dbNow(t, db).UTC().Truncate(time.Minute).Add(8*time.Minute).Format("200601021504")
	_, err = db.Pool.Exec(ctx, `CREATE TABLE `+blocker+` (x int)`)
	require.NoError(t, err)

	r, err := st.EnsurePartitions(ctx, db.Pool, 12*time.Minute)
	require.ErrorContains(t, err, blocker)
	require.Zero(t, r.Created, "%+v", r)
	require.LessOrEqual(t, r.Ahead, before.Ahead, "%+v", r)
	require.True(t, r.Low(), "%+v", r)
	require.Equal(t, names, partitionNames(t, db), "the step's partitions rolled back")
}

// TestMaintainPartitionsRemovesWhenCreationFails: a maintenance step whose creation
// ahead fails (a table of another shape named as a partition to come cannot be
// attached) still removes the partitions past retention, and its error names the
// creation's failure (before, a creation that kept failing stopped retention too).
func TestMaintainPartitionsRemovesWhenCreationFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setupPartitioned(t)
	now := dbNow(t, db).UTC().Truncate(time.Minute)
	old := addFinished(t, db, now.Add(-51*time.Minute))
	blocker := "idemflow_keys_p" + now.Add(8*time.Minute).Format("200601021504") // within the ten made ahead
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+blocker+` (x int)`)
	require.NoError(t, err)

	r, err := keytable.New().MaintainPartitions(ctx, db.Pool, 10*time.Minute, nil)
	require.ErrorContains(t, err, blocker)
	require.Equal(t, 1, r.Removed, "%+v", r)
	require.NotContains(t, partitionNames(t, db), old)
}
