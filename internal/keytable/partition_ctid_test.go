package keytable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// partitionedCopy replaces the test schema's key table with a copy range-partitioned by
// created_at, in two partitions: idemflow_keys_old before 2026-01-01, idemflow_keys_new
// from then on. It is built with plain SQL, not with the Store's own set-up, so that it
// shows what today's statements do on any partitioned key table.
func partitionedCopy(t *testing.T, db *pgtest.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
ALTER TABLE idemflow_keys RENAME TO idemflow_keys_plain;
CREATE TABLE idemflow_keys (LIKE idemflow_keys_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
	PARTITION BY RANGE (created_at);
ALTER TABLE idemflow_keys ADD PRIMARY KEY (scope, idempotency_key, created_at);
CREATE INDEX ON idemflow_keys (next_attempt_at) WHERE status = 'in_progress';
CREATE INDEX ON idemflow_keys (finished_at) WHERE status = 'finished';
CREATE INDEX ON idemflow_keys (created_at) WHERE status = 'dead';
CREATE TABLE idemflow_keys_old (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION idemflow_keys_old FOR VALUES FROM (MINVALUE) TO ('2026-01-01 00:00+00');
CREATE TABLE idemflow_keys_new (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION idemflow_keys_new FOR VALUES FROM ('2026-01-01 00:00+00') TO (MAXVALUE);
DROP TABLE idemflow_keys_plain;`)
	require.NoError(t, err)
}

// insertRaw inserts an unfinished key row of scope "s" created at createdAt (an SQL
// expression), then applies set (an SQL SET list, or "") to it.
func insertRaw(t *testing.T, db *pgtest.DB, key, id, flow, createdAt, set string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at)
VALUES ('s', $1, $2::uuid, $3, 'POST', '/r', sha256('req'), '{}', `+createdAt+`)`, key, id, flow)
	require.NoError(t, err, key)
	if set != "" {
		_, err = db.Pool.Exec(ctx, `UPDATE idemflow_keys SET `+set+` WHERE idempotency_key = $1`, key)
		require.NoError(t, err, key)
	}
}

// ctidOf returns the partition and ctid of key's row.
func ctidOf(t *testing.T, db *pgtest.DB, key string) string {
	t.Helper()
	var where string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT tableoid::regclass::text || ' ' || ctid::text FROM idemflow_keys WHERE idempotency_key = $1`, key).Scan(&where))
	return where
}

const (
	finishedSet = `status = 'finished', recovery_point = 'finished', locked_until = NULL, response_status = 200,
	response_headers = '{}', response_body = '', request_body = ''`
	releasedSet = `locked_until = NULL, next_attempt_at = statement_timestamp() - interval '1 second'`
)

// TestPartitionedSameCtid puts two keys at the same ctid in two partitions of a
// partitioned key table, one that a sweep or expiry must act on and one it must leave
// alone, and checks that each acts on its own key only (issue 28: on a partitioned
// table ctid is unique only within a partition). A Store with the automatic scan and
// one with ScanPerKey are checked.
func TestPartitionedSameCtid(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the partitioned copy is built for plain PostgreSQL")
	}
	for name, scan := range map[string]keytable.Scan{"Auto": keytable.ScanAuto, "PerKey": keytable.ScanPerKey} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			t.Run("ExpireFinished", func(t *testing.T) { testSameCtidExpireFinished(t, scan) })
			t.Run("TakeDue", func(t *testing.T) { testSameCtidTakeDue(t, scan) })
			t.Run("ExpireParked", func(t *testing.T) { testSameCtidExpireParked(t, scan) })
		})
	}
}

func newScanStore(t *testing.T, scan keytable.Scan) *keytable.Store {
	t.Helper()
	st, err := keytable.NewWith(keytable.Options{Scan: scan})
	require.NoError(t, err)
	return st
}

// requireSameCtid checks that the keys a and b sit at the same ctid in different
// partitions: the set-up the test depends on.
func requireSameCtid(t *testing.T, db *pgtest.DB, a, b string) {
	t.Helper()
	wa, wb := ctidOf(t, db, a), ctidOf(t, db, b)
	t.Logf("%s at %s, %s at %s", a, wa, b, wb)
	require.Equal(t, wa[len("idemflow_keys_old"):], wb[len("idemflow_keys_new"):], "same ctid")
	require.NotEqual(t, wa[:len("idemflow_keys_old")], wb[:len("idemflow_keys_new")], "different partitions")
}

// An expired finished key in the old partition, and one finished a second ago at the
// same ctid in the new one: expiry deletes the first only. Deleting the second would
// let its retry claim the key again with a new row id, so a new derived key: a second
// charge.
func testSameCtidExpireFinished(t *testing.T, scan keytable.Scan) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	partitionedCopy(t, db)
	insertRaw(t, db, "expired", "00000000-0000-4000-8000-000000000001", "f", `'2025-12-30 00:00+00'`,
		finishedSet+`, finished_at = '2025-12-30 00:00:01+00'`)
	insertRaw(t, db, "recent", "00000000-0000-4000-8000-000000000002", "f", `now()`,
		finishedSet+`, finished_at = statement_timestamp() - interval '1 second'`)
	requireSameCtid(t, db, "expired", "recent")

	n, err := newScanStore(t, scan).ExpireFinished(ctx, db.Pool, 24*time.Hour, 10)
	require.NoError(t, err)
	_, err = keytable.New().Lookup(ctx, db.Pool, "s", "recent")
	require.NoError(t, err, "the key finished a second ago is still there")
	_, err = keytable.New().Lookup(ctx, db.Pool, "s", "expired")
	require.ErrorIs(t, err, keytable.ErrNotFound, "the expired key is deleted")
	require.EqualValues(t, 1, n)
}

// A due key of the old partition, and a key at the same ctid in the new one that was
// released a moment after its claim (inside the grace period, its client about to
// retry): a sweep takes the first only.
func testSameCtidTakeDue(t *testing.T, scan keytable.Scan) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	partitionedCopy(t, db)
	insertRaw(t, db, "due", "00000000-0000-4000-8000-000000000001", "f", `'2025-12-30 00:00+00'`, releasedSet)
	insertRaw(t, db, "in-grace", "00000000-0000-4000-8000-000000000002", "f", `now()`, releasedSet)
	requireSameCtid(t, db, "due", "in-grace")

	taken, err := newScanStore(t, scan).TakeDue(ctx, db.Pool,
		keytable.TakeDue{Limit: 10, Grace: time.Minute, Lease: time.Minute, Flows: []string{"f"}})
	require.NoError(t, err)
	require.Equal(t, []string{"due"}, takenKeys(taken), "only the due key is taken")
	row, err := keytable.New().Lookup(ctx, db.Pool, "s", "in-grace")
	require.NoError(t, err)
	require.EqualValues(t, 1, row.LockVersion, "the key in its grace period is not taken over")
	require.False(t, row.LeaseLive)
}

// A parked key of a client-only flow "c" in the old partition, and an unfinished key of
// the server-side flow "f" at the same ctid in the new one, released two hours ago for
// a sweeper to finish: the parked key's expiry deletes the first only. Deleting the
// second loses a charge half done: its retry would run it again under a new row id.
func testSameCtidExpireParked(t *testing.T, scan keytable.Scan) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	partitionedCopy(t, db)
	insertRaw(t, db, "parked", "00000000-0000-4000-8000-000000000001", "c", `'2025-12-30 00:00+00'`, releasedSet)
	insertRaw(t, db, "unfinished", "00000000-0000-4000-8000-000000000002", "f", `now() - interval '2 hours'`, releasedSet)
	requireSameCtid(t, db, "parked", "unfinished")

	n, err := newScanStore(t, scan).ExpireParked(ctx, db.Pool, []string{"c"}, time.Hour, 10)
	require.NoError(t, err)
	_, err = keytable.New().Lookup(ctx, db.Pool, "s", "unfinished")
	require.NoError(t, err, "the unfinished key of another flow is still there")
	_, err = keytable.New().Lookup(ctx, db.Pool, "s", "parked")
	require.ErrorIs(t, err, keytable.ErrNotFound, "the parked key is deleted")
	require.EqualValues(t, 1, n)
}

// TestPartitionedRefusesScanSingle: a Store told to sweep by ctid refuses to on a
// partitioned key table, and changes nothing.
func TestPartitionedRefusesScanSingle(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the partitioned copy is built for plain PostgreSQL")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	partitionedCopy(t, db)
	insertRaw(t, db, "expired", "00000000-0000-4000-8000-000000000001", "f", `'2025-12-30 00:00+00'`,
		finishedSet+`, finished_at = '2025-12-30 00:00:01+00'`)
	insertRaw(t, db, "due", "00000000-0000-4000-8000-000000000002", "f", `'2025-12-30 00:00+00'`, releasedSet)
	st := newScanStore(t, keytable.ScanSingle)

	_, err := st.ExpireFinished(ctx, db.Pool, time.Hour, 10)
	require.ErrorIs(t, err, keytable.ErrScanSingleOnPartitioned)
	_, err = st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: 10, Lease: time.Minute, Flows: []string{"f"}})
	require.ErrorIs(t, err, keytable.ErrScanSingleOnPartitioned)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE lock_version = 1`).Scan(&n))
	require.Equal(t, 2, n, "both keys still there, neither taken over")
}

// TestPartitionedAfterLearningPlain: a Store that learnt the plain layout (and so
// sweeps by ctid) before the table was partitioned, as a process left running across
// a move would: its sweeps match no row of the partitioned table, rather than the row
// at the same ctid in another partition.
func TestPartitionedAfterLearningPlain(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the partitioned copy is built for plain PostgreSQL")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	st := newScanStore(t, keytable.ScanAuto)
	n, err := st.ExpireFinished(ctx, db.Pool, time.Hour, 10) // learns: plain, ScanSingle
	require.NoError(t, err)
	require.Zero(t, n)

	partitionedCopy(t, db)
	insertRaw(t, db, "expired", "00000000-0000-4000-8000-000000000001", "f", `'2025-12-30 00:00+00'`,
		finishedSet+`, finished_at = '2025-12-30 00:00:01+00'`)
	insertRaw(t, db, "recent", "00000000-0000-4000-8000-000000000002", "f", `now()`,
		finishedSet+`, finished_at = statement_timestamp() - interval '1 second'`)
	insertRaw(t, db, "due", "00000000-0000-4000-8000-000000000003", "f", `'2025-12-30 00:00+00'`, releasedSet)
	insertRaw(t, db, "in-grace", "00000000-0000-4000-8000-000000000004", "f", `now()`, releasedSet)
	requireSameCtid(t, db, "expired", "recent")

	n, err = st.ExpireFinished(ctx, db.Pool, 24*time.Hour, 10)
	require.NoError(t, err)
	require.Zero(t, n, "nothing deleted by ctid")
	taken, err := st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: 10, Grace: time.Minute, Lease: time.Minute, Flows: []string{"f"}})
	require.NoError(t, err)
	require.Empty(t, taken, "nothing taken by ctid")
	for _, key := range []string{"expired", "recent", "due", "in-grace"} {
		row, err := keytable.New().Lookup(ctx, db.Pool, "s", key)
		require.NoError(t, err, key)
		require.EqualValues(t, 1, row.LockVersion, key)
	}
}
