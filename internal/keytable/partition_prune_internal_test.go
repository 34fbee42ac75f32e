package keytable

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestPartitionedPruning runs EXPLAIN ANALYZE of every per-key statement on a key
// table partitioned by the minute, with generic plans forced (as pgx's prepared
// statements use after their fifth run): each statement that names a row by its fence
// reads one partition; the look-up reads the partitions newest first, those ahead
// included, stopping at the one that holds the key.
func TestPartitionedPruning(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: the coordinator's plan is a distributed one, and a Store does not address partitions by name there (learnAddress); TestPartitionsUnderTraffic checks a look-up runs on one shard")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	now, row, oldRow := prunedKeyTable(t, db, s)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)

	f := row.Fence()
	at, lv := f.CreatedAt, f.LockVersion
	fenced := map[string]struct {
		sql  string
		args []any
	}{
		"advance":   {s.sql.advance, []any{"s", "new", f.ID, lv, "one", "{}", 60000, at}},
		"finish":    {s.sql.finish, []any{"s", "new", f.ID, lv, 201, "{}", "ok", `{"a":1}`, 10, at}},
		"release":   {s.sql.release, []any{"s", "new", f.ID, lv, "one", "{}", "boom", 0, "started", `{"a":1}`, 10, at}},
		"takeover":  {s.sql.takeover, []any{"s", "new", f.ID, lv, 60000, 10, at}},
		"giveBack":  {s.sql.giveBack, []any{"s", "new", f.ID, lv, at}},
		"abandon":   {s.sql.abandon, []any{"s", "new", f.ID, lv, "why", `{"a":1}`, 10, at}},
		"park":      {s.sql.park, []any{"s", "new", f.ID, lv, "why", 1000, `{"a":1}`, 10, at}},
		"dead":      {s.sql.deadLetter, []any{"s", "new", f.ID, lv, "started", "{}", "why", "started", `{"a":1}`, 10, at}},
		"takeKey":   {s.sql.takeKey, []any{"s", "new", lv, 60000, 10, nil, at}},
		"expireKey": {s.admin.expireParkedKey, []any{"s", []string{"new"}, 0, at, at}},
		"cancel":    {s.admin.cancel, []any{"s", "new", f.ID, lv, "started", 200, "{}", "x", `{"a":1}`, 10, at}},
	}
	for name, st := range fenced {
		scanned, removed := explainPartitions(t, conn, name, st.sql, st.args)
		require.Equal(t, []string{partitionName(now, time.Minute)}, scanned, "%s reads the row's partition only", name)
		require.Positive(t, removed, "%s: the other partitions are pruned at executor start-up", name)
	}

	look := s.lookupSQL()
	require.Equal(t, s.sql.lookupPartitioned, look, "CheckPartitions taught the Store its layout")
	// The look-up does not read the clock (a row ahead of it must be found: docs/
	// PARTITIONS.md, "A clock that steps back"), so it reads the partitions ahead,
	// empty, then the others newest first, and stops at the key's.
	parts, err := s.Partitions(ctx, db.Pool)
	require.NoError(t, err)
	var newestFirst []string
	for _, p := range slices.Backward(parts) {
		newestFirst = append(newestFirst, p.Name)
	}
	upTo := func(name string) []string {
		i := slices.Index(newestFirst, name)
		require.GreaterOrEqual(t, i, 3, "%s has three partitions ahead of it", name)
		return newestFirst[:i+1]
	}
	scanned, removed := explainPartitions(t, conn, "lookup new", look, []any{"s", "new"})
	require.Equal(t, upTo(partitionName(now, time.Minute)), scanned, "a recent key: the partitions ahead and its own, no older one")
	require.Zero(t, removed, "no partition is pruned by the clock")
	scanned, _ = explainPartitions(t, conn, "lookup old", look, []any{"s", "old"})
	require.Equal(t, upTo(partitionName(oldRow.CreatedAt.Truncate(time.Minute), time.Minute)), scanned,
		"an older key: the partitions from the newest back to its own (three minutes before now), newest first")
	scanned, _ = explainPartitions(t, conn, "lookup missing", look, []any{"s", "missing"})
	require.Equal(t, newestFirst, scanned, "a new key: every partition")
}

// prunedKeyTable partitions db's key table by the minute, with three partitions ahead
// and four in the past, and inserts two unfinished keys leased by no one: "new" in the
// current partition (row) and "old" three minutes back (oldRow). now is the current
// minute.
func prunedKeyTable(t *testing.T, db *pgtest.DB, s *Store) (now time.Time, row, oldRow *Row) {
	t.Helper()
	ctx := context.Background()
	// What each statement reads depends on which minute of the database clock it runs
	// in, and the test takes a second or two: when less than 15 s of the current minute
	// are left, it starts at the top of the next one (a CI run crossed a minute between
	// creating the partitions and reading the minute, and met its own partition again).
	_, err := db.Pool.Exec(ctx, `SELECT pg_sleep(60 - extract(second FROM clock_timestamp()))
WHERE extract(second FROM clock_timestamp()) > 45`)
	require.NoError(t, err)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', statement_timestamp())`).Scan(&now))
	require.NoError(t, s.SetupPartitioned(ctx, db.Pool, PartitionMinute, 3*time.Minute))
	for i := 1; i <= 4; i++ { // four partitions in the past
		name := partitionName(now.Add(-time.Duration(i)*time.Minute), time.Minute)
		_, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idemflow_keys ATTACH PARTITION `+name+` FOR VALUES FROM (`+boundLiteral(now.Add(-time.Duration(i)*time.Minute))+`) TO (`+
			boundLiteral(now.Add(-time.Duration(i-1)*time.Minute))+`)`)
		require.NoError(t, err)
	}
	rep, err := s.CheckPartitions(ctx, db.Pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, rep.Ahead, 3)
	// Two keys: "new" in the current partition, "old" three minutes back; both
	// unfinished, leased by no one.
	for key, at := range map[string]string{"new": "statement_timestamp()", "old": boundLiteral(now.Add(-150 * time.Second))} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at, locked_until)
VALUES ('s', $1, gen_random_uuid(), 'f', 'POST', '/r', sha256('req'), '{}', `+at+`, statement_timestamp() - interval '1 hour')`, key)
		require.NoError(t, err)
	}
	row, err = s.Lookup(ctx, db.Pool, "s", "new")
	require.NoError(t, err)
	oldRow, err = s.Lookup(ctx, db.Pool, "s", "old")
	require.NoError(t, err)
	require.True(t, oldRow.CreatedAt.Before(now), "the old key sits in a past partition")

	return now, row, oldRow
}

// partitionScan matches a scan of one partition in a plan's text.
var partitionScan = regexp.MustCompile(`Scan.* on (idemflow_keys_p\d+)`)

// explainPartitions prepares sql on conn, runs EXPLAIN ANALYZE of its execution with
// args (in a transaction it rolls back) and returns the partitions the plan scanned
// (each once), in the plan's order, and how many subplans were removed at executor start-up.
func explainPartitions(t *testing.T, conn *pgxpool.Conn, name, sql string, args []any) ([]string, int) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `PREPARE prune_stmt AS `+sql)
	require.NoError(t, err, name)
	defer conn.Exec(ctx, `DEALLOCATE prune_stmt`) //nolint:errcheck // after the rollback
	lits := make([]string, len(args))
	for i, a := range args {
		lits[i] = sqlLiteral(a)
	}
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE prune_stmt(`+strings.Join(lits, ", ")+`)`)
	require.NoError(t, err, name)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err(), name)
	var scanned []string
	removed := 0
	for _, line := range plan {
		if m := partitionScan.FindStringSubmatch(line); m != nil && !strings.Contains(line, "never executed") && !slices.Contains(scanned, m[1]) {
			scanned = append(scanned, m[1])
		}
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "Subplans Removed: %d", &n); err == nil {
			removed += n
		}
	}
	t.Logf("%s:\n%s", name, strings.Join(plan, "\n"))
	return scanned, removed
}

// sqlLiteral writes a as an SQL literal for EXECUTE, whose parameters' types the
// prepared statement fixed.
func sqlLiteral(a any) string {
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	switch v := a.(type) {
	case nil:
		return "NULL"
	case int, int64:
		return fmt.Sprint(v)
	case time.Time:
		return quote(v.UTC().Format(time.RFC3339Nano))
	case []string:
		return quote("{" + strings.Join(v, ",") + "}")
	case []time.Time:
		parts := make([]string, len(v))
		for i, tm := range v {
			parts[i] = `"` + tm.UTC().Format(time.RFC3339Nano) + `"`
		}
		return quote("{" + strings.Join(parts, ",") + "}")
	default:
		return quote(fmt.Sprint(v))
	}
}
