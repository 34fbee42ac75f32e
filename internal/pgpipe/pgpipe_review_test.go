package pgpipe_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgpipe"
)

// readAll sends sql with arg alone in a batch and returns its rows' values.
func readAll(ctx context.Context, conn *pgx.Conn, sql string, arg any) ([][]any, error) {
	batch := &pgx.Batch{}
	batch.Queue(sql, arg)
	br := pgpipe.Send(ctx, conn, batch)
	rows, _ := br.Query()
	var got [][]any
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			break
		}
		got = append(got, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return nil, err
	}
	return got, br.Close()
}

// TestReviewColumnCountChange: a statement of two columns or more whose column count
// changes (ALTER TABLE ... ADD or DROP COLUMN under SELECT *) may fail its first use
// after the change, as with pgx, but the next use reads the new columns: in
// describe mode the stale description's result formats no longer match the columns
// (the server refuses the Bind with 08P01), which must not stick to the connection.
func TestReviewColumnCountChange(t *testing.T) {
	t.Parallel()
	for _, mode := range cacheModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode, 0)
			ctx := context.Background()
			_, err := b.conn.Exec(ctx, `CREATE TEMP TABLE tmp_c (a int, b int); INSERT INTO tmp_c VALUES (1, 2)`)
			require.NoError(t, err)
			const sql = `SELECT * FROM tmp_c WHERE a = $1`
			got, err := readAll(ctx, b.conn, sql, 1)
			require.NoError(t, err)
			require.Equal(t, [][]any{{int32(1), int32(2)}}, got)
			for _, alter := range []string{`ALTER TABLE tmp_c ADD COLUMN c int DEFAULT 3`, `ALTER TABLE tmp_c DROP COLUMN b`} {
				_, err = b.conn.Exec(ctx, alter)
				require.NoError(t, err)
				_, _ = readAll(ctx, b.conn, sql, 1) // may fail once, as with pgx
				got, err = readAll(ctx, b.conn, sql, 1)
				require.NoError(t, err, "after %s", alter)
				require.False(t, b.conn.IsClosed())
			}
			require.Equal(t, [][]any{{int32(1), int32(3)}}, got)
		})
	}
}

// TestReviewEmptyStatement: a batch whose statement is empty (or only a semicolon)
// runs as the server runs an empty query, in both cache modes and twice (cold, warm);
// pgx's own statement cache panics on empty SQL, so it must not go there.
func TestReviewEmptyStatement(t *testing.T) {
	t.Parallel()
	for _, mode := range cacheModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode, 0)
			ctx := context.Background()
			for range 2 {
				batch := &pgx.Batch{}
				batch.Queue(``)
				batch.Queue(`;`)
				batch.Queue(`SELECT $1::int`, 1)
				br := pgpipe.Send(ctx, b.conn, batch)
				_, err := br.Exec()
				require.NoError(t, err)
				_, err = br.Exec()
				require.NoError(t, err)
				var n int
				require.NoError(t, br.QueryRow().Scan(&n))
				require.Equal(t, 1, n)
				require.NoError(t, br.Close())
			}
		})
	}
}
