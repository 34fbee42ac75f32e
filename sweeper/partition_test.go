package sweeper_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// setupPartitioned is setup on a key table partitioned by the minute
// (docs/PARTITIONS.md), with the partition of the previous minute attached too.
func setupPartitioned(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, setupOpts{})
	ctx := context.Background()
	require.NoError(t, store.New().SetupPartitioned(ctx, b.db.Pool, store.PartitionMinute, 0))
	// The minute before the set-up's first partition, not before now's: a set-up that
	// ran into the next minute (a slow one, on Citus) has made that one already.
	parts, err := store.New().Partitions(ctx, b.db.Pool)
	require.NoError(t, err)
	attachMinuteAt(t, b.db, parts[0].From.Add(-time.Minute))
	return b
}

// insertFinishedAt inserts a finished key row created (and finished) a second into
// the minute that begins at from: into that minute's partition. The minute comes from
// the partition's own set-up (addMinutePartition), never from the clock again: the
// database's minute may have turned in between.
func insertFinishedAt(t *testing.T, db *pgtest.DB, key string, from time.Time) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at, status,
	 recovery_point, response_status, response_headers, response_body, finished_at)
SELECT 'acct', $1, gen_random_uuid(), 'f', 'POST', '/r', sha256('x'), '', c, 'finished', 'finished', 200, '{}', '', c
FROM (SELECT $2::timestamptz + interval '1 second' AS c) t`, key, from)
	require.NoError(t, err, key)
}

// addMinutePartition attaches the minute partition m minutes from now by the database
// clock, and returns its name and the minute it begins at.
func addMinutePartition(t *testing.T, db *pgtest.DB, m int) (string, time.Time) {
	t.Helper()
	ctx := context.Background()
	var from time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', statement_timestamp() + $1 * interval '1 minute')`, m).Scan(&from))
	return attachMinuteAt(t, db, from), from
}

// attachMinuteAt attaches the minute partition beginning at from, named as the Store
// names its own.
func attachMinuteAt(t *testing.T, db *pgtest.DB, from time.Time) string {
	t.Helper()
	ctx := context.Background()
	name := "idemflow_keys_p" + from.UTC().Format("200601021504")
	// Two statements: a Citus coordinator refuses to attach a table to a distributed
	// one in the statement string that created it.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE idemflow_keys ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
		name, from.UTC().Format(time.RFC3339), from.Add(time.Minute).UTC().Format(time.RFC3339)))
	require.NoError(t, err)
	return name
}

// moveBack moves the key row of key a minute back in creation time: into the previous
// minute's partition. From the database's view, the key was claimed just before a
// partition boundary and is retried just after it.
func moveBack(t *testing.T, db *pgtest.DB, key string) {
	t.Helper()
	var before, after string
	ctx := context.Background()
	q := `SELECT tableoid::regclass::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`
	require.NoError(t, db.Pool.QueryRow(ctx, q, key).Scan(&before))
	// The new time is worked out here: Citus refuses a STABLE function (date_trunc of a
	// timestamptz) on a column in an UPDATE.
	var created time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT created_at FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&created))
	_, err := db.Pool.Exec(ctx, `UPDATE idemflow_keys SET created_at = $2 WHERE scope = 'acct' AND idempotency_key = $1`,
		key, created.UTC().Truncate(time.Minute).Add(-time.Microsecond))
	require.NoError(t, err)
	require.NoError(t, db.Pool.QueryRow(ctx, q, key).Scan(&after))
	require.NotEqual(t, before, after, "the row moved to another partition")
}

func keyRows(t *testing.T, db *pgtest.DB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&n))
	return n
}

// TestPartitionedAcrossBoundary: keys claimed before a partition boundary and retried
// after it are replayed or resumed from their row in the earlier partition: one row,
// one effect.
func TestPartitionedAcrossBoundary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPartitioned(t)

	t.Run("Finished", func(t *testing.T) {
		first, err := b.engine.Do(ctx, chargeReq("finished"))
		require.NoError(t, err)
		moveBack(t, b.db, "finished")
		again, err := b.engine.Do(ctx, chargeReq("finished"))
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Response.Body, again.Response.Body)
		require.Equal(t, 1, keyRows(t, b.db, "finished"))
	})

	t.Run("Resumed", func(t *testing.T) {
		// Paid at the provider, failed before recording: the retry after the boundary
		// resumes under the same row id, so the same derived key.
		b.stuck(t, payFirstReq("resumed"), payFirstRecord)
		made := b.provider.Made()
		moveBack(t, b.db, "resumed")
		res, err := b.engine.Do(ctx, payFirstReq("resumed"))
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, 1, keyRows(t, b.db, "resumed"))
		var payments int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT payment_id) FROM ledger WHERE idem_key = 'resumed'`).Scan(&payments))
		require.Equal(t, 1, payments)
		require.Equal(t, made, b.provider.Made(), "no second payment at the provider")
	})
}

// TestPartitionedConcurrentDuplicates: attempts of the same keys race where no unique
// index spans the partitions; the claim lock still lets one row per key in.
//
//   - ClaimAtCommit: a flow whose first phase is a call claims with the insert at its
//     commit, through the key table, and every such insert lands, at random, in this
//     minute's partition or the previous one (the column's default is made so).
//   - GoCode: the Go-code claim at READ COMMITTED inserts into the partition of its
//     transaction's start by name, which a column default cannot move; so half of the
//     keys are claimed and finished first and their rows moved into the previous
//     minute's partition, and then every key is raced: those must be found there
//     under the lock (never a second row in this minute's), the others claimed once.
func TestPartitionedConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const keys, racers = 40, 6
	race := func(b *bundle, req func(string) workflow.Request) {
		var wg sync.WaitGroup
		for k := range keys {
			for range racers {
				wg.Go(func() {
					// Losers answer at once (busy or a replay); only the outcome in the
					// table matters here.
					_, _ = b.engine.Do(context.Background(), req(fmt.Sprintf("k%d", k)))
				})
			}
		}
		wg.Wait()
	}
	check := func(t *testing.T, b *bundle) {
		var dups, spread int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT
	(SELECT count(*) FROM (SELECT 1 FROM idemflow_keys GROUP BY scope, idempotency_key HAVING count(*) > 1) d),
	(SELECT count(DISTINCT date_trunc('minute', created_at)) FROM idemflow_keys)`).Scan(&dups, &spread)) // a minute a partition (tableoid names a shard on Citus)
		require.Zero(t, dups, "no (scope, key) has two rows")
		// Two partitions at least: a race that straddles a minute's end spans three.
		require.GreaterOrEqual(t, spread, 2, "rows in both partitions")
		var ledger int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) - count(DISTINCT idem_key) FROM ledger`).Scan(&ledger))
		require.Zero(t, ledger, "one ledger row per key")
	}
	t.Run("ClaimAtCommit", func(t *testing.T) {
		t.Parallel()
		b := setupPartitioned(t)
		_, err := b.db.Pool.Exec(context.Background(), `ALTER TABLE idemflow_keys ALTER COLUMN created_at
	SET DEFAULT now() - (random() < 0.5)::int * interval '1 minute'`)
		require.NoError(t, err)
		race(b, payFirstReq)
		check(t, b)
	})
	t.Run("GoCode", func(t *testing.T) {
		t.Parallel()
		b := setupPartitioned(t)
		ids := func() map[string]string {
			rows, err := b.db.Pool.Query(context.Background(), `SELECT idempotency_key, id::text FROM idemflow_keys
	WHERE idempotency_key = ANY(SELECT 'k' || g FROM generate_series(0, $1 - 1, 2) g)`, keys)
			require.NoError(t, err)
			m := map[string]string{}
			for rows.Next() {
				var k, id string
				require.NoError(t, rows.Scan(&k, &id))
				m[k] = id
			}
			require.NoError(t, rows.Err())
			return m
		}
		for k := 0; k < keys; k += 2 {
			_, err := b.engine.Do(context.Background(), chargeReq(fmt.Sprintf("k%d", k)))
			require.NoError(t, err)
			moveBack(t, b.db, fmt.Sprintf("k%d", k))
		}
		moved := ids()
		require.Len(t, moved, keys/2)
		race(b, chargeReq)
		check(t, b)
		require.Equal(t, moved, ids(), "the keys moved back kept their rows: found under the lock, never claimed again")
	})
}

// TestSweeperPartitions: a pass creates partitions ahead, removes a partition past
// retention that holds only finished keys, keeps one that holds a dead-lettered key,
// and reports it in Stats.Partitions; with too few partitions ahead it warns, once.
func TestSweeperPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPartitioned(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	// Ten minutes: past it are the two partitions below only, not the set-up's, however
	// many minutes a slow set-up (on Citus) crossed before the pass.
	sw := b.newSweeper(t, &sweeper.Config{Retention: 10 * time.Minute, Logger: logger})

	// One minute read from the clock for both partitions and their rows: two reads may
	// fall on either side of a minute's turn.
	oldDone, doneFrom := addMinutePartition(t, b.db, -30)
	oldDead := attachMinuteAt(t, b.db, doneFrom.Add(time.Minute))
	insertOld := func(key, status string, from time.Time) {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at, status,
	 recovery_point, response_status, response_headers, response_body, finished_at)
SELECT 'acct', $1, gen_random_uuid(), 'f', 'POST', '/r', sha256('x'), '', c, $2,
	CASE WHEN $2 = 'finished' THEN 'finished' ELSE 'started' END,
	CASE WHEN $2 = 'finished' THEN 200 END, CASE WHEN $2 = 'finished' THEN '{}'::jsonb END,
	CASE WHEN $2 = 'finished' THEN ''::bytea END, CASE WHEN $2 = 'finished' THEN c END
FROM (SELECT $3::timestamptz + interval '1 second' AS c) t`, key, status, from)
		require.NoError(t, err, key)
	}
	insertOld("old-finished", "finished", doneFrom)
	insertOld("old-dead", "dead", doneFrom.Add(time.Minute))

	st, err := sw.RunOnce(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Partitions.Ahead, 10, "ten minute partitions ahead by default")
	require.Equal(t, 1, st.Partitions.Removed)
	require.Equal(t, 1, st.Partitions.Kept)
	// What the removal cost is in the stats and the log, for an operator to see.
	require.Positive(t, st.Partitions.Removal, "the removal's time")
	require.Positive(t, st.Partitions.DropLock, "the drop's lock hold")
	require.LessOrEqual(t, st.Partitions.DropLock, st.Partitions.Removal)
	if pgtest.CitusMode() {
		require.Positive(t, st.Partitions.Stall, "Citus detaches plainly, under a bounded lock: its stall is reported")
	} else {
		require.Zero(t, st.Partitions.Stall, "no plain detach off Citus")
	}
	mu.Lock()
	require.Contains(t, logs.String(), `msg="sweeper: removed key table partitions" removed=1 kept=1 contended=0 took=`)
	mu.Unlock()
	parts, err := store.New().Partitions(ctx, b.db.Pool)
	require.NoError(t, err)
	var names []string
	for _, p := range parts {
		names = append(names, p.Name)
	}
	require.NotContains(t, names, oldDone)
	require.Contains(t, names, oldDead)
	require.Equal(t, 1, keyRows(t, b.db, "old-dead"))
	require.NotContains(t, logs.String(), "few key table partitions ahead")

	t.Run("FewAhead", func(t *testing.T) {
		// Another process holds the maintenance lock, and the partitions ahead were
		// detached: the pass creates none and warns, once.
		var now time.Time
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now))
		for _, p := range parts {
			if p.From.After(now.Add(time.Minute)) {
				_, err := b.db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+p.Name)
				require.NoError(t, err)
			}
		}
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint # 'idemflow_keys'::regclass::oid::bigint)`, partitionLockSalt)
		require.NoError(t, err)
		for range 2 {
			st, err := sw.RunOnce(ctx)
			require.NoError(t, err)
			require.Less(t, st.Partitions.Ahead, 5)
		}
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("few key table partitions ahead")), logs.String())
	})
}

// partitionLockSalt is the key table's maintenance lock salt (internal/keytable/partition_maint.go).
const partitionLockSalt int64 = 0x1dfb3a64f0c59e27

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestPartitionedRepeatableReadFirstPhase: a flow whose first phase runs at REPEATABLE
// READ cannot claim keys on the partitioned layout: the attempt fails with
// ErrRefused, nothing of the phase commits and no key row is written (a claim under
// one snapshot could make a second row for the key there: docs/PARTITIONS.md).
func TestPartitionedRepeatableReadFirstPhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPartitioned(t)
	var ran atomic.Int64
	first := phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		ran.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (scope, idem_key, amount) VALUES ($1, $2, 1)`, run.Scope(), run.Key()); err != nil {
			return nil, err
		}
		return phases.JSON(http.StatusCreated, map[string]int{"amount": 1})
	})
	first.IsoLevel = pgx.RepeatableRead
	require.NoError(t, b.engine.Register(phases.Flow{Name: "rr", Phases: []phases.Phase{first}}))

	_, err := b.engine.Do(ctx, workflow.Request{Scope: "acct", Key: "rr", Flow: "rr", Method: "POST", Route: "/rr", Body: []byte(`{}`)})
	require.ErrorIs(t, err, workflow.ErrRefused)
	require.Equal(t, 0, keyRows(t, b.db, "rr"))
	var ledger int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE idem_key = 'rr'`).Scan(&ledger))
	require.Zero(t, ledger, "nothing of the phase committed")
	t.Logf("the phase's code ran %d times; the error: %v", ran.Load(), err)
}
