package pgpipe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgpipe"
)

// one sends a batch of sql with arg and returns its one value.
func one(ctx context.Context, conn *pgx.Conn, sql string, arg any) (int, error) {
	b := &pgx.Batch{}
	b.Queue(sql, arg)
	br := pgpipe.Send(ctx, conn, b)
	var n int
	err := br.QueryRow().Scan(&n)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// TestEviction: the registry keeps at most its capacity; the least recently used
// statement's name is closed on the server in the next round trip that prepares, and
// the statement is prepared again when it comes back.
func TestEviction(t *testing.T) {
	t.Parallel()
	b := setup(t, pgx.QueryExecModeCacheStatement, 2)
	ctx := context.Background()
	sql := func(i int) string { return fmt.Sprintf(`SELECT $1::int + %d`, i) }
	for i := range 6 {
		require.EqualValues(t, 2, b.trips(func() {
			n, err := one(ctx, b.conn, sql(i), 1)
			require.NoError(t, err)
			require.Equal(t, i+1, n)
		}), "statement %d is new", i)
		require.LessOrEqual(t, b.names(t), 3, "the capacity and the one evicted last")
	}
	require.EqualValues(t, 1, b.trips(func() { _, err := one(ctx, b.conn, sql(5), 1); require.NoError(t, err) }))
	require.EqualValues(t, 2, b.trips(func() {
		n, err := one(ctx, b.conn, sql(0), 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}), "evicted: prepared again")
	require.Equal(t, 3, b.names(t), "the capacity and the one evicted last")
}

// TestDiscardAll: a server that lost the names (DISCARD ALL, a pooler's reset) fails
// the next batch with 26000, as pgx would; the one after prepares again and works.
func TestDiscardAll(t *testing.T) {
	t.Parallel()
	b := setup(t, pgx.QueryExecModeCacheStatement, 0)
	ctx := context.Background()
	_, err := one(ctx, b.conn, `SELECT $1::int`, 1)
	require.NoError(t, err)
	require.NoError(t, b.conn.PgConn().Exec(ctx, `DISCARD ALL`).Close())
	_, err = one(ctx, b.conn, `SELECT $1::int`, 1)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "26000", pgErr.Code)
	require.EqualValues(t, 2, b.trips(func() {
		n, err := one(ctx, b.conn, `SELECT $1::int`, 7)
		require.NoError(t, err)
		require.Equal(t, 7, n)
	}), "prepared again")
	require.Equal(t, 1, b.names(t))
}

// TestSchemaChange: a table whose columns change between two uses of a statement
// fails the first use after it (0A000, as pgx in cache-statement mode); the next
// prepares again and reads the new columns.
func TestSchemaChange(t *testing.T) {
	t.Parallel()
	for _, mode := range cacheModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode, 0)
			ctx := context.Background()
			_, err := b.conn.Exec(ctx, `CREATE TEMP TABLE tmp_s (a int); INSERT INTO tmp_s VALUES (1)`)
			require.NoError(t, err)
			const sql = `SELECT * FROM tmp_s WHERE a = $1`
			_, err = one(ctx, b.conn, sql, 1)
			require.NoError(t, err)
			_, err = b.conn.Exec(ctx, `ALTER TABLE tmp_s ADD COLUMN b int DEFAULT 2`)
			require.NoError(t, err)
			var row []any
			read := func() error {
				batch := &pgx.Batch{}
				batch.Queue(sql, 1)
				br := pgpipe.Send(ctx, b.conn, batch)
				rows, _ := br.Query()
				row = nil
				if rows.Next() {
					row, _ = rows.Values()
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					br.Close()
					return err
				}
				return br.Close()
			}
			if err := read(); mode == pgx.QueryExecModeCacheStatement {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "0A000", pgErr.Code)
				require.NoError(t, read())
			} else {
				require.NoError(t, err, "unnamed statements are planned anew")
			}
			require.Equal(t, []any{int32(1), int32(2)}, row)
		})
	}
}

// TestCancel: a context that ends while the batch runs leaves the connection as pgx
// leaves it (here: closed by pgconn, or usable), on a connection of each.
func TestCancel(t *testing.T) {
	t.Parallel()
	mine := setup(t, pgx.QueryExecModeCacheStatement, 0)
	theirs := setup(t, pgx.QueryExecModeCacheStatement, 0)
	send := map[*bundle]func(context.Context, *pgx.Conn, *pgx.Batch) pgx.BatchResults{
		mine:   pgpipe.Send,
		theirs: func(ctx context.Context, c *pgx.Conn, b *pgx.Batch) pgx.BatchResults { return c.SendBatch(ctx, b) },
	}
	for _, b := range []*bundle{mine, theirs} {
		ctx, cancel := context.WithCancel(context.Background())
		pid := b.conn.PgConn().PID()
		go func() { // cancel once the server runs the sleep: a signal, not a delay
			defer cancel()
			for {
				var waiting bool
				err := b.db.Pool.QueryRow(context.Background(),
					`SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_sleep%' AND state = 'active')`, pid).Scan(&waiting)
				if err != nil || waiting {
					return
				}
			}
		}()
		batch := &pgx.Batch{}
		batch.Queue(`SELECT $1::int`, 1)
		batch.Queue(`SELECT pg_sleep($1)`, float64(time.Minute/time.Second))
		err := send[b](ctx, b.conn, batch).Close()
		require.Error(t, err)
		cancel()
	}
	require.Equal(t, theirs.conn.IsClosed(), mine.conn.IsClosed(), "closed as pgx closes it")
	if !mine.conn.IsClosed() {
		_, err := one(context.Background(), mine.conn, `SELECT $1::int`, 1)
		require.NoError(t, err)
	}
}

// TestFallback: what the registry does not handle goes to pgx unchanged.
func TestFallback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exec := setup(t, pgx.QueryExecModeExec, 0)
	n, err := one(ctx, exec.conn, `SELECT $1::int`, 3)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	b := setup(t, pgx.QueryExecModeCacheStatement, 0)
	n, err = one(ctx, b.conn, `SELECT @v::int`, pgx.NamedArgs{"v": 4})
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, 0, b.names(t), "named arguments went to pgx")
	_, err = b.conn.Prepare(ctx, "mine", `SELECT $1::int * 3`)
	require.NoError(t, err)
	n, err = one(ctx, b.conn, "mine", 5)
	require.NoError(t, err)
	require.Equal(t, 15, n)
	tx := &pgx.Batch{}
	tx.BeginTx(pgx.TxOptions{})
	tx.Queue(`SELECT $1::int`, 1)
	br := pgpipe.Send(ctx, b.conn, tx)
	require.NotNil(t, br.Tx(), "a batch begun with BeginTx went to pgx")
	require.NoError(t, br.Close())
	require.NoError(t, br.Tx().Rollback(ctx))
}

// TestBrokenConnection: a connection whose backend is terminated fails the batch and
// is closed, as pgx closes it; nothing half-read is used again.
func TestBrokenConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, pgx.QueryExecModeCacheStatement, 0)
	ctx := context.Background()
	_, err := one(ctx, b.conn, `SELECT $1::int`, 1)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1::int, 60000::bigint)`, b.conn.PgConn().PID()) // returns once it exited
	require.NoError(t, err)
	_, err = one(ctx, b.conn, `SELECT $1::int`, 1)
	require.Error(t, err)
	require.True(t, b.conn.IsClosed())
}
