package keytable

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The key table's secondary indexes are partial, one per status a statement looks
// for across keys (docs/OPERATIONS.md, "What a key row costs"): the sweeper's and
// the parked expiry's unfinished keys by due time (due), retention's and the finished
// list's finished keys by finish (finished), and the dead-lettered keys by creation
// (dead). These tests pin both sides: every statement that reads across keys gets the
// index of its status, and a row enters only the index of its status (besides the
// primary key), which is what a finish, never HOT on PostgreSQL 15, pays for.

// TestIndexPlans plans every statement that reads across keys with sequential scans
// off and generic plans forced (as pgx's prepared statements use after their fifth
// run): each reads the partial index of its status. A row missing from the index a
// statement needs (a predicate that leaves it out) leaves the statement a sequential
// scan, which fails here.
func TestIndexPlans(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: a distributed statement's plan is the coordinator's (the shards' indexes are the same)")
	}
	onEachLayout(t, func(t *testing.T, db *pgtest.DB, s *Store, partitioned bool) {
		ctx := context.Background()
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
		require.NoError(t, err)
		checkIndexPlans(t, conn, s, partitioned)
	})
}

// onEachLayout runs f as a parallel subtest on a fresh key table of each layout: plain,
// and partitioned by the day (the default week ahead), with a Store of its own.
func onEachLayout(t *testing.T, f func(t *testing.T, db *pgtest.DB, s *Store, partitioned bool)) {
	for _, layout := range []string{"Plain", "Partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			s := New()
			if layout == "Partitioned" {
				require.NoError(t, s.SetupPartitioned(context.Background(), db.Pool, PartitionDay, 0))
			}
			f(t, db, s, layout == "Partitioned")
		})
	}
}

// checkIndexPlans is TestIndexPlans on one layout: on the partitioned one, each
// partition's copy of the index (named by PostgreSQL after its columns).
func checkIndexPlans(t *testing.T, conn *pgxpool.Conn, s *Store, partitioned bool) {
	flows := []string{"f"}
	list := func(status string) string { return s.admin.list[status][0] }
	cases := []struct {
		name, index, sql string
		args             []any
	}{
		{"takeDue", "due", s.sql.takeDue, []any{10, 0, 60000, flows, 10, nil, 0.0}},
		{"takeDue from a later start", "due", s.sql.takeDue, []any{10, 0, 60000, flows, 10, nil, 0.5}},
		{"scanDue", "due", s.sql.scanDue, []any{10, 0, flows, nil, 0.0}},
		{"scanDue from a later start", "due", s.sql.scanDue, []any{10, 0, flows, nil, 0.5}},
		{"expireParked", "due", s.admin.expireParked, []any{0, 10, flows}},
		{"scanParked", "due", s.admin.scanParked, []any{flows, 10, 0}},
		{"list in_progress", "due", list(StatusInProgress), []any{"", "", 0, 10}},
		{"list stuck", "due", list(statusStuck), []any{"", "", 0, 10}},
		{"expire", "finished", s.sql.expire, []any{0, 10}},
		{"scanFinished", "finished", s.sql.scanFinished, []any{0, 10}},
		{"list finished", "finished", list(StatusFinished), []any{"", "", 0, 10}},
		{"expireDead", "dead", s.admin.expireDead, []any{0, 10}},
		{"scanDead", "dead", s.admin.scanDead, []any{0, 10}},
		{"list dead", "dead", list(StatusDead), []any{"", "", 0, 10}},
		// RemovePartitions' probes (holdsLiveKeysProbe), on the table itself.
		{"probe in_progress", "due", `SELECT EXISTS (SELECT 1 FROM idemflow_keys WHERE status = 'in_progress')`, nil},
		{"probe dead", "dead", `SELECT EXISTS (SELECT 1 FROM idemflow_keys WHERE status = 'dead')`, nil},
	}
	// A partition's copy of an index is named after the partition and the columns.
	column := map[string]string{"due": "next_attempt_at", "finished": "finished_at", "dead": "created_at"}
	for _, c := range cases {
		plan := explainPlan(t, conn, c.name, c.sql, c.args)
		index := "idemflow_keys_" + c.index + "_idx"
		if partitioned {
			index = "_" + column[c.index] + "_idx"
		}
		require.Contains(t, plan, index, "%s reads the %s index:\n%s", c.name, c.index, plan)
		require.NotContains(t, plan, "Seq Scan", "%s reads no key table or partition whole", c.name)
	}
}

// explainPlan prepares sql on conn and returns the plan of its execution with args,
// without running it, with sequential scans off (in a transaction it rolls back).
func explainPlan(t *testing.T, conn *pgxpool.Conn, name, sql string, args []any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE plan_stmt AS `+sql)
	require.NoError(t, err, name)
	defer conn.Exec(ctx, `DEALLOCATE plan_stmt`) //nolint:errcheck // after the rollback
	execute := `EXECUTE plan_stmt`
	if len(args) > 0 {
		lits := make([]string, len(args))
		for i, a := range args {
			lits[i] = sqlLiteral(a)
		}
		execute += `(` + strings.Join(lits, ", ") + `)`
	}
	rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) `+execute)
	require.NoError(t, err, name)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err, name)
	return strings.Join(lines, "\n")
}

// TestIndexEntries reads, with pg_walinspect, which of the key table's indexes each
// write of a key row inserts an entry into: the primary key and the index of the row's
// new status, no other. A finish is never HOT (it changes status), so PostgreSQL 15
// inserts the new row version into every index whose predicate it satisfies: an index
// that finished rows entered without a statement needing it would cost every finish
// its WAL (about 70 bytes) and its CPU.
func TestIndexEntries(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the shards' WAL is the workers'")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	walinspect := walInspectSchema(t, db.Pool)
	s := New()
	indexes := keyIndexes(t, db.Pool)
	require.ElementsMatch(t, []string{"idemflow_keys_pkey", "idemflow_keys_due_idx", "idemflow_keys_finished_idx", "idemflow_keys_dead_idx"},
		slices.Collect(maps.Keys(indexes)), "the key table's indexes: a new one belongs in this test")

	entries := func(name string, write func()) []string {
		t.Helper()
		return btreeEntries(t, db.Pool, walinspect, indexes, name, write)
	}

	claim := func(key string) Fence {
		c := Claim{Scope: "s", Key: key, ID: newID(t, db.Pool), Flow: "f", Method: "POST", Route: "/r",
			Fingerprint: make([]byte, 32), Body: []byte(`{}`), Lease: time.Minute}
		var f Fence
		require.Equal(t, []string{"idemflow_keys_due_idx", "idemflow_keys_pkey"}, entries("claim "+key, func() {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			b := &pgx.Batch{}
			q := s.QueueKeyWrite(b, KeyWrite{Claim: &c, RecoveryPoint: "one", Data: []byte(`{}`)})
			br := tx.SendBatch(ctx, b)
			at, err := q.Read(br)
			require.NoError(t, err)
			require.NoError(t, br.Close())
			require.NoError(t, tx.Commit(ctx))
			f = Fence{Scope: "s", Key: key, ID: c.ID, LockVersion: 1, CreatedAt: at}
		}), "an unfinished row: the primary key and the due index")
		return f
	}
	resp := StoredResponse{Status: 201, Headers: []byte(`{}`), Body: []byte(`ok`),
		History: History{Entry: []byte(`{"attempt":1,"outcome":"finished"}`), Keep: 10}}

	f := claim("finished")
	require.Equal(t, []string{"idemflow_keys_finished_idx", "idemflow_keys_pkey"}, entries("finish", func() {
		b := &pgx.Batch{}
		q := s.QueueKeyWrite(b, KeyWrite{Fence: f, Response: &resp})
		br := db.Pool.SendBatch(ctx, b)
		_, err := q.Read(br)
		require.NoError(t, err)
		require.NoError(t, br.Close())
	}), "a finish: the primary key and the retention index, no other")

	f = claim("dead")
	require.Equal(t, []string{"idemflow_keys_dead_idx", "idemflow_keys_pkey"}, entries("dead-letter", func() {
		require.NoError(t, s.DeadLetter(ctx, db.Pool, f, DeadLetter{RecoveryPoint: "one", Data: []byte(`{}`), LastError: "why", Stored: "one"}))
	}), "a dead-letter: the primary key and the dead index")

	require.Equal(t, []string{"idemflow_keys_finished_idx", "idemflow_keys_pkey"}, entries("insert finished", func() {
		c := Claim{Scope: "s", Key: "one-tx", ID: newID(t, db.Pool), Flow: "f", Method: "POST", Route: "/r",
			Fingerprint: make([]byte, 32), Body: []byte(`{}`), Lease: time.Minute}
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		b := &pgx.Batch{}
		q := s.QueueKeyWrite(b, KeyWrite{Claim: &c, Response: &resp})
		br := tx.SendBatch(ctx, b)
		_, err = q.Read(br)
		require.NoError(t, err)
		require.NoError(t, br.Close())
		require.NoError(t, tx.Commit(ctx))
	}), "a key finished by its first transaction: the primary key and the retention index")
}

// btreeEntries runs write and returns, sorted, the key table's indexes (by name; the
// values of indexes are their relfilenodes) that the WAL written meanwhile touched.
func btreeEntries(t *testing.T, pool *pgxpool.Pool, walinspect string, indexes map[string]string, name string, write func()) []string {
	ctx := context.Background()
	t.Helper()
	var start, end string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start))
	write()
	// The write committed, so its WAL is flushed up to here.
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&end))
	rows, err := pool.Query(ctx, `SELECT coalesce(block_ref, '') FROM `+walinspect+`.pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
WHERE resource_manager = 'Btree'`, start, end)
	require.NoError(t, err, name)
	refs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err, name)
	var touched []string
	for index, node := range indexes {
		re := regexp.MustCompile(`/` + node + `\b`)
		for _, ref := range refs {
			if re.MatchString(ref) {
				touched = append(touched, index)
				break
			}
		}
	}
	slices.Sort(touched)
	return touched
}

// walInspectSchema returns the schema of the pg_walinspect extension, created in
// public when missing; the test is skipped where it cannot be (not a superuser, or
// PostgreSQL before 15).
func walInspectSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	var schema string
	err := pool.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&schema)
	if err == nil {
		return schema
	}
	require.ErrorIs(t, err, pgx.ErrNoRows)
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public`); err != nil {
		t.Skipf("skipped: pg_walinspect: %v", err)
	}
	return "public"
}

// keyIndexes returns the key table's indexes (in the pool's search_path) by name,
// each with its relation's file node, as WAL records name blocks.
func keyIndexes(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname::text, pg_relation_filenode(c.oid)::text
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'idemflow_keys'::regclass`)
	require.NoError(t, err)
	out := map[string]string{}
	var name, node string
	_, err = pgx.ForEachRow(rows, []any{&name, &node}, func() error {
		out[name] = node
		return nil
	})
	require.NoError(t, err)
	return out
}

// newID is a fresh UUID from the database.
func newID(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var id string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT gen_random_uuid()::text`).Scan(&id))
	return id
}

// TestPerKeyPlans: every statement on one key row (or on some keys of one scope) that
// names an unfinished status reads its rows by the primary key, never through the due
// index, even when the table's statistics say no key is unfinished while thousands
// are: the statistics of a table whose keys mostly finished (the steady state), met by
// a backlog after an outage. Written as `status = 'in_progress'`, the planner found
// the due index's predicate implied, took the index for empty and read every
// unfinished key for each statement (rowStatus).
func TestPerKeyPlans(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: a distributed statement's plan is the coordinator's (the shards' indexes are the same)")
	}
	onEachLayout(t, func(t *testing.T, db *pgtest.DB, s *Store, partitioned bool) {
		ctx := context.Background()
		if partitioned {
			_, err := s.CheckPartitions(ctx, db.Pool)
			require.NoError(t, err)
		}
		// Statistics that see finished keys only, then a backlog they do not see (below
		// autovacuum's analyze threshold: 50 and a tenth of the rows).
		_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint,
	request_body, status, recovery_point, response_status, response_headers, response_body, finished_at, locked_until)
SELECT 's' || (i % 8), 'done' || i, gen_random_uuid(), 'f', 'POST', '/r', sha256(i::text::bytea), '', 'finished', 'finished',
	201, '{}', 'x', statement_timestamp(), NULL FROM generate_series(1, 20000) i`)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `ANALYZE idemflow_keys`)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint,
	request_body, locked_until, next_attempt_at)
SELECT 'b' || (i % 8), 'stuck' || i, gen_random_uuid(), 'f', 'POST', '/r', sha256(i::text::bytea), '{}',
	statement_timestamp() - interval '1 minute', statement_timestamp() - interval '1 minute' FROM generate_series(1, 1500) i`)
		require.NoError(t, err)
		row, err := s.Lookup(ctx, db.Pool, "b7", "stuck7")
		require.NoError(t, err)
		f, at, lv := row.Fence(), row.CreatedAt, row.LockVersion
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
			require.NoError(t, err)
			checkPerKeyPlans(t, conn, s, f, at, lv, mode)
		}
	})
}

// checkPerKeyPlans is TestPerKeyPlans in one plan cache mode, for the key of fence f.
func checkPerKeyPlans(t *testing.T, conn *pgxpool.Conn, s *Store, f Fence, at time.Time, lv int64, mode string) {
	t.Helper()
	sc, k, id := f.Scope, f.Key, f.ID
	cases := map[string]struct {
		sql  string
		args []any
	}{
		"advance":         {s.sql.advance, []any{sc, k, id, lv, "one", "{}", 60000, at}},
		"finish":          {s.sql.finish, []any{sc, k, id, lv, 201, "{}", "ok", `[{"a":1}]`, 10, at}},
		"release":         {s.sql.release, []any{sc, k, id, lv, "one", "{}", "boom", 0, "started", `[{"a":1}]`, 10, at}},
		"takeover":        {s.sql.takeover, []any{sc, k, id, lv, 60000, 10, at}},
		"giveBack":        {s.sql.giveBack, []any{sc, k, id, lv, at}},
		"abandon":         {s.sql.abandon, []any{sc, k, id, lv, "why", `[{"a":1}]`, 10, at}},
		"park":            {s.sql.park, []any{sc, k, id, lv, "why", 1000, `[{"a":1}]`, 10, at}},
		"dead":            {s.sql.deadLetter, []any{sc, k, id, lv, "started", "{}", "why", "started", `[{"a":1}]`, 10, at}},
		"pipeFence":       {s.pipe.fence, []any{sc, k, id, lv, at}},
		"check":           {s.pipe.check, []any{sc, k, id, lv, at}},
		"pipeAdvance":     {s.pipe.advance, []any{sc, k, id, lv, at, "one", "{}", 60000}},
		"pipeFinish":      {s.pipe.finish, []any{sc, k, id, lv, at, 201, "{}", "ok", `[{"a":1}]`, 10}},
		"takeKey":         {s.sql.takeKey, []any{sc, k, lv, 60000, 10, nil, at}},
		"operatorRelease": {s.admin.release, []any{sc, k, 10}},
		"bulkRelease":     {s.admin.bulkRelease, []any{sc, k, 10, "", "", "", ""}},
		"expireParkedKey": {s.admin.expireParkedKey, []any{sc, []string{k}, 0, at, at}},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		c := cases[name]
		plan := explainPlan(t, conn, name, s.onPartition(c.sql, at), c.args)
		require.Regexp(t, `(?m)Index (Only )?Scan using \S*pkey`, plan, "%s (%s) reads its row by the primary key:\n%s", name, mode, plan)
		require.NotRegexp(t, `(?m)(due|next_attempt_at)_idx`, plan, "%s (%s) does not read the due index:\n%s", name, mode, plan)
	}
}
