package workflow_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestPipelinedOneStatement: a pipelined phase's statement must be exactly one
// statement. A text of two (`INSERT …; COMMIT`, `INSERT …; INSERT …`, a COMMIT after a
// string E'\';') is refused before anything is sent, in every pgx exec
// mode: in the simple-protocol mode the batch is one query string, where the COMMIT
// would commit the claim, the key row and the insert before it whatever the rest did.
// The refusal names the statement, is permanent (ErrRefused), leaves no key row of a
// new key and no effect; a key whose row exists is dead-lettered at the recovery point
// its last commit left, with nothing of the refused phase.
func TestPipelinedOneStatement(t *testing.T) {
	t.Parallel()
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'refused', 1)`
	texts := map[string]string{
		"insert-commit": insert + `; COMMIT`,
		"insert-insert": insert + `; ` + insert,
		"escaped-quote": `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, E'\';', 1); COMMIT`,
	}
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			requireOneStatement(t, pipeSetup(t, mode, ""), texts)
		})
	}
	t.Run("Pgbouncer", func(t *testing.T) {
		t.Parallel()
		pgtest.RequirePgbouncer(t)
		p, err := pgtest.SharedPgbouncer(context.Background())
		require.NoError(t, err)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(mode.String(), func(t *testing.T) {
				db := pgtest.NewDatabase(t)
				b := &pipeBundle{db: db, trips: &tripCounter{}}
				_, err := db.Pool.Exec(context.Background(), pipeSchema)
				require.NoError(t, err)
				requireOneStatement(t, pipeSetupOn(t, b, mode, p.URLFor(dbName(t, db), mode)), texts)
			})
		}
	})
}

// requireOneStatement runs each text as a new key's only phase (in one round trip and
// in two) and as a later phase.
func requireOneStatement(t *testing.T, b *pipeBundle, texts map[string]string) {
	t.Helper()
	for name, text := range texts {
		requireRefusedAlone(t, b, name, text, false)
		requireRefusedAlone(t, b, name+"-read", text, true)
		requireRefusedAfterCommit(t, b, name+"-later", text)
	}
	// Only the first phases' inserts ran, none of a refused text, not even rolled back.
	require.EqualValues(t, len(texts), seqRuns(t, b.db), "a refused statement ran")
}

// requireRefusedAlone: flow name's only phase queues text (with a result callback when
// read: two round trips); a new key's attempt is refused with no key row.
func requireRefusedAlone(t *testing.T, b *pipeBundle, name, text string, read bool) {
	t.Helper()
	require.NoError(t, b.engine.Register(phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			q := p.Queue(text, run.Scope(), run.Key())
			if read {
				q.Exec(phases.RowsAffected(1))
			}
			return phases.JSON(http.StatusCreated, "never")
		}),
	}}))
	req := pipeReq(name, `{}`)
	req.Flow = name
	sent := b.trips.sentToUser()
	_, err := b.engine.Do(context.Background(), req)
	requireStatementRefused(t, err, text)
	require.Equal(t, sent, b.trips.sentToUser(), "%s: the refused statement was sent", name)
	require.Zero(t, countKeysOf(t, b, name), "%s: the refused phase left a key row", name)
}

// requireRefusedAfterCommit: flow name's first phase commits an insert, its second
// queues text; the key is dead-lettered at the first phase, its one effect that one.
func requireRefusedAfterCommit(t *testing.T, b *pipeBundle, name, text string) {
	t.Helper()
	require.NoError(t, b.engine.Register(phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Pipelined("first", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'first', 0)`, run.Scope(), run.Key())
			return nil, nil
		}),
		phases.Pipelined("second", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(text, run.Scope(), run.Key())
			return phases.JSON(http.StatusCreated, "never")
		}),
	}}))
	req := pipeReq(name, `{}`)
	req.Flow = name
	sent := b.trips.sentToUser()
	_, err := b.engine.Do(context.Background(), req)
	requireStatementRefused(t, err, text)
	require.Equal(t, sent+1, b.trips.sentToUser(), "%s: only the first phase's insert was sent", name)
	st := testflow.State(t, b.pool, "acct", name)
	require.Equal(t, "first", st.RecoveryPoint, "%s: the recovery point moved", name)
	require.Equal(t, "dead", st.Status, "%s: a permanent refusal is not retried", name)
	require.False(t, st.HasLease)
	rows, err := b.pool.Query(context.Background(), `SELECT phase FROM pipe_effects WHERE idem_key = $1 ORDER BY id`, name)
	require.NoError(t, err)
	ran, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"first"}, ran, "%s: effects", name)
}

// requireStatementRefused: err is the engine's refusal of text, permanent, naming it.
func requireStatementRefused(t *testing.T, err error, text string) {
	t.Helper()
	require.ErrorIs(t, err, workflow.ErrRefused, "text %q", text)
	require.NotErrorIs(t, err, workflow.ErrTransient)
	require.ErrorContains(t, err, "refused before anything was sent")
	require.ErrorContains(t, err, "INSERT INTO pipe_effects", "the error names the statement")
}

// sentToUser is how many statements on pipe_effects were sent.
func (c *tripCounter) sentToUser() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.user
}
