package keytable_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// sweepRows claims one key per name in scope "s" (flow "f", leased for a minute, claimed
// an hour ago by the database clock) and applies the statements given for it, which
// refer to the row's key as $1.
func sweepRows(t *testing.T, db *pgtest.DB, rows map[string][]string) map[string]*keytable.Row {
	t.Helper()
	ctx := context.Background()
	out := map[string]*keytable.Row{}
	i := 0
	for key, stmts := range rows {
		i++
		out[key] = claimNow(t, db, claim("s", key, fmt.Sprintf("00000000-0000-4000-8000-%012d", i)))
		_, err := db.Pool.Exec(ctx, `UPDATE idemflow_keys SET created_at = statement_timestamp() - interval '1 hour' WHERE idempotency_key = $1`, key)
		require.NoError(t, err)
		for _, sql := range stmts {
			_, err := db.Pool.Exec(ctx, sql, key)
			require.NoError(t, err, key)
		}
	}
	return out
}

const (
	released = `UPDATE idemflow_keys SET locked_until = NULL, next_attempt_at = statement_timestamp() - interval '1 second' WHERE idempotency_key = $1`
	expired  = `UPDATE idemflow_keys SET locked_until = statement_timestamp() - interval '1 millisecond' WHERE idempotency_key = $1`
)

func takenKeys(rows []*keytable.Row) []string {
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.Key)
	}
	slices.Sort(keys)
	return keys
}

func TestTakeDue(t *testing.T) { forEachScan(t, testTakeDue) }

func testTakeDue(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	sweepRows(t, db, map[string][]string{
		"released": {released},
		"expired":  {expired},
		"fresh":    {released, `UPDATE idemflow_keys SET created_at = statement_timestamp() WHERE idempotency_key = $1`},
		"live":     {},
		"later":    {`UPDATE idemflow_keys SET locked_until = NULL, next_attempt_at = statement_timestamp() + interval '1 minute' WHERE idempotency_key = $1`},
		"other":    {released, `UPDATE idemflow_keys SET flow = 'g' WHERE idempotency_key = $1`},
		"dead":     {released, `UPDATE idemflow_keys SET status = 'dead' WHERE idempotency_key = $1`},
		"finished": {`UPDATE idemflow_keys SET status = 'finished', recovery_point = 'finished', locked_until = NULL,
			response_status = 200, response_headers = '{}', response_body = '', finished_at = statement_timestamp() WHERE idempotency_key = $1`},
	})

	_, err := st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: 0, Flows: []string{"f"}})
	require.Error(t, err)
	none, err := st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Empty(t, none, "no flows, no keys")

	q := keytable.TakeDue{Limit: 10, Grace: time.Minute, Lease: time.Minute, Flows: []string{"f"}}
	taken, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Equal(t, []string{"expired", "released"}, takenKeys(taken))
	for _, r := range taken {
		require.EqualValues(t, 2, r.LockVersion, r.Key)
		require.Equal(t, 2, r.Attempts, r.Key)
		require.True(t, r.LeaseLive, r.Key)
		require.Greater(t, r.LeaseLeft(), 50*time.Second, r.Key)
		require.Equal(t, "s", r.Scope)
	}
	again, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Empty(t, again, "taken keys are leased")

	q.Flows = []string{"f", "g"}
	q.Grace = 0
	taken, err = st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Equal(t, []string{"fresh", "other"}, takenKeys(taken), "no grace, both flows")
}

func TestTakeDueOrderAndLimit(t *testing.T) { forEachScan(t, testTakeDueOrderAndLimit) }

func testTakeDueOrderAndLimit(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	sweepRows(t, db, map[string][]string{
		"a": {`UPDATE idemflow_keys SET locked_until = NULL, next_attempt_at = statement_timestamp() - interval '3 seconds' WHERE idempotency_key = $1`},
		"b": {`UPDATE idemflow_keys SET locked_until = NULL, next_attempt_at = statement_timestamp() - interval '2 seconds' WHERE idempotency_key = $1`},
		"c": {`UPDATE idemflow_keys SET locked_until = NULL, next_attempt_at = statement_timestamp() - interval '1 second' WHERE idempotency_key = $1`},
	})
	q := keytable.TakeDue{Limit: 2, Lease: time.Minute, Flows: []string{"f"}}
	taken, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, takenKeys(taken), "the longest due first")
	taken, err = st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, takenKeys(taken))
}

// A takeover starts at TakeDue.From of the way from the oldest unfinished key's due
// time to now, takes in due order from there, and wraps around to the oldest: keys
// before the start point are taken when those after it run out. A start point outside
// [0, 1) is refused and takes nothing.
func TestTakeDueFrom(t *testing.T) { forEachScan(t, testTakeDueFrom) }

func testTakeDueFrom(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rows := map[string][]string{}
	for i := range 10 { // k0 due 10 minutes ago, ..., k9 1 minute ago
		rows[fmt.Sprintf("k%d", i)] = []string{fmt.Sprintf(`UPDATE idemflow_keys SET locked_until = NULL,
			next_attempt_at = statement_timestamp() - interval '%d minutes' WHERE idempotency_key = $1`, 10-i)}
	}
	sweepRows(t, db, rows)
	take := func(from float64, limit int) []string {
		t.Helper()
		taken, err := st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: limit, Lease: time.Minute, Flows: []string{"f"}, From: from})
		require.NoError(t, err)
		return takenKeys(taken)
	}
	for _, bad := range []float64{1, -0.1, math.NaN(), math.Inf(1)} {
		_, err := st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: 10, Lease: time.Minute, Flows: []string{"f"}, From: bad})
		require.ErrorContains(t, err, "outside [0, 1)", "start point %v", bad)
	}
	var leased int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE locked_until IS NOT NULL`).Scan(&leased))
	require.Zero(t, leased, "a refused start point took nothing")

	// Start 4.5 of 10 minutes in: k5 is the first key due after it.
	require.Equal(t, []string{"k5", "k6", "k7"}, take(0.45, 3), "in due order from the start point")
	// Start just before now: no key is due after it, so the oldest are taken.
	require.Equal(t, []string{"k0", "k1"}, take(0.99, 2), "wrapped around to the oldest")
	// The rest after the start point, then the rest before it.
	require.Equal(t, []string{"k2", "k3", "k4", "k8", "k9"}, take(0.45, 10), "every due key is within reach")
	require.Empty(t, take(0, 10))
}

// A row someone holds locked is skipped, not waited for: another sweeper taking it, or
// a request committing its finish.
func TestTakeDueSkipsLockedRows(t *testing.T) { forEachScan(t, testTakeDueSkipsLockedRows) }

func testTakeDueSkipsLockedRows(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	sweepRows(t, db, map[string][]string{"held": {released}, "free": {released}})

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM idemflow_keys WHERE scope = 's' AND idempotency_key = 'held' FOR UPDATE`)
	require.NoError(t, err)

	q := keytable.TakeDue{Limit: 10, Lease: time.Minute, Flows: []string{"f"}}
	taken, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Equal(t, []string{"free"}, takenKeys(taken))

	require.NoError(t, tx.Rollback(ctx))
	taken, err = st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Equal(t, []string{"held"}, takenKeys(taken), "taken once the lock is gone")
}

func TestGiveBackDeadLetterRedrive(t *testing.T) { forEachScan(t, testGiveBackDeadLetterRedrive) }

func testGiveBackDeadLetterRedrive(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	sweepRows(t, db, map[string][]string{"k": {released}})
	q := keytable.TakeDue{Limit: 1, Lease: time.Minute, Flows: []string{"f"}}
	taken, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Len(t, taken, 1)
	r := taken[0]
	f := r.Fence()

	stale := f
	stale.LockVersion--
	require.ErrorIs(t, st.GiveBack(ctx, db.Pool, stale), keytable.ErrLeaseLost)
	require.NoError(t, st.GiveBack(ctx, db.Pool, f))
	require.ErrorIs(t, st.GiveBack(ctx, db.Pool, f), keytable.ErrLeaseLost, "only a leased key is given back")
	row, err := st.Lookup(ctx, db.Pool, "s", "k")
	require.NoError(t, err)
	require.Equal(t, 1, row.Attempts, "the takeover's attempt is uncounted")
	require.False(t, row.LeaseLive)

	taken, err = st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Len(t, taken, 1, "still due")
	f.LockVersion = taken[0].LockVersion

	require.ErrorIs(t, st.DeadLetter(ctx, db.Pool, stale, keytable.DeadLetter{RecoveryPoint: "started", Data: []byte(`{}`), LastError: "no", Stored: "started"}), keytable.ErrLeaseLost)
	require.NoError(t, st.DeadLetter(ctx, db.Pool, f, keytable.DeadLetter{RecoveryPoint: "started", Data: []byte(`{}`), LastError: "gave up", Stored: "started"}))
	row, err = st.Lookup(ctx, db.Pool, "s", "k")
	require.NoError(t, err)
	require.Equal(t, keytable.StatusDead, row.Status)
	require.Equal(t, "gave up", *row.LastError)
	require.False(t, row.LeaseLive)
	none, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Empty(t, none, "dead keys are not taken")

	_, err = st.Redrive(ctx, db.Pool, "s", "missing", keytable.History{})
	require.ErrorIs(t, err, keytable.ErrNotFound)
	red, err := st.Redrive(ctx, db.Pool, "s", "k", keytable.History{})
	require.NoError(t, err)
	require.Equal(t, keytable.StatusInProgress, red.Status)
	require.Equal(t, 0, red.Attempts)
	require.Equal(t, f.LockVersion+1, red.LockVersion)
	require.False(t, red.LeaseLive)
	_, err = st.Redrive(ctx, db.Pool, "s", "k", keytable.History{})
	require.ErrorIs(t, err, keytable.ErrNotFound, "only dead keys are re-driven")
	taken, err = st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Len(t, taken, 1, "due at once")
}

func TestExpireFinished(t *testing.T) { forEachScan(t, testExpireFinished) }

func testExpireFinished(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	finish := func(ago string) string {
		return `UPDATE idemflow_keys SET status = 'finished', recovery_point = 'finished', locked_until = NULL,
			response_status = 200, response_headers = '{}', response_body = '',
			finished_at = statement_timestamp() - interval '` + ago + `' WHERE idempotency_key = $1`
	}
	sweepRows(t, db, map[string][]string{
		"old1":    {finish("3 hours")},
		"old2":    {finish("2 hours")},
		"old3":    {finish("61 minutes")},
		"recent":  {finish("59 minutes")},
		"running": {`UPDATE idemflow_keys SET created_at = statement_timestamp() - interval '10 days' WHERE idempotency_key = $1`},
		"dead":    {released, `UPDATE idemflow_keys SET status = 'dead', created_at = statement_timestamp() - interval '10 days' WHERE idempotency_key = $1`},
	})
	_, err := st.ExpireFinished(ctx, db.Pool, time.Hour, 0)
	require.Error(t, err)

	n, err := st.ExpireFinished(ctx, db.Pool, time.Hour, 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT idempotency_key FROM idemflow_keys ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		left = append(left, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"dead", "old3", "recent", "running"}, left, "oldest first")

	n, err = st.ExpireFinished(ctx, db.Pool, time.Hour, 2)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "a short batch: nothing more is expired")
	n, err = st.ExpireFinished(ctx, db.Pool, time.Hour, 2)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestPark(t *testing.T) { forEachScan(t, testPark) }

func testPark(t *testing.T, st *keytable.Store) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	sweepRows(t, db, map[string][]string{"k": {released}})
	q := keytable.TakeDue{Limit: 1, Lease: time.Minute, Flows: []string{"f"}}
	taken, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Len(t, taken, 1)
	f := taken[0].Fence()

	require.NoError(t, st.Park(ctx, db.Pool, f, keytable.Park{LastError: "needs its client", RetryIn: time.Hour}))
	require.ErrorIs(t, st.Park(ctx, db.Pool, f, keytable.Park{LastError: "again", RetryIn: time.Hour}), keytable.ErrLeaseLost, "only a leased key is parked")
	row, err := st.Lookup(ctx, db.Pool, "s", "k")
	require.NoError(t, err)
	require.Equal(t, 1, row.Attempts, "the takeover's attempt is uncounted")
	require.False(t, row.LeaseLive)
	require.Equal(t, "needs its client", *row.LastError)
	none, err := st.TakeDue(ctx, db.Pool, q)
	require.NoError(t, err)
	require.Empty(t, none, "not due for an hour")
	_, err = st.Takeover(ctx, db.Pool, row.Fence(), time.Minute, 0)
	require.NoError(t, err, "a client's retry takes it over at once")
}

// forEachScan runs f, in parallel, on a Store of each scan: the single statements of
// plain PostgreSQL and the per-key statements of Citus.
func forEachScan(t *testing.T, f func(t *testing.T, st *keytable.Store)) {
	t.Parallel()
	for name, scan := range map[string]keytable.Scan{"Single": keytable.ScanSingle, "PerKey": keytable.ScanPerKey} {
		st, err := keytable.NewWith(keytable.Options{Scan: scan})
		require.NoError(t, err)
		t.Run(name, func(t *testing.T) {
			if scan == keytable.ScanSingle && pgtest.CitusMode() {
				t.Skip("skipped: Citus refuses the single statements (ctid) on a distributed key table")
			}
			f(t, st)
		})
	}
}
