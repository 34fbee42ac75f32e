package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPoolEndsIdleTransactions: the example's pool sets
// idle_in_transaction_session_timeout to twice the lease on every connection, so the
// server ends a transaction a hung process left idle (and the claim lock it holds),
// while no phase, bounded by the lease, is cut short. Behind pgbouncer the pool still
// connects (a startup parameter would be refused there).
func TestPoolEndsIdleTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := direct(t)
	pool, err := newPool(ctx, db.URL, 500*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var setting string
	require.NoError(t, pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&setting))
	require.Equal(t, "1s", setting, "twice the lease")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	// The server ends the idle transaction's session on its own.
	eventually(t, "the idle transaction's backend is gone", func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return err == nil && n == 0
	})
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the transaction was ended by the server")
	_ = tx.Rollback(ctx)

	pooled, err := newPool(ctx, throughPgbouncer(t).URL, time.Second)
	require.NoError(t, err)
	t.Cleanup(pooled.Close)
	require.NoError(t, pooled.Ping(ctx))
}

// TestHTTPServerTimeouts: the API's server bounds how long a client may take to send
// its headers and body and to keep an idle connection.
func TestHTTPServerTimeouts(t *testing.T) {
	t.Parallel()
	hs := newHTTPServer(nil)
	require.Positive(t, hs.ReadHeaderTimeout)
	require.Positive(t, hs.ReadTimeout)
	require.Positive(t, hs.IdleTimeout)
	require.Zero(t, hs.WriteTimeout, "an answer may take as long as the lease")
}

// TestPoolRecyclesConnections: the example's pool retires a connection after about ten
// minutes, bounding what pgxpool keeps pinned per connection, unless the URL sets
// pool_max_conn_lifetime, which then holds.
func TestPoolRecyclesConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := direct(t)
	pool, err := newPool(ctx, db.URL, time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, connLifetime, pool.Config().MaxConnLifetime)
	require.Equal(t, connLifetimeJitter, pool.Config().MaxConnLifetimeJitter)

	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	own, err := newPool(ctx, db.URL+sep+"pool_max_conn_lifetime=1h30m", time.Second)
	require.NoError(t, err)
	t.Cleanup(own.Close)
	require.Equal(t, 90*time.Minute, own.Config().MaxConnLifetime)
	require.Zero(t, own.Config().MaxConnLifetimeJitter)
}
