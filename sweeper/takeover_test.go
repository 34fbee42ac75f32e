package sweeper_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// stuckKeys makes n keys stuck at the reserve recovery point (their pay phase failed),
// due for a sweeper, and returns their names.
func stuckKeys(t *testing.T, b *bundle, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("c-%03d", i)
		b.stuck(t, chargeReq(keys[i]), testflow.Pay)
	}
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys
		SET created_at = statement_timestamp() - interval '1 hour', next_attempt_at = statement_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	return keys
}

// takenKeys counts the keys whose lock version moved past v (taken over since).
func takenKeys(t *testing.T, b *bundle, v int64) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idemflow_keys WHERE lock_version > $1`, v).Scan(&n))
	return n
}

// A pass takes its batch in chunks while the first keys run: its workers start before
// the batch's last keys are taken over, and it takes no more than BatchSize.
func TestPassTakesInChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const conc, batch, keys = 2, 7, 25 // chunks of 2 and 5 (8 capped by BatchSize)
	var armed atomic.Bool
	running := make(chan struct{})
	var runOnce sync.Once
	var swept atomic.Int64
	var waited atomic.Bool
	hooks := workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if armed.Load() && ev.Executor == workflow.ExecutorSweeper {
				runOnce.Do(func() { close(running) })
			}
			return ctx
		},
		Key: func(_ context.Context, ev workflow.KeyEvent) {
			// The first key of the pass's second chunk is taken only once a worker runs
			// a key of the first: a pass that took the whole batch in one statement
			// before running any would wait here for ever.
			if !armed.Load() || ev.Kind != workflow.OutcomeSwept || swept.Add(1) != conc+1 {
				return
			}
			select {
			case <-running:
				waited.Store(true)
			case <-time.After(time.Minute): // a bound on a failure, not a wait for success
			}
		},
	}
	b := setup(t, setupOpts{engine: &workflow.Config{Hooks: hooks}})
	stuckKeys(t, b, keys)
	armed.Store(true)

	cfg := &sweeper.Config{Grace: -1, Concurrency: conc, BatchSize: batch}
	st, err := b.engine.Sweep(ctx, cfg)
	require.NoError(t, err)
	require.True(t, waited.Load(), "the second chunk was taken before any key of the first ran")
	require.Equal(t, sweeper.Stats{Taken: batch, Finished: batch}, st)
	require.Equal(t, batch, takenKeys(t, b, 1), "one pass takes no more than BatchSize")

	for range keys {
		st, err := b.engine.Sweep(ctx, cfg)
		require.NoError(t, err)
		require.Equal(t, st.Taken, st.Finished, "%+v", st)
		if st.Taken == 0 {
			break
		}
	}
	requireEachKeyOnce(t, b, keys)
}

// A sweeper process (Engine.Start) killed between the chunks of a pass, right after
// taking over the second chunk (its first key's swept event), while keys of the first
// chunk run, leaves what it took leased and the rest of the batch untaken: once the
// leases end, another process's passes finish every key with one effect each.
func TestSweeperKilledBetweenChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const keys = 40
	b := setup(t, setupOpts{})
	stuckKeys(t, b, keys)

	ch := startChild(t, b, "loop", envPoint+"="+childproc.Swept, fmt.Sprintf("%s=%d", envNth, loopConcurrency+1))
	killed, _ := ch.Killed(t)
	require.True(t, killed, "not killed at the second chunk: %s", ch.Stderr())
	taken := takenKeys(t, b, 1)
	require.Greater(t, taken, loopConcurrency, "the second chunk was taken over")
	require.Less(t, taken, keys, "the pass was cut before it took the whole batch")

	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET locked_until = timestamptz '2000-01-01 00:00:00+00'
		WHERE locked_until IS NOT NULL`)
	require.NoError(t, err)
	var total sweeper.Stats
	for range keys {
		st, err := b.engine.Sweep(ctx, &sweeper.Config{Grace: -1})
		require.NoError(t, err)
		require.Zero(t, st.LeaseLost+st.Released+st.DeadLettered+st.GivenBack, "%+v", st)
		total.Taken += st.Taken
		total.Finished += st.Finished
		if st.Taken == 0 {
			break
		}
	}
	require.Equal(t, total.Taken, total.Finished)
	requireEachKeyOnce(t, b, keys)
}

// A takeover whose backend is terminated inside its transaction (its planner settings
// applied, its statement waiting for the table) takes nothing and the pass says so: the key keeps its lock
// version and stays due without a lease, and the next pass finishes it with one effect.
// On Citus (the per-key takeover) the statement that waits for the table is the scan
// that lists the candidates.
func TestTakeoverBackendTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.stuck(t, chargeReq("k"), testflow.Pay)
	makeDue(t, b.db, "k")
	before := state(t, b.db, "k")

	lock, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `LOCK TABLE idemflow_keys IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Sweep(ctx, &sweeper.Config{Grace: -1})
		done <- err
	}()
	var pid int
	require.Eventually(t, func() bool { // the takeover waits for the table, inside its transaction
		err := b.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND xact_start IS NOT NULL AND application_name NOT LIKE 'citus%'
				AND (query LIKE '%lock_version = lock_version + 1%' OR query LIKE '%SELECT c.scope, c.idempotency_key, c.lock_version%')`).Scan(&pid)
		return err == nil
	}, time.Minute, 5*time.Millisecond)
	_, err = b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid)
	require.NoError(t, err)
	require.NoError(t, lock.Rollback(ctx))
	require.Error(t, <-done, "the pass reports the takeover's failure")

	after := state(t, b.db, "k")
	require.Equal(t, before.LockVersion, after.LockVersion, "nothing was taken over")
	require.False(t, after.Leased)
	require.True(t, after.Due)
	require.Zero(t, b.provider.Made(), "the key was not run")

	st, err := b.engine.Sweep(ctx, &sweeper.Config{Grace: -1})
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, st)
	requireOneEffect(t, b, "k", testflow.Pay)
	require.Equal(t, 1, b.provider.Made())
	require.Equal(t, before.LockVersion+1, state(t, b.db, "k").LockVersion, "taken over once")
}

// spreadDue makes the stuck keys due one every 20 seconds over the last hour, by the
// database clock, in key order: start points fall among them. One statement per key,
// by scope and key, with the hour's start read first: Citus runs neither a join across
// shards in an UPDATE nor a clock read beside a column in one.
func spreadDue(t *testing.T, b *bundle) {
	t.Helper()
	ctx := context.Background()
	var hourAgo time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT statement_timestamp() - interval '1 hour'`).Scan(&hourAgo))
	rows, err := b.db.Pool.Query(ctx, `SELECT scope, idempotency_key FROM idemflow_keys ORDER BY idempotency_key`)
	require.NoError(t, err)
	type keyName struct{ Scope, Key string }
	names, err := pgx.CollectRows(rows, pgx.RowToStructByPos[keyName])
	require.NoError(t, err)
	batch := &pgx.Batch{}
	for i, k := range names {
		batch.Queue(`UPDATE idemflow_keys SET next_attempt_at = $3::timestamptz + $4::int * interval '20 seconds'
			WHERE scope = $1 AND idempotency_key = $2`, k.Scope, k.Key, hourAgo, i+1)
	}
	require.NoError(t, b.db.Pool.SendBatch(ctx, batch).Close())
}

// Takeovers start at a random point of the due order and wrap around to the oldest. A
// sweeper process (Engine.Start) killed right after taking over its second chunk from
// such a point leaves what it took leased; three sweeper processes then drain the rest
// at once, each statement from its own random point, skipping the dead one's keys; once
// those leases end, passes here finish them. Every key is taken by one live sweeper and
// finished once, with one effect; the last keys left, wherever they are due, are taken.
// Both takeovers: the single statement's and the per-key scan's (Citus's, and the
// partitioned key table's choice).
func TestSweepersFromRandomStartsOneKilled(t *testing.T) {
	t.Parallel()
	for _, scan := range []workflow.Scan{workflow.ScanSingle, workflow.ScanPerKey} {
		t.Run(string(scan), func(t *testing.T) {
			if scan == workflow.ScanSingle && pgtest.CitusMode() {
				t.Skip("skipped: Citus refuses the single statement (ctid) on a distributed key table")
			}
			testSweepersFromRandomStartsOneKilled(t, scan)
		})
	}
}

func testSweepersFromRandomStartsOneKilled(t *testing.T, scan workflow.Scan) {
	t.Parallel()
	ctx := context.Background()
	const keys, procs = 150, 3
	b := setup(t, setupOpts{engine: &workflow.Config{Scan: scan}})
	withScan := envScan + "=" + string(scan)
	stuckKeys(t, b, keys)
	spreadDue(t, b)

	deadApp := "dead_" + b.db.Schema
	dead := startChild(t, b, "loop", envPoint+"="+childproc.Swept, fmt.Sprintf("%s=%d", envNth, loopConcurrency+1), withScan, envApp+"="+deadApp)
	killed, _ := dead.Killed(t)
	require.True(t, killed, "not killed at its second chunk: %s", dead.Stderr())
	waitSessionsGone(t, b, deadApp)
	held := takenKeys(t, b, 1)
	require.Greater(t, held, loopConcurrency, "the dead process took its second chunk")
	require.Less(t, held, keys)
	// Its first chunk's keys ran while it took the second: on a busy machine some
	// finished before the kill. What it finished and what it left leased are counted
	// once it is dead; the live sweepers must take every other key and none of these.
	var deadFinished, deadLeased int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'finished'),
		count(*) FILTER (WHERE status = 'in_progress' AND locked_until > statement_timestamp())
		FROM idemflow_keys`).Scan(&deadFinished, &deadLeased))
	t.Logf("the dead process finished %d keys and left %d leased", deadFinished, deadLeased)
	require.Equal(t, held, deadFinished+deadLeased, "each key it took is finished or still leased")

	children := make([]*childproc.Child, procs)
	for i := range children {
		children[i] = startChild(t, b, "sweep", withScan)
	}
	for _, c := range children {
		event(t, c, "ready")
	}
	for _, c := range children {
		c.Send(t, "go")
	}
	var total sweeper.Stats
	for i, c := range children {
		st := finalStats(t, c)
		t.Logf("sweeper process %d: %+v", i, st)
		require.Zero(t, st.LeaseLost+st.Released+st.DeadLettered+st.GivenBack+st.Parked, "process %d: %+v", i, st)
		total.Taken += st.Taken
		total.Finished += st.Finished
	}
	var leased int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys
		WHERE status = 'in_progress' AND locked_until > statement_timestamp()`).Scan(&leased))
	require.Equal(t, keys-deadFinished-deadLeased, total.Finished, "the live sweepers finished every key the dead one did not take")
	require.Equal(t, deadLeased, leased, "the live sweepers left only the dead one's leased keys")

	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET locked_until = timestamptz '2000-01-01 00:00:00+00'
		WHERE locked_until IS NOT NULL`)
	require.NoError(t, err)
	for range keys {
		st, err := b.engine.Sweep(ctx, &sweeper.Config{Grace: -1})
		require.NoError(t, err)
		require.Zero(t, st.LeaseLost+st.Released+st.DeadLettered+st.GivenBack, "%+v", st)
		total.Taken += st.Taken
		total.Finished += st.Finished
		if st.Taken == 0 {
			break
		}
	}
	require.Equal(t, keys-deadFinished, total.Taken, "every key the dead process did not finish taken once by a live sweeper")
	require.Equal(t, keys-deadFinished, total.Finished)
	requireEachKeyOnce(t, b, keys)
}
