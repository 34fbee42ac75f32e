package pgpipe_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgpipe"
)

// TestRecheck: a guard's check that another transaction falsifies between the guard's
// round trip and the rest's (the connection had not prepared the rest, so the rest
// waits for the guard) stops the rest when the check is sent again with it
// (SendRechecked): the rest's first statement gets a *RecheckError carrying the check's
// error, and nothing of it ran. Sent once (SendGuarded), the rest runs on a check a
// round trip old: the window the recheck closes. On a connection that prepared the
// batch, the recheck costs nothing: one round trip, the check sent once.
func TestRecheck(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // only a hung test reaches it
			defer cancel()
			b := setup(t, mode, 0)
			_, err := b.db.Pool.Exec(ctx, `CREATE TABLE flag (ok bool NOT NULL);
				INSERT INTO flag VALUES (true);
				CREATE SEQUENCE checks;
				CREATE TABLE guarded (n int)`)
			require.NoError(t, err)
			flip := func(ok bool) {
				_, err := b.db.Pool.Exec(ctx, `UPDATE flag SET ok = $1`, ok)
				require.NoError(t, err)
			}
			inserted := func() (n int) {
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM guarded`).Scan(&n))
				return n
			}
			var last int64
			checks := func() int64 { // the check's runs since the last call
				var n int64
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT last_value FROM checks`).Scan(&n))
				n, last = n-last, n
				return n
			}

			// The guard passes; the flag is cleared before the rest is sent.
			err = sendFlipped(ctx, b.conn, 1, "", func() { flip(false) })
			var re *pgpipe.RecheckError
			require.ErrorAs(t, err, &re, "the insert's error is the check's, sent again")
			require.Equal(t, 1, re.Index)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "22012", pgErr.Code)
			require.Equal(t, 0, inserted(), "the insert never ran")
			checks()
			require.False(t, b.conn.IsClosed(), "the connection stays usable")

			// Without the recheck, the same pause lets the insert run on a stale check.
			// The insert's text is new to the connection, so that the rest waits.
			flip(true)
			require.NoError(t, sendFlipped(ctx, b.conn, 0, "-- once", func() { flip(false) }))
			require.Equal(t, 1, inserted(), "sent once, the check was a round trip old")
			require.Equal(t, int64(1), checks())

			// A recheck that passes: the rest runs, the check ran twice, in the round
			// trips of a guarded batch (and COMMIT's).
			flip(true)
			require.Equal(t, int64(2+1), b.trips(func() {
				require.NoError(t, sendFlipped(ctx, b.conn, 1, "-- again", func() {}))
			}))
			require.Equal(t, 2, inserted())
			require.Equal(t, int64(2), checks())

			// Warm: one round trip (and COMMIT's), the check sent once.
			warm, runs := int64(1), int64(1)
			if mode == pgx.QueryExecModeDescribeExec {
				warm, runs = 2, 2 // describes on every use, as pgx does: the rest waits, rechecked
			}
			require.Equal(t, warm+1, b.trips(func() {
				require.NoError(t, sendFlipped(ctx, b.conn, 1, "-- again", func() {}))
			}))
			require.Equal(t, 3, inserted())
			require.Equal(t, runs, checks())
		})
	}
}

// sendFlipped sends BEGIN, the check that the flag is set (counted in the sequence
// checks) and an insert (its text ending in tail), the first two as the guard, the
// check rechecked if recheck is 1, and runs between before the insert's result is
// asked for (when a guarded rest is sent); then it commits.
func sendFlipped(ctx context.Context, conn *pgx.Conn, recheck int, tail string, between func()) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT 1/count(*) FROM flag, nextval('checks') WHERE ok AND $1::int = 0`, 0)
	b.Queue(`INSERT INTO guarded (n) VALUES ($1)`+tail, 1)
	br := pgpipe.SendRechecked(ctx, conn, b, 2, recheck)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		between()
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_, _ = conn.Exec(ctx, `ROLLBACK`)
		return err
	}
	_, err = conn.Exec(ctx, `COMMIT`)
	return err
}
