package keytable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// addressedTable is a key table partitioned by the minute, with partitions three
// minutes ahead and four in the past, a Store that has learnt it, and two unfinished
// keys: "new" created now and "old" three minutes back.
func addressedTable(t *testing.T) (*pgtest.DB, *Store, time.Time) {
	t.Helper()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: a Store does not address partitions by name there (learnAddress), which is what this suite checks")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	// Start far enough from the end of a minute that the test stays in it.
	_, err := db.Pool.Exec(ctx, `SELECT pg_sleep(60 - extract(second FROM clock_timestamp()))
WHERE extract(second FROM clock_timestamp()) > 45`)
	require.NoError(t, err)
	var now time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', statement_timestamp())`).Scan(&now))
	require.NoError(t, s.SetupPartitioned(ctx, db.Pool, PartitionMinute, 3*time.Minute))
	for i := 1; i <= 4; i++ {
		from := now.Add(-time.Duration(i) * time.Minute)
		// Two statements: Citus refuses to attach a table in the string that created it.
		_, err := db.Pool.Exec(ctx, `CREATE TABLE `+partitionName(from, time.Minute)+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys ATTACH PARTITION `+partitionName(from, time.Minute)+
			` FOR VALUES FROM (`+boundLiteral(from)+`) TO (`+boundLiteral(from.Add(time.Minute))+`)`)
		require.NoError(t, err)
	}
	_, err = s.CheckPartitions(ctx, db.Pool)
	require.NoError(t, err)
	for key, at := range map[string]string{"new": "statement_timestamp()", "old": boundLiteral(now.Add(-150 * time.Second))} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at, locked_until)
VALUES ('s', $1, gen_random_uuid(), 'f', 'POST', '/r', sha256('req'), '{}', `+at+`, statement_timestamp() + interval '1 hour')`, key)
		require.NoError(t, err)
	}
	return db, s, now
}

// keyTableLocks runs sql with args in a transaction on conn (rolled back) and returns
// the key table's relations (the table, its partitions, their indexes) the
// transaction then holds a lock on.
func keyTableLocks(t *testing.T, conn *pgxpool.Conn, sql string, args []any) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND c.relname LIKE 'idemflow\_keys%' ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// TestPartitionAddressed: once a Store has learnt a partitioned key table, every
// fenced statement it sends names the row's partition and touches that partition
// alone (its locks, generic plans forced as pgx's cached statements get them: the
// same statement sent to the key table locks every partition), and the Store's
// methods keep their answers.
func TestPartitionAddressed(t *testing.T) {
	t.Parallel()
	db, s, now := addressedTable(t)
	ctx := context.Background()
	row, err := s.Lookup(ctx, db.Pool, "s", "new")
	require.NoError(t, err)
	f, at, lv := row.Fence(), row.CreatedAt, row.LockVersion
	own := partitionName(now, time.Minute)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	fenced := map[string]struct {
		sql  string
		args []any
	}{
		"advance":  {s.sql.advance, []any{"s", "new", f.ID, lv, "one", "{}", 60000, at}},
		"finish":   {s.sql.finish, []any{"s", "new", f.ID, lv, 201, "{}", []byte("ok"), `{"a":1}`, 10, at}},
		"release":  {s.sql.release, []any{"s", "new", f.ID, lv, "one", "{}", "boom", 0, "started", `{"a":1}`, 10, at}},
		"takeover": {s.sql.takeover, []any{"s", "new", f.ID, lv, 60000, 10, at}},
		"giveBack": {s.sql.giveBack, []any{"s", "new", f.ID, lv, at}},
		"abandon":  {s.sql.abandon, []any{"s", "new", f.ID, lv, "why", `{"a":1}`, 10, at}},
		"park":     {s.sql.park, []any{"s", "new", f.ID, lv, "why", 1000, `{"a":1}`, 10, at}},
		"dead":     {s.sql.deadLetter, []any{"s", "new", f.ID, lv, "started", "{}", "why", "started", `{"a":1}`, 10, at}},
		// A pipelined phase's statements and a Go-code phase's fence check.
		"pipeFence":   {s.pipe.fence, []any{"s", "new", f.ID, lv, at}},
		"check":       {s.pipe.check, []any{"s", "new", f.ID, lv, at}},
		"pipeAdvance": {s.pipe.advance, []any{"s", "new", f.ID, lv, at, "one", "{}", 60000}},
		"pipeFinish":  {s.pipe.finish, []any{"s", "new", f.ID, lv, at, 201, "{}", []byte("ok"), `{"a":1}`, 10}},
	}
	for name, st := range fenced {
		sent := s.onPartition(st.sql, at)
		require.Contains(t, sent, `"`+own+`"`, "%s names the row's partition", name)
		require.NotContains(t, strings.ReplaceAll(sent, own, ""), keyTable, "%s does not name the key table", name)
		for range 6 { // past pgx's and PostgreSQL's custom-plan runs
			keyTableLocks(t, conn, sent, st.args)
		}
		for _, rel := range keyTableLocks(t, conn, sent, st.args) {
			require.True(t, strings.HasPrefix(rel, own), "%s locks %s: only the row's partition and its indexes", name, rel)
		}
		whole := keyTableLocks(t, conn, st.sql, st.args)
		require.Contains(t, whole, partitionName(now.Add(3*time.Minute), time.Minute), "%s sent to the key table locks the partitions ahead too", name)
	}

	// The methods answer as before: a fence that matches, one that does not.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	s.QueueKeyWrite(b, KeyWrite{Fence: f, RecoveryPoint: "one", Data: json.RawMessage(`{}`), Lease: time.Minute})
	b.Queue("COMMIT")
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	require.ErrorIs(t, s.Release(ctx, db.Pool, f, Release{RecoveryPoint: "one", Stored: "started"}), ErrLeaseLost, "the advance moved the recovery point")
	row, err = s.Lookup(ctx, db.Pool, "s", "new")
	require.NoError(t, err)
	require.Equal(t, "one", row.RecoveryPoint)
	_, err = s.Takeover(ctx, db.Pool, row.Fence(), time.Minute, 10)
	require.ErrorIs(t, err, ErrNotTaken, "the lease is live")
}

// TestPartitionAddressedLookup: Lookup outside a transaction asks the current
// partition first and every partition when the key is not there; in a transaction
// it asks the key table only (a failed statement would abort the caller's).
func TestPartitionAddressedLookup(t *testing.T) {
	t.Parallel()
	db, s, now := addressedTable(t)
	ctx := context.Background()
	require.Contains(t, s.currentPartitionLookup(db.Pool), `"`+partitionName(now, time.Minute)+`"`)
	for _, key := range []string{"new", "old"} {
		row, err := s.Lookup(ctx, db.Pool, "s", key)
		require.NoError(t, err, key)
		require.Equal(t, key, row.Key)
	}
	_, err := s.Lookup(ctx, db.Pool, "s", "missing")
	require.ErrorIs(t, err, ErrNotFound)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.Empty(t, s.currentPartitionLookup(tx), "in a transaction: the key table")
	_, err = s.Lookup(ctx, tx, "s", "old")
	require.NoError(t, err)
}

// TestPartitionAddressedGone: a fenced statement whose row's partition was dropped
// since the row was read answers ErrLeaseLost and commits nothing; one whose
// partition was detached finds no unfinished row there (removal detaches only
// partitions without one) and answers ErrLeaseLost too. The look-up of a key in a
// current partition dropped meanwhile looks in the key table.
func TestPartitionAddressedGone(t *testing.T) {
	t.Parallel()
	db, s, now := addressedTable(t)
	ctx := context.Background()
	old, err := s.Lookup(ctx, db.Pool, "s", "old")
	require.NoError(t, err)
	oldPart := partitionName(old.CreatedAt.Truncate(time.Minute), time.Minute)

	// Detached with the key finished (as removal would find it): nothing matches.
	_, err = db.Pool.Exec(ctx, `UPDATE idemflow_keys SET status = 'finished', recovery_point = 'finished', response_status = 200,
	response_headers = '{}', response_body = '', finished_at = now(), locked_until = NULL WHERE idempotency_key = 'old'`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+oldPart)
	require.NoError(t, err)
	require.ErrorIs(t, s.Release(ctx, db.Pool, old.Fence(), Release{RecoveryPoint: "x", Stored: "started"}), ErrLeaseLost)

	// Dropped: the statement fails before anything runs; the batch's transaction
	// commits nothing.
	_, err = db.Pool.Exec(ctx, `DROP TABLE `+oldPart)
	require.NoError(t, err)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`UPDATE idemflow_keys SET last_error = 'witness' WHERE idempotency_key = 'new'`)
	q := s.QueueKeyWrite(b, KeyWrite{Fence: old.Fence(), RecoveryPoint: "one", Data: json.RawMessage(`{}`), Lease: time.Minute})
	b.Queue("COMMIT")
	br := db.Pool.SendBatch(ctx, b)
	_, err = br.Exec() // pgx prepares the batch first: it fails there, before BEGIN runs
	if err == nil {
		_, err = br.Exec()
		_, werr := q.Read(br)
		err = errors.Join(err, werr)
	}
	_ = br.Close()
	err = Classify(err)
	require.ErrorIs(t, err, ErrLeaseLost, "a dropped partition is a lost lease")
	require.Contains(t, err.Error(), oldPart)
	var witness *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT last_error FROM idemflow_keys WHERE idempotency_key = 'new'`).Scan(&witness))
	require.Nil(t, witness, "the transaction committed nothing")
	_, err = s.Takeover(ctx, db.Pool, old.Fence(), time.Minute, 10)
	require.ErrorIs(t, err, ErrLeaseLost)

	// The current partition dropped (only a broken clock or a hand could): the
	// look-up falls back to the key table.
	_, err = db.Pool.Exec(ctx, `DELETE FROM idemflow_keys WHERE idempotency_key = 'new';
ALTER TABLE idemflow_keys DETACH PARTITION `+partitionName(now, time.Minute)+`;
DROP TABLE `+partitionName(now, time.Minute))
	require.NoError(t, err)
	_, err = s.Lookup(ctx, db.Pool, "s", "new")
	require.ErrorIs(t, err, ErrNotFound)
}

// TestPartitionAddressedInsert: a held claim's insert whose created_at is known (the
// claim lock read it in the same transaction) is sent to that partition by name,
// unfinished or finished: it write-locks that partition and its indexes, not the key
// table (whose statement trigger it does not run), and its row lands there. A name that does not cover the transaction's start (one
// dropped, or one whose bounds leave it out) answers ErrUnavailable and writes
// nothing.
func TestPartitionAddressedInsert(t *testing.T) {
	t.Parallel()
	db, s, now := addressedTable(t)
	ctx := context.Background()
	own := partitionName(now, time.Minute)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	finished := &StoredResponse{Status: 201, Headers: []byte(`{}`), Body: []byte("ok"), History: History{Entry: []byte(`{"a":1}`), Keep: 10}}

	for i, resp := range []*StoredResponse{nil, finished} {
		for round := range 7 { // past pgx's and PostgreSQL's custom-plan runs
			key := fmt.Sprintf("k%d-%d", i, round)
			locks, sent, err := claimInsert(t, conn, s, key, time.Time{}, resp)
			require.NoError(t, err, key)
			require.Contains(t, sent, `INSERT INTO "`+own+`" (`, "%s: sent to the row's partition", key)
			require.Contains(t, locks, own, key)
			for _, rel := range locks {
				require.True(t, strings.HasPrefix(rel, own), "%s: the insert locks %s: only the row's partition and its indexes, not the key table", key, rel)
			}
			var in string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM idemflow_keys WHERE idempotency_key = $1`, key).Scan(&in))
			require.Equal(t, own, in, key)
		}
	}

	// The key table's form, for comparison: it locks the key table too.
	whole := keyTableLocks(t, conn, s.sql.insertKey, []any{"s", "whole", "0190b1a4-7d2c-7000-8000-000000000002", "f", "POST", "/r",
		[]byte("fp"), []byte("{}"), "started", json.RawMessage(`{}`), 60000, nil})
	require.Contains(t, whole, keyTable, "the insert through the key table locks it")

	// Names that do not hold the transaction's start: refused, retryable, nothing written.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+partitionName(now.Add(-4*time.Minute), time.Minute)+`;
DROP TABLE `+partitionName(now.Add(-4*time.Minute), time.Minute))
	require.NoError(t, err)
	for name, at := range map[string]time.Time{
		"gone":    now.Add(-4 * time.Minute), // dropped
		"outside": now.Add(-2 * time.Minute), // attached, for another minute
	} {
		_, sent, err := claimInsert(t, conn, s, name, at, nil)
		require.ErrorIs(t, err, ErrUnavailable, name)
		require.Contains(t, sent, partitionName(at, time.Minute), name)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE idempotency_key = $1`, name).Scan(&n))
		require.Zero(t, n, name)
	}
}

// claimInsert claims key on conn in a transaction, the insert's created_at taken as
// at (zero: the one the claim lock read), and returns the key table's relations (the table,
// its partitions, their indexes) the transaction then held a write lock on (the
// look-up under the claim lock read every partition), the SQL text sent, and the
// insert's error.
func claimInsert(t *testing.T, conn *pgxpool.Conn, s *Store, key string, at time.Time, resp *StoredResponse) ([]string, string, error) {
	t.Helper()
	ctx := context.Background()
	c := Claim{Scope: "s", Key: key, ID: "0190b1a4-7d2c-7000-8000-000000000001", Flow: "f", Method: "POST", Route: "/r",
		Fingerprint: []byte("fp"), Body: []byte("{}"), Lease: time.Minute}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	b := &pgx.Batch{}
	look := s.QueueClaimLook(b, c)
	br := tx.SendBatch(ctx, b)
	locked, read, _, err := look.Read(br)
	require.True(t, locked, key)
	require.ErrorIs(t, err, ErrNotFound, key)
	require.NoError(t, br.Close())
	if at.IsZero() {
		at = read
	}
	b = &pgx.Batch{}
	q := s.QueueKeyWrite(b, KeyWrite{Claim: &c, Fence: Fence{Scope: "s", Key: key, ID: c.ID, CreatedAt: at}, Held: true,
		RecoveryPoint: "started", Data: json.RawMessage(`{}`), Lease: time.Minute, Response: resp})
	sent := b.QueuedQueries[0].SQL
	br = tx.SendBatch(ctx, b)
	_, ierr := q.Read(br)
	cerr := br.Close()
	if ierr != nil {
		return nil, sent, ierr
	}
	require.NoError(t, cerr)
	rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND c.relname LIKE 'idemflow\_keys%'
ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return names, sent, nil
}
