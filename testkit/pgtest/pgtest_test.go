package pgtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

// TestStart starts its own server (not the shared one) with TEST_DATABASE_URL unset, so
// it exercises the throwaway path whatever the environment says.
func TestStart(t *testing.T) {
	t.Setenv(pgtest.EnvDatabaseURL, "")
	ctx := t.Context()

	srv, err := pgtest.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	require.True(t, strings.HasPrefix(srv.URL, "postgres://postgres@127.0.0.1:"), srv.URL)
	require.NotContains(t, srv.URL, ":5432/", "must not use the system cluster")

	conn, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "select 1").Scan(&one))
	require.Equal(t, 1, one)
	var fsync, maxConns string
	require.NoError(t, conn.QueryRow(ctx, "select current_setting('fsync'), current_setting('max_connections')").Scan(&fsync, &maxConns))
	require.Equal(t, "on", fsync)
	require.Equal(t, "300", maxConns)
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, srv.Stop())
	require.NoError(t, srv.Stop(), "Stop is idempotent")
	err = pingOnce(ctx, srv.URL)
	require.Error(t, err, "the server is gone after Stop")
}

func TestNew(t *testing.T) {
	t.Parallel()

	t.Run("MigratedAndIsolated", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		a, b := pgtest.New(t), pgtest.New(t)
		require.NotEqual(t, a.Schema, b.Schema)
		require.Contains(t, a.URL, "search_path="+a.Schema)

		var schema string
		require.NoError(t, a.Pool.QueryRow(ctx, "select current_schema()").Scan(&schema))
		require.Equal(t, a.Schema, schema)

		insertKey(t, a.Pool, "k1")
		require.Equal(t, 1, countKeys(t, a.Pool))
		require.Equal(t, 0, countKeys(t, b.Pool), "another schema does not see the row")

		other := a.NewPool(t)
		require.NotSame(t, a.Pool, other)
		require.Equal(t, 1, countKeys(t, other), "a new pool on the same schema sees it")
	})

	t.Run("EmptyHasNoTables", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewEmpty(t)
		var n int
		require.NoError(t, db.Pool.QueryRow(t.Context(),
			"select count(*) from pg_class where relnamespace = $1::regnamespace", db.Schema).Scan(&n))
		require.Zero(t, n)
	})

	t.Run("DroppedAfterCleanup", func(t *testing.T) {
		t.Parallel()
		var schema string
		t.Run("Inner", func(t *testing.T) {
			db := pgtest.New(t)
			schema = db.Schema
			insertKey(t, db.Pool, "k1")
		})
		srv, err := pgtest.Shared(t.Context())
		require.NoError(t, err)
		conn, err := pgx.Connect(t.Context(), srv.URL)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var exists bool
		require.NoError(t, conn.QueryRow(t.Context(),
			"select exists (select 1 from pg_namespace where nspname = $1)", schema).Scan(&exists))
		require.False(t, exists, "schema %s is dropped when its test ends", schema)
	})
}

func insertKey(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `INSERT INTO idemflow_keys
		(scope, idempotency_key, id, flow, method, route, fingerprint, request_body)
		VALUES ('acct', $1, gen_random_uuid(), 'f', 'POST', '/x', sha256(''), '')`, key)
	require.NoError(t, err)
}

func countKeys(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "select count(*) from idemflow_keys").Scan(&n))
	return n
}

func pingOnce(ctx context.Context, connString string) error {
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}
