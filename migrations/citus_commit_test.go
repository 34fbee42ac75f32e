package migrations_test

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestCitusCoordinatorTableCommit checks what docs/SCALING.md says of a phase's
// transaction on Citus that writes the key row (on the worker holding its scope's
// shard) and a row of a table on the coordinator (an outbox, River's job table), when
// the coordinator crashes at commit, after the worker has its part.
//
// The worker is made to wait at that point: it is given a synchronous standby that
// never comes, so its COMMIT (or PREPARE TRANSACTION) is written to its WAL and then
// waits. The test then kills the coordinator's backend (the coordinator's postmaster
// ends every session and recovers), lets the worker go on, and runs Citus's recovery
// of prepared transactions.
//
//   - Plain: a plain table on the coordinator. Citus commits the worker's part in one
//     phase, before the coordinator's, so the key row stays and the coordinator's row
//     is lost. This is the risk the doc names.
//   - Local: the same table added to Citus's metadata as a local table
//     (migrations.DistributeOptions.Local). Writing it is a Citus local execution, so
//     Citus uses two-phase commit: the worker only prepared, the coordinator never
//     committed, and recovery rolls the worker's part back. Both rows or neither.
//   - Marker: the table stays plain, and the transaction also writes a row of another
//     table that is in Citus's metadata as a local table: that write alone makes Citus
//     use two-phase commit for the whole transaction, the plain table's row included.
func TestCitusCoordinatorTableCommit(t *testing.T) {
	t.Parallel()
	pgtest.SkipUnlessCitus(t)
	c := pgtest.RequireCitus(t) // its own cluster: a worker's settings change
	// Recovery of prepared transactions runs when the test calls it, not also on its
	// own in the coordinator's maintenance daemon, so that the test sees what a crash
	// leaves before recovery.
	coord := connect(t, c.Coordinator.URL)
	_, err := coord.Exec(t.Context(), `ALTER SYSTEM SET citus.recover_2pc_interval = -1`)
	require.NoError(t, err)
	_, err = coord.Exec(t.Context(), `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	for _, tc := range []struct {
		mode     coordinatorTable
		keyRows  int // after the crash and recovery
		jobRows  int
		prepared int // on the worker, before recovery
	}{
		{plainTable, 1, 0, 0},
		{localTable, 0, 0, 1},
		{plainTableAndMarker, 0, 0, 1},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			got := commitCrashedOnWorker(t, c, tc.mode)
			require.Equal(t, []int{tc.keyRows, tc.jobRows, tc.prepared}, got,
				"key rows, coordinator rows after the crash; prepared transactions on the worker before recovery")
		})
	}
}

// coordinatorTable is how a test's jobs table on the coordinator is set up.
type coordinatorTable string

const (
	plainTable          coordinatorTable = "Plain"
	localTable          coordinatorTable = "Local"
	plainTableAndMarker coordinatorTable = "Marker"
)

// commitCrashedOnWorker sets up a schema on c with a distributed key table and a jobs
// table on the coordinator (as mode says), writes one row in each in one transaction,
// and crashes the coordinator while the worker holds the key row's part at commit.
// Once the worker went on and recovery ran, it returns how many key rows and job rows
// there are, and how many prepared transactions the worker held before recovery. It
// then checks that a transaction that does not crash commits both rows.
func commitCrashedOnWorker(t *testing.T, c *pgtest.Citus, mode coordinatorTable) []int {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	coord := connect(t, c.Coordinator.URL)
	schema := fmt.Sprintf("commit_%s_%d", mode, time.Now().UnixNano())
	keyTable, jobTable, marker := setUpCommitSchema(t, ctx, coord, schema, mode)

	const scope = "acct-1"
	var port int
	require.NoError(t, coord.QueryRow(ctx, `SELECT nodeport FROM citus_shards
		WHERE shardid = get_shard_id_for_distribution_column($1::regclass, $2::text)`, keyTable, scope).Scan(&port))
	worker := connect(t, workerURL(t, c, port))
	holdCommits(t, ctx, worker, true)
	t.Cleanup(func() { holdCommits(t, context.Background(), worker, false) })

	tx := connect(t, c.Coordinator.URL)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	committed := make(chan error, 1)
	writeBoth(t, ctx, tx, keyTable, jobTable, marker, scope, 1, committed)

	waitFor(t, ctx, worker, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)
	// The coordinator crashes: its backend is killed, so its postmaster ends every
	// session and recovers from its WAL. (pg_terminate_backend would not do: Citus
	// ignores interrupts while it waits for a worker's one-phase COMMIT.)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Error(t, <-committed, "the coordinator crashed at commit")
	// A session that answers right after the kill may predate the postmaster's reset,
	// which then ends it: reconnect only once the reset has ended the old session.
	waitEnded(t, ctx, coord)
	coord = reconnect(t, ctx, c.Coordinator.URL)
	holdCommits(t, ctx, worker, false)
	waitFor(t, ctx, worker, `SELECT count(*) = 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)

	var prepared, keys, jobs int
	require.NoError(t, worker.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_xacts`).Scan(&prepared))
	_, err := coord.Exec(ctx, `SELECT recover_prepared_transactions()`)
	require.NoError(t, err)
	var left int
	require.NoError(t, worker.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_xacts`).Scan(&left))
	require.Zero(t, left, "recovery left no prepared transaction on the worker")
	require.NoError(t, coord.QueryRow(ctx, `SELECT count(*) FROM `+keyTable).Scan(&keys))
	require.NoError(t, coord.QueryRow(ctx, `SELECT count(*) FROM `+jobTable).Scan(&jobs))

	// Without a crash, both rows commit.
	writeBoth(t, ctx, coord, keyTable, jobTable, marker, scope, 2, committed)
	require.NoError(t, <-committed)
	var both int
	require.NoError(t, coord.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+keyTable+` WHERE idempotency_key = 'k2')
		+ (SELECT count(*) FROM `+jobTable+` WHERE id = 2)`).Scan(&both))
	require.Equal(t, 2, both, "a transaction that does not crash commits both rows")
	return []int{keys, jobs, prepared}
}

// setUpCommitSchema migrates schema on coord, distributes its key table and creates
// the jobs table (and, for plainTableAndMarker, a marker table) as mode says. It
// returns the three tables' SQL names; marker is "" when there is none.
func setUpCommitSchema(t *testing.T, ctx context.Context, coord *pgx.Conn, schema string, mode coordinatorTable) (keyTable, jobTable, marker string) {
	t.Helper()
	m, err := migrations.NewMigrator(&migrations.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctx, coord))
	keyTable = pgx.Identifier{schema, "idemflow_keys"}.Sanitize()
	jobTable = pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err = coord.Exec(ctx, `CREATE TABLE `+jobTable+` (id bigint PRIMARY KEY, scope text NOT NULL)`)
	require.NoError(t, err)
	opts := &migrations.DistributeOptions{}
	switch mode {
	case localTable:
		opts.Local = []string{jobTable}
	case plainTableAndMarker:
		marker = pgx.Identifier{schema, "commit_marker"}.Sanitize()
		_, err = coord.Exec(ctx, `CREATE TABLE `+marker+` (id bigint PRIMARY KEY)`)
		require.NoError(t, err)
		opts.Local = []string{marker}
	}
	require.NoError(t, m.Distribute(ctx, coord, opts))
	return keyTable, jobTable, marker
}

// writeBoth writes key row n of scope and job row n (and a marker row) in one
// transaction on conn, and sends COMMIT's outcome to committed once it returns.
func writeBoth(t *testing.T, ctx context.Context, conn *pgx.Conn, keyTable, jobTable, marker, scope string, n int, committed chan<- error) {
	t.Helper()
	_, err := conn.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO `+keyTable+` (scope, idempotency_key, id, flow, method, route, fingerprint, request_body)
		VALUES ($1, 'k' || $2::int, gen_random_uuid(), 'f', 'POST', '/r', sha256('{}'::bytea), '{}'::bytea)`, scope, n)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO `+jobTable+` (id, scope) VALUES ($1, $2)`, n, scope)
	require.NoError(t, err)
	if marker != "" {
		_, err = conn.Exec(ctx, `INSERT INTO `+marker+` (id) VALUES ($1)`, n)
		require.NoError(t, err)
	}
	go func() { _, err := conn.Exec(ctx, `COMMIT`); committed <- err }()
}

// holdCommits makes the worker's commits wait after they are written to its WAL (a
// synchronous standby that never comes), or lets them go on, and waits until new
// sessions see the setting.
func holdCommits(t *testing.T, ctx context.Context, worker *pgx.Conn, hold bool) {
	t.Helper()
	set, want := `ALTER SYSTEM SET synchronous_standby_names = 'idemflow_test_nobody'`, "idemflow_test_nobody"
	if !hold {
		set, want = `ALTER SYSTEM RESET synchronous_standby_names`, ""
	}
	_, err := worker.Exec(ctx, set)
	require.NoError(t, err)
	_, err = worker.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	cfg := worker.Config().Copy()
	for {
		fresh, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		var got string
		err = fresh.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&got)
		_ = fresh.Close(ctx)
		require.NoError(t, err)
		if got == want {
			return
		}
		require.NoError(t, ctx.Err(), "the worker never read its new setting")
	}
}

// waitFor runs query (one boolean) on conn until it is true, failing t when ctx ends.
func waitFor(t *testing.T, ctx context.Context, conn *pgx.Conn, query string) {
	t.Helper()
	for {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, query).Scan(&ok), query)
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never true: %s", query)
		case <-time.After(10 * time.Millisecond): // the next look; not a synchronisation
		}
	}
}

// waitEnded waits until conn's session has been ended by its server, failing t when
// ctx ends first.
func waitEnded(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	for {
		if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
			require.NoError(t, ctx.Err(), "the coordinator never ended its sessions")
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the coordinator never ended its sessions")
		case <-time.After(10 * time.Millisecond): // the next look; not a synchronisation
		}
	}
}

// reconnect connects to url once the server there accepts connections again.
func reconnect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			if _, err = conn.Exec(ctx, `SELECT 1`); err == nil {
				t.Cleanup(func() { _ = conn.Close(context.Background()) })
				return conn
			}
			_ = conn.Close(ctx)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never came back: %v", url, err)
		case <-time.After(50 * time.Millisecond): // the next try; not a synchronisation
		}
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// workerURL returns the URL of c's worker listening on port.
func workerURL(t *testing.T, c *pgtest.Citus, port int) string {
	t.Helper()
	for _, w := range c.Workers {
		cfg, err := pgx.ParseConfig(w.URL)
		require.NoError(t, err)
		if int(cfg.Port) == port {
			return w.URL
		}
	}
	t.Fatalf("no worker on port %s", strconv.Itoa(port))
	return ""
}
