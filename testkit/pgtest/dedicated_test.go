package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestDedicatedCrashRestart: a committed row survives an immediate shutdown, an open
// transaction does not, and the server comes back on the same URL.
func TestDedicatedCrashRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, db := pgtest.NewDedicated(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	open, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer open.Close(context.Background())
	tx, err := open.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO t VALUES (2)`)
	require.NoError(t, err)

	require.NoError(t, srv.Crash())
	require.False(t, srv.Running())
	require.Error(t, srv.Crash(), "crashing a stopped server is an error")
	require.Error(t, tx.Commit(ctx), "the open transaction died with the server")
	require.NoError(t, srv.Restart(ctx))
	require.True(t, srv.Running())

	var vals []int
	rows, err := db.Pool.Query(ctx, `SELECT v FROM t ORDER BY v`)
	if err != nil { // the pool's first use after the crash may find its connection dead
		rows, err = db.Pool.Query(ctx, `SELECT v FROM t ORDER BY v`)
	}
	require.NoError(t, err)
	vals, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1}, vals)
	require.Error(t, srv.Restart(ctx), "restarting a running server is an error")
}

// TestDedicatedFromTemplate: dedicated servers made from the process's template data
// directory (Main runs these tests) are separate clusters: what one writes the other
// does not see, and each runs with the settings it was started with.
func TestDedicatedFromTemplate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(settings ...string) *pgx.Conn {
		srv, err := pgtest.StartDedicatedWith(ctx, settings...)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, srv.Stop()) })
		conn, err := pgx.Connect(ctx, srv.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	a := start("wal_level=logical", "application_name=it's a")
	b := start()
	_, err := a.Exec(ctx, `CREATE TABLE only_in_a (v int)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'`).Scan(&n))
	require.Zero(t, n, "the second server sees the first one's table")

	setting := func(c *pgx.Conn, name string) string {
		var v string
		require.NoError(t, c.QueryRow(ctx, `SELECT setting FROM pg_settings WHERE name = $1`, name).Scan(&v))
		return v
	}
	require.Equal(t, "logical", setting(a, "wal_level"))
	require.Equal(t, "it's a", setting(a, "application_name"))
	require.Equal(t, "replica", setting(b, "wal_level"))
}
