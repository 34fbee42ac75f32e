package keytable_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestCommitFlushed: the statement that makes a commit before a call durable
// (KeyWrite.Flushed), and the claim lock that carries it (Head.Flushed),
// turn synchronous_commit off into local for their transaction only, whether it is an
// implicit transaction (no BEGIN: the batch up to its Sync) or one BEGIN opened, and
// leave every stronger setting as the session has it; in the simple protocol too (the
// batch is one query string, an implicit transaction block). The setting is read
// inside the transaction after the statement, and in the session after the commit.
func TestCommitFlushed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	forms := map[string]func(*pgx.Batch){
		"Statement": func(b *pgx.Batch) { b.Queue(keytable.SQLCommitFlushed) },
		"ClaimLock": func(b *pgx.Batch) {
			c := claim("s", "flushed", pipeID())
			st.QueueHead(b, keytable.Head{Claim: &c, InsertFollows: true, Flushed: true})
		},
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		for _, sc := range []string{"off", "local", "remote_write", "on", "remote_apply"} {
			cfg, err := pgx.ParseConfig(db.URL)
			require.NoError(t, err)
			cfg.DefaultQueryExecMode = mode
			cfg.RuntimeParams["synchronous_commit"] = sc
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			want := sc
			if sc == "off" {
				want = "local"
			}
			for name, queue := range forms {
				for _, begin := range []bool{false, true} {
					b := &pgx.Batch{}
					if begin {
						b.Queue("BEGIN")
					}
					queue(b)
					b.Queue(`SELECT current_setting('synchronous_commit')`)
					if begin {
						b.Queue("COMMIT")
					}
					br := conn.SendBatch(ctx, b)
					if begin {
						_, err := br.Exec()
						require.NoError(t, err)
					}
					_, err := br.Exec()
					require.NoError(t, err, "%s %s %s", mode, sc, name)
					var in string
					require.NoError(t, br.QueryRow().Scan(&in))
					require.NoError(t, br.Close())
					require.Equal(t, want, in, "%s: synchronous_commit %s, %s, BEGIN %v: inside the transaction", mode, sc, name, begin)
					var after string
					require.NoError(t, conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after))
					require.Equal(t, sc, after, "%s: synchronous_commit %s, %s, BEGIN %v: the session's after the commit", mode, sc, name, begin)
				}
			}
			require.NoError(t, conn.Close(ctx))
		}
	}
}
