package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// pgxTxSetup is a schema with a table of notes (unique names, so a duplicate fails),
// and an engine whose hooks count each phase's successful commits.
type pgxTxSetup struct {
	db      *pgtest.DB
	engine  *workflow.Engine
	commits map[string]*atomic.Int32
}

func newPgxTxSetup(t *testing.T, flow func(s *pgxTxSetup) phases.Flow, phaseNames ...string) *pgxTxSetup {
	t.Helper()
	s := &pgxTxSetup{db: pgtest.New(t), commits: map[string]*atomic.Int32{}}
	for _, p := range phaseNames {
		s.commits[p] = &atomic.Int32{}
	}
	_, err := s.db.Pool.Exec(context.Background(), `CREATE TABLE notes (name text PRIMARY KEY)`)
	require.NoError(t, err)
	e, err := workflow.New(s.db.Pool, &workflow.Config{Hooks: workflow.Hooks{
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if err == nil {
				s.commits[ev.Phase].Add(1)
			}
		},
	}})
	require.NoError(t, err)
	require.NoError(t, e.Register(flow(s)))
	s.engine = e
	return s
}

func (s *pgxTxSetup) notes(t *testing.T) []string {
	t.Helper()
	rows, err := s.db.Pool.Query(context.Background(), `SELECT name FROM notes ORDER BY name`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func note(ctx context.Context, db phases.DBTX, name string) error {
	_, err := db.Exec(ctx, `INSERT INTO notes (name) VALUES ($1)`, name)
	return err
}

func noteReq(key string) workflow.Request {
	return workflow.Request{Scope: "s", Key: key, Flow: "notes", Method: "POST", Route: "/notes", Body: []byte(`{}`)}
}

func TestPhaseTxAsPgxTx(t *testing.T) {
	t.Parallel()
	t.Run("Savepoints", testPhaseTxSavepoints)
	for _, op := range []string{"Commit", "Rollback"} {
		t.Run("Refuses"+op, func(t *testing.T) { testPhaseTxRefuses(t, op) })
	}
	t.Run("ConnAndAfterThePhase", testPhaseTxConnAndAfterThePhase)
}

// testPhaseTxSavepoints: a phase's pgx.Tx opens savepoints (Begin, nested, and
// pgx.BeginFunc), in the first phase of a new key and in a later one.
func testPhaseTxSavepoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var closedErr error
	s := newPgxTxSetup(t, func(*pgxTxSetup) phases.Flow {
		return phases.Flow{Name: "notes", Phases: []phases.Phase{
			// The first phase of a new key: BEGIN went with the claim.
			phases.Tx("first", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
				tx := db.(pgx.Tx)
				if err := note(ctx, tx, "first"); err != nil {
					return nil, err
				}
				undone, err := tx.Begin(ctx)
				if err != nil {
					return nil, err
				}
				if err := note(ctx, undone, "first-rolled-back"); err != nil {
					return nil, err
				}
				if err := undone.Rollback(ctx); err != nil {
					return nil, err
				}
				kept, err := tx.Begin(ctx)
				if err != nil {
					return nil, err
				}
				if err := note(ctx, kept, "first-kept"); err != nil {
					return nil, err
				}
				inner, err := kept.Begin(ctx) // nested, like pgx's own
				if err != nil {
					return nil, err
				}
				if err := note(ctx, inner, "first-inner-rolled-back"); err != nil {
					return nil, err
				}
				if err := inner.Rollback(ctx); err != nil {
					return nil, err
				}
				if err := kept.Commit(ctx); err != nil {
					return nil, err
				}
				closedErr = note(ctx, kept, "after-commit")
				return nil, nil
			}),
			// A later phase: BEGIN is still unsent when the savepoint opens.
			phases.Tx("second", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
				tx := db.(pgx.Tx)
				// pgx.BeginFunc, as code written for a pgx.Tx uses it: a failed
				// statement rolls back to the savepoint and the phase goes on.
				err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return note(ctx, sp, "first") })
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
					return nil, errors.Join(errors.New("want a unique violation"), err)
				}
				if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return note(ctx, sp, "second") }); err != nil {
					return nil, err
				}
				return phases.JSON(201, map[string]string{"ok": "yes"})
			}),
		}}
	}, "first", "second")

	res, err := s.engine.Do(ctx, noteReq("k"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.ErrorIs(t, closedErr, pgx.ErrTxClosed, "a committed savepoint is closed")
	require.Equal(t, []string{"first", "first-kept", "second"}, s.notes(t))
	require.EqualValues(t, 1, s.commits["first"].Load(), "each phase commits once")
	require.EqualValues(t, 1, s.commits["second"].Load())
}

// testPhaseTxRefuses: the phase's pgx.Tx refuses op (Commit or Rollback): the
// transaction is untouched, and the phase fails whatever it returned.
func testPhaseTxRefuses(t *testing.T, op string) {
	t.Parallel()
	ctx := context.Background()
	var refuse atomic.Bool
	refuse.Store(true)
	var refusal error
	s := newPgxTxSetup(t, func(*pgxTxSetup) phases.Flow {
		return phases.Flow{Name: "notes", Phases: []phases.Phase{
			phases.Tx("only", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
				tx := db.(pgx.Tx)
				if err := note(ctx, tx, "written"); err != nil {
					return nil, err
				}
				if refuse.Load() {
					if op == "Commit" {
						refusal = tx.Commit(ctx)
					} else {
						refusal = tx.Rollback(ctx)
					}
					// The transaction is untouched by the refusal.
					if err := note(ctx, tx, "after-refusal"); err != nil {
						return nil, err
					}
				}
				return phases.JSON(201, map[string]string{"ok": "yes"}) // ignores the refusal
			}),
		}}
	}, "only")

	_, err := s.engine.Do(ctx, noteReq("k"))
	require.ErrorIs(t, refusal, phases.ErrTxManaged)
	require.Contains(t, refusal.Error(), "the engine owns the phase's transaction")
	require.ErrorIs(t, err, workflow.ErrTransient, "the phase fails whatever it returned")
	require.ErrorIs(t, err, phases.ErrTxManaged)
	require.Empty(t, s.notes(t), "nothing of the phase committed")
	require.Zero(t, s.commits["only"].Load())

	refuse.Store(false)
	res, err := s.engine.Do(ctx, noteReq("k"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, []string{"written"}, s.notes(t))
	require.EqualValues(t, 1, s.commits["only"].Load())
}

// testPhaseTxConnAndAfterThePhase: Conn is the transaction's connection, and the
// pgx.Tx and its savepoints are closed once the phase ends.
func testPhaseTxConnAndAfterThePhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var kept pgx.Tx
	var sp pgx.Tx
	s := newPgxTxSetup(t, func(*pgxTxSetup) phases.Flow {
		return phases.Flow{Name: "notes", Phases: []phases.Phase{
			phases.Tx("only", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
				tx := db.(pgx.Tx)
				var pid uint32
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return nil, err
				}
				if tx.Conn() == nil || tx.Conn().PgConn().PID() != pid {
					return nil, errors.New("Conn is not the transaction's connection")
				}
				var err error
				if sp, err = tx.Begin(ctx); err != nil {
					return nil, err
				}
				if sp.Conn() != tx.Conn() {
					return nil, errors.New("a savepoint's Conn is not the transaction's")
				}
				kept = tx
				return phases.JSON(201, map[string]string{"ok": "yes"})
			}),
		}}
	}, "only")
	_, err := s.engine.Do(ctx, noteReq("k"))
	require.NoError(t, err)
	require.Nil(t, kept.Conn(), "the connection went back to the pool")
	_, err = kept.Begin(ctx)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.ErrorIs(t, kept.Commit(ctx), pgx.ErrTxClosed)
	_, err = sp.Exec(ctx, `SELECT 1`)
	require.ErrorIs(t, err, pgx.ErrTxClosed, "a savepoint ends with its phase")
}
