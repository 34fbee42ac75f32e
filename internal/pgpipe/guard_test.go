package pgpipe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgpipe"
)

// guarded is a batch whose first statement (the guard) raises when d is 0, followed
// by an insert into the table guarded, which it returns.
func guarded(d, n int) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(`SELECT 1/$1::int`, d)
	b.Queue(`INSERT INTO guarded (n) VALUES (@n) RETURNING n`, pgx.NamedArgs{"n": n})
	return b
}

// sendGuarded sends b with its first statement as the guard and reads the insert's n.
func sendGuarded(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) (int, error) {
	br := pgpipe.SendGuarded(ctx, conn, b, 1)
	var n int
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&n)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// TestGuard: on a connection that has prepared nothing, a guard that raises answers at
// once while another transaction holds an ACCESS EXCLUSIVE lock on the table the rest
// names (the lock is released only after it answered): the server never parsed the
// rest, which would have waited for the lock; nothing is left prepared. A guard that
// passes costs the round trips an unguarded batch costs: two on a new connection (in
// describe-exec mode on every use), then one.
func TestGuard(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // only a hung test reaches it
			defer cancel()
			b := setup(t, mode, 0)
			_, err := b.db.Pool.Exec(ctx, `CREATE TABLE guarded (n int)`)
			require.NoError(t, err)
			holder, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(context.Background())
			_, err = holder.Exec(ctx, `LOCK TABLE guarded IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)

			require.EqualValues(t, 2, b.trips(func() {
				_, err := sendGuarded(ctx, b.conn, guarded(0, 1))
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "the guard's error, at once")
				require.Equal(t, "22012", pgErr.Code)
			}), "the guard with the Parse of the rest behind a Flush; the Sync")
			require.Equal(t, 0, b.names(t), "nothing was prepared")
			require.NoError(t, holder.Rollback(ctx))

			cold := 2 // the guard with the rest's Parse; the rest
			require.EqualValues(t, cold, b.trips(func() {
				n, err := sendGuarded(ctx, b.conn, guarded(1, 7))
				require.NoError(t, err)
				require.Equal(t, 7, n)
			}))
			warm := int64(1)
			if mode == pgx.QueryExecModeDescribeExec {
				warm = 2 // describes on every use, as pgx does
			}
			require.Equal(t, warm, b.trips(func() {
				n, err := sendGuarded(ctx, b.conn, guarded(1, 8))
				require.NoError(t, err)
				require.Equal(t, 8, n)
			}))
			if mode == pgx.QueryExecModeCacheStatement {
				require.Equal(t, 2, b.names(t), "the guard and the insert, prepared once")
			}
			var rows int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM guarded`).Scan(&rows))
			require.Equal(t, 2, rows)
		})
	}
}

// TestGuardCallbackError: an error of the guard's own reading (a callback's), with no
// error from the server, leaves the guard's statements run and their implicit
// transaction open: the rest is never sent, and nothing commits (the connection is
// closed rather than synced, as pgx closes one with unsynced requests).
func TestGuardCallbackError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, pgx.QueryExecModeCacheStatement, 0)
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE guarded (n int)`)
	require.NoError(t, err)
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO guarded (n) VALUES ($1)`, 1).Exec(func(pgconn.CommandTag) error { return errFromCallback })
	batch.Queue(`INSERT INTO guarded (n) VALUES ($1)`, 2)
	br := pgpipe.SendGuarded(ctx, b.conn, batch, 1)
	require.ErrorIs(t, br.Close(), errFromCallback)
	require.True(t, b.conn.IsClosed())
	var rows int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM guarded`).Scan(&rows))
	require.Equal(t, 0, rows, "the guard's insert rolled back with the connection")
}

var errFromCallback = errors.New("from the callback")
