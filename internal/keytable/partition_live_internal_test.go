package keytable

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestRemovePartitionsCheckReadsNoRow: the removal's check for keys that are not finished
// answers from two index probes and the status check constraint, without reading
// the partition (a seq scan of every row of a day past retention cost live traffic
// its share of the machine while it ran); once a newer release has widened the status
// check, it reads the table and finds a row of the new status; and it finds an
// unfinished and a dead-lettered key. The seq scans are the partition's own counter
// (pg_stat_user_tables), flushed by the checking connection itself.
func TestRemovePartitionsCheckReadsNoRow(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: this suite is built for plain PostgreSQL; on Citus TestPartitionsUnderTraffic covers the layout (docs/PARTITIONS.md)")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	require.NoError(t, s.SetupPartitioned(ctx, db.Pool, PartitionMinute, 3*time.Minute))
	var now time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', statement_timestamp())`).Scan(&now))
	from := now.Add(-47 * time.Minute) // a minute no other test of the package uses
	name := partitionName(from, time.Minute)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION `+name+` FOR VALUES FROM (`+boundLiteral(from)+`) TO (`+boundLiteral(from.Add(time.Minute))+`)`)
	require.NoError(t, err)
	insert := func(status string, n int) {
		t.Helper()
		fin := status == "finished"
		_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint,
	request_body, recovery_point, status, response_status, response_headers, response_body, created_at, finished_at)
SELECT 's', $1 || i, gen_random_uuid(), 'f', 'POST', '/r', sha256('x'), '', CASE WHEN $2 THEN 'finished' ELSE 'started' END,
	$1, CASE WHEN $2 THEN 200 END, CASE WHEN $2 THEN '{}'::jsonb END, CASE WHEN $2 THEN ''::bytea END,
	$3::timestamptz, CASE WHEN $2 THEN $3::timestamptz END
FROM generate_series(1, $4) AS i`, status, fin, from.Add(time.Second), n)
		require.NoError(t, err, status)
	}
	insert("finished", 20000)
	_, err = db.Pool.Exec(ctx, `ANALYZE `+name)
	require.NoError(t, err)
	l, err := s.layout(ctx, db.Pool)
	require.NoError(t, err)

	checker, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer checker.Close(ctx)
	// check runs holdsLiveKeys on the checker, and returns its answer and how many seq
	// scans of the partition it ran.
	check := func() (bool, int64) {
		t.Helper()
		scans := func() int64 {
			_, err := checker.Exec(ctx, `SELECT pg_stat_force_next_flush()`) // flushed as it goes idle
			require.NoError(t, err)
			var n int64
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE relid = to_regclass($1)`, l.ident(name)).Scan(&n))
			return n
		}
		before := scans()
		live, err := holdsLiveKeys(ctx, checker, l, name)
		require.NoError(t, err)
		return live, scans() - before
	}
	live, scans := check()
	require.False(t, live, "only finished keys")
	require.Zero(t, scans, "the check read no row")

	_, err = db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DROP CONSTRAINT idemflow_keys_status;
ALTER TABLE idemflow_keys ADD CONSTRAINT idemflow_keys_status CHECK (status IN ('in_progress', 'finished', 'dead', 'later'))`)
	require.NoError(t, err)
	live, scans = check()
	require.False(t, live, "still only finished keys")
	require.Positive(t, scans, "a widened check: the table is read")
	insert("later", 1)
	live, _ = check()
	require.True(t, live, "a key of a status a newer release wrote")

	_, err = db.Pool.Exec(ctx, `DELETE FROM idemflow_keys WHERE status = 'later'`)
	require.NoError(t, err)
	for _, status := range []string{"in_progress", "dead"} {
		insert(status, 1)
		live, _ = check()
		require.True(t, live, status)
		_, err = db.Pool.Exec(ctx, `DELETE FROM idemflow_keys WHERE status = $1`, status)
		require.NoError(t, err)
	}
}
