package pgpipe_test

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgpipe"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// bundle is one connection, with its round trips counted on the wire and by a tracer.
type bundle struct {
	conn *pgx.Conn
	db   *pgtest.DB
	wire atomic.Int64 // client-to-server turns: writes that follow a read
	tr   tracer
}

func setup(t *testing.T, mode pgx.QueryExecMode, capacity int) *bundle {
	t.Helper()
	b := &bundle{db: pgtest.NewEmpty(t)}
	cfg, err := pgx.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = mode
	if capacity > 0 {
		cfg.StatementCacheCapacity, cfg.DescriptionCacheCapacity = capacity, capacity
	}
	cfg.Tracer = &b.tr
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &wireConn{Conn: c, n: &b.wire}, nil
	}
	b.conn, err = pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { b.conn.Close(context.Background()) })
	return b
}

// trips is the number of wire turns fn takes.
func (b *bundle) trips(fn func()) int64 {
	before := b.wire.Load()
	fn()
	return b.wire.Load() - before
}

// names is the package's statements prepared on the server for b's connection.
func (b *bundle) names(t *testing.T) int {
	t.Helper()
	var n int
	res := b.conn.PgConn().ExecParams(context.Background(),
		`SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'idemflow\_%'`, nil, nil, nil, nil).Read()
	require.NoError(t, res.Err)
	n = int(res.Rows[0][0][0] - '0')
	if len(res.Rows[0][0]) > 1 {
		n = -1 // more than 9: a test keeps fewer
	}
	return n
}

type wireConn struct {
	net.Conn
	n     *atomic.Int64
	wrote atomic.Bool
}

func (c *wireConn) Write(p []byte) (int, error) {
	if !c.wrote.Swap(true) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.wrote.Store(false)
	}
	return n, err
}

// tracer counts batches and their statements as a pgx.BatchTracer sees them.
type tracer struct {
	starts, queries, ends, failed atomic.Int64
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.starts.Add(1)
	return ctx
}
func (tr *tracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tr.queries.Add(1)
	if d.Err != nil {
		tr.failed.Add(1)
	}
}
func (tr *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) { tr.ends.Add(1) }

var cacheModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe}

// divide is a batch whose second statement fails when d is 0 (the server then runs
// nothing after it).
func divide(d int) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(`SELECT $1::int + 1`, 1)
	b.Queue(`SELECT 10 / $1::int`, d)
	b.Queue(`SELECT $1::text || 'x'`, "y")
	return b
}

// TestResults: every way of reading a batch reads what pgx reads, callbacks included.
func TestResults(t *testing.T) {
	t.Parallel()
	for _, mode := range cacheModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode, 0)
			ctx := context.Background()
			_, err := b.conn.Exec(ctx, `CREATE TEMP TABLE tmp_r (a int)`)
			require.NoError(t, err)
			for range 2 { // cold, then warm
				batch := &pgx.Batch{}
				batch.Queue(`SELECT $1::int * 2`, 21)
				batch.Queue(`SELECT g FROM generate_series(1, $1::int) g`, 3)
				batch.Queue(`SELECT 1 FROM tmp_r LIMIT 0`)
				var viaFn string
				batch.Queue(`SELECT $1::text`, "fn").QueryRow(func(row pgx.Row) error { return row.Scan(&viaFn) })
				var tag pgconn.CommandTag
				batch.Queue(`INSERT INTO tmp_r SELECT generate_series(1, $1::int)`, 4).Exec(func(ct pgconn.CommandTag) error {
					tag = ct
					return nil
				})
				br := pgpipe.Send(ctx, b.conn, batch)
				var n int
				require.NoError(t, br.QueryRow().Scan(&n))
				require.Equal(t, 42, n)
				rows, err := br.Query()
				require.NoError(t, err)
				got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
				require.NoError(t, err)
				require.Equal(t, []int32{1, 2, 3}, got)
				_, err = br.Exec()
				require.NoError(t, err)
				require.NoError(t, br.Close())
				require.Equal(t, "fn", viaFn)
				require.EqualValues(t, 4, tag.RowsAffected())
			}
			require.EqualValues(t, 2, b.tr.starts.Load())
			require.EqualValues(t, 2, b.tr.ends.Load())
			require.EqualValues(t, 10, b.tr.queries.Load())
		})
	}
}

// TestErrorKeepsStatements: a statement that fails mid-batch fails the batch as in
// pgx, leaves the connection usable, and the next batch of the same statements takes
// one round trip: nothing was forgotten.
func TestErrorKeepsStatements(t *testing.T) {
	t.Parallel()
	for _, mode := range cacheModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode, 0)
			ctx := context.Background()
			require.EqualValues(t, 2, b.trips(func() { require.NoError(t, pgpipe.Send(ctx, b.conn, divide(5)).Close()) }),
				"cold: describe, then the batch")
			require.EqualValues(t, 1, b.trips(func() { require.NoError(t, pgpipe.Send(ctx, b.conn, divide(5)).Close()) }))
			var pgErr *pgconn.PgError
			require.EqualValues(t, 1, b.trips(func() {
				br := pgpipe.Send(ctx, b.conn, divide(0))
				_, err := br.Exec()
				require.NoError(t, err)
				_, err = br.Exec()
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "22012", pgErr.Code)
				_, err = br.Exec()
				require.ErrorAs(t, err, &pgErr, "the rest of the batch reports the same error")
				require.ErrorAs(t, br.Close(), &pgErr)
			}))
			require.False(t, b.conn.IsClosed())
			require.EqualValues(t, 1, b.trips(func() {
				br := pgpipe.Send(ctx, b.conn, divide(5))
				var s string
				_, _ = br.Exec()
				_, _ = br.Exec()
				require.NoError(t, br.QueryRow().Scan(&s))
				require.Equal(t, "yx", s)
				require.NoError(t, br.Close())
			}), "warm after the error: one round trip")
			if mode == pgx.QueryExecModeCacheStatement {
				require.Equal(t, 3, b.names(t))
			}
		})
	}
}
