package workflow_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// txControlForm sends, through a Go-code tx phase's transaction, a statement that
// would end or open the phase's transaction. key is the attempt's key, for texts that
// also write.
type txControlForm func(ctx context.Context, tx pgx.Tx, key string) error

// txControlForms are the statements a Go-code tx phase may not send, through each of
// its transaction's entry points.
var txControlForms = map[string]txControlForm{
	"commit":                  execForm("COMMIT"),
	"rollback":                execForm("ROLLBACK"),
	"end":                     execForm("END"),
	"abort":                   execForm("ABORT"),
	"rollback-work-and-chain": execForm("rollback work and chain"),
	"begin":                   execForm("BEGIN"),
	"start-transaction":       execForm("START TRANSACTION"),
	"prepare-transaction":     execForm("PREPARE TRANSACTION 'idemflow_txctl'"),
	"commit-prepared":         execForm("COMMIT PREPARED 'idemflow_txctl'"),
	"rollback-prepared":       execForm("ROLLBACK PREPARED 'idemflow_txctl'"),
	"commented-commit":        execForm("/* c */ COMMIT"),
	"line-comment-commit":     execForm("-- c\ncommit;"),
	"insert-then-commit": func(ctx context.Context, tx pgx.Tx, key string) error {
		// No arguments: pgx sends it with the simple protocol in every exec mode, as one
		// query string, so the server would run both.
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO txctl_effects (idem_key, what) VALUES ('%s', 'multi'); COMMIT`, key))
		return err
	},
	"query": func(ctx context.Context, tx pgx.Tx, _ string) error {
		rows, err := tx.Query(ctx, "COMMIT")
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		return err
	},
	"query-row": func(ctx context.Context, tx pgx.Tx, _ string) error {
		var n int
		return tx.QueryRow(ctx, "END").Scan(&n)
	},
	"batch": func(ctx context.Context, tx pgx.Tx, key string) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO txctl_effects (idem_key, what) VALUES ($1, 'batch')`, key)
		b.Queue("COMMIT")
		return tx.SendBatch(ctx, b).Close()
	},
	"prepare": func(ctx context.Context, tx pgx.Tx, _ string) error {
		_, err := tx.Prepare(ctx, "txctl_commit", "COMMIT")
		return err
	},
	"savepoint-exec": func(ctx context.Context, tx pgx.Tx, _ string) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		_, err = sp.Exec(ctx, "COMMIT")
		return err
	},
	"rewriter": func(ctx context.Context, tx pgx.Tx, _ string) error {
		_, err := tx.Exec(ctx, "SELECT 1", pgx.QueryExecModeExec, commitRewriter{})
		return err
	},
	"query-rewriter": func(ctx context.Context, tx pgx.Tx, _ string) error {
		rows, err := tx.Query(ctx, "SELECT 1", commitRewriter{})
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		return err
	},
	"batch-rewriter": func(ctx context.Context, tx pgx.Tx, _ string) error {
		b := &pgx.Batch{}
		b.Queue("SELECT 1", commitRewriter{})
		return tx.SendBatch(ctx, b).Close()
	},
	"savepoint-batch": func(ctx context.Context, tx pgx.Tx, _ string) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		b := &pgx.Batch{}
		b.Queue("ROLLBACK")
		return sp.SendBatch(ctx, b).Close()
	},
}

// commitRewriter rewrites any statement into COMMIT.
type commitRewriter struct{}

func (commitRewriter) RewriteQuery(context.Context, *pgx.Conn, string, []any) (string, []any, error) {
	return "COMMIT", nil, nil
}

func execForm(sql string) txControlForm {
	return func(ctx context.Context, tx pgx.Tx, _ string) error {
		_, err := tx.Exec(ctx, sql)
		return err
	}
}

// TestGoPhaseTxControl: a Go-code tx phase's statement that would end or open its
// transaction (COMMIT, END, ROLLBACK, ABORT, BEGIN, PREPARE TRANSACTION and the rest,
// behind comments or after another statement, through Exec, Query, QueryRow,
// SendBatch, Prepare and a savepoint) is refused with phases.ErrTxManaged before it is
// sent, in every exec mode: the phase fails, whatever its code made of the refusal,
// and nothing of it commits. A new key is left with no key row, an existing key at the
// recovery point it had. Savepoints' statements and multi-statement texts without
// transaction control still run.
func TestGoPhaseTxControl(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := newTxControlSetup(t, mode)
			for name, form := range txControlForms {
				t.Run(name, func(t *testing.T) {
					s.requireRefusedNew(t, name, form)
					s.requireRefusedLater(t, name, form)
				})
			}
			s.requireAllowed(t)
		})
	}
}

// txControlSetup is a schema with a table of effects and an engine on a pool in one
// exec mode. refusals holds what each key's form returned to the phase's code.
type txControlSetup struct {
	db       *pgtest.DB
	pool     *pgxpool.Pool
	engine   *workflow.Engine
	mu       sync.Mutex
	refusals map[string]error
}

func newTxControlSetup(t *testing.T, mode pgx.QueryExecMode) *txControlSetup {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE txctl_effects (id bigserial PRIMARY KEY, idem_key text NOT NULL, what text NOT NULL)`)
	require.NoError(t, err)
	pool := poolInMode(t, db, mode)
	e, err := workflow.New(pool, &workflow.Config{})
	require.NoError(t, err)
	return &txControlSetup{db: db, pool: pool, engine: e, refusals: map[string]error{}}
}

// effectPhase is a Go-code tx phase that writes the effect what for its key and, with
// no form, goes on; else sends form, records what it returned, and returns a response
// whatever it was: the refusal must fail the phase on its own.
func (s *txControlSetup) effectPhase(name, what string, form txControlForm) phases.Phase {
	return phases.Tx(name, func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
		tx := db.(pgx.Tx)
		if _, err := tx.Exec(ctx, `INSERT INTO txctl_effects (idem_key, what) VALUES ($1, $2)`, run.Key(), what); err != nil {
			return nil, err
		}
		if form == nil {
			return nil, nil // on to the next phase
		}
		err := form(ctx, tx, run.Key())
		s.mu.Lock()
		s.refusals[run.Key()] = err
		s.mu.Unlock()
		return phases.JSON(201, map[string]string{"ok": "yes"})
	})
}

// requireRefusedNew: form in a new key's only phase; no key row, no effect.
func (s *txControlSetup) requireRefusedNew(t *testing.T, name string, form txControlForm) {
	t.Helper()
	flow := "new-" + name
	require.NoError(t, s.engine.Register(phases.Flow{Name: flow, Phases: []phases.Phase{
		s.effectPhase("only", "write", form),
	}}))
	_, err := s.engine.Do(context.Background(), txControlReq(flow))
	s.requireRefused(t, flow, err)
	var keys int
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM idemflow_keys WHERE idempotency_key = $1`, flow).Scan(&keys))
	require.Zero(t, keys, "%s: the refused phase left a key row", flow)
	require.Empty(t, s.effects(t, flow), "%s: something of the refused phase committed", flow)
}

// requireRefusedLater: form in a key's second phase, after the first committed; the
// key stays at the first phase's recovery point with that phase's effect only.
func (s *txControlSetup) requireRefusedLater(t *testing.T, name string, form txControlForm) {
	t.Helper()
	flow := "later-" + name
	require.NoError(t, s.engine.Register(phases.Flow{Name: flow, Phases: []phases.Phase{
		s.effectPhase("first", "first", nil),
		s.effectPhase("second", "write", form),
	}}))
	_, err := s.engine.Do(context.Background(), txControlReq(flow))
	s.requireRefused(t, flow, err)
	st := testflow.State(t, s.pool, "s", flow)
	require.Equal(t, "first", st.RecoveryPoint, "%s: the recovery point moved", flow)
	require.Equal(t, []string{"first"}, s.effects(t, flow), "%s: something of the refused phase committed", flow)
}

// requireRefused: the form was refused with ErrTxManaged naming the statement, and
// the attempt failed with it.
func (s *txControlSetup) requireRefused(t *testing.T, key string, err error) {
	t.Helper()
	s.mu.Lock()
	refusal, ran := s.refusals[key]
	s.mu.Unlock()
	require.True(t, ran, "%s: the form did not run", key)
	require.ErrorIs(t, refusal, phases.ErrTxManaged, "%s: the statement was not refused", key)
	require.ErrorContains(t, refusal, "refused before anything was sent", key)
	require.ErrorIs(t, err, phases.ErrTxManaged, "%s: the attempt did not fail with the refusal", key)
	require.ErrorIs(t, err, workflow.ErrTransient, "%s: the phase fails as after a refused Commit", key)
}

// requireAllowed: savepoints' statements and a multi-statement text without
// transaction control run, and the phase commits once.
func (s *txControlSetup) requireAllowed(t *testing.T) {
	t.Helper()
	const flow = "allowed"
	require.NoError(t, s.engine.Register(phases.Flow{Name: flow, Phases: []phases.Phase{
		phases.Tx("only", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
			ins := fmt.Sprintf(`INSERT INTO txctl_effects (idem_key, what) VALUES ('%s', '%%s')`, run.Key())
			for _, sql := range []string{
				"SAVEPOINT a",
				fmt.Sprintf(ins, "undone"),
				"ROLLBACK TO a",
				fmt.Sprintf(ins, "kept") + "; " + fmt.Sprintf(ins, "kept-too"),
				"/* c */ SAVEPOINT c",
				fmt.Sprintf(ins, "undone-c"),
				"/* c */ ROLLBACK WORK TO SAVEPOINT c",
				"RELEASE a",
				"savepoint b; " + fmt.Sprintf(ins, "undone-b") + "; rollback transaction to b; release savepoint b",
			} {
				if _, err := db.Exec(ctx, sql); err != nil {
					return nil, fmt.Errorf("%s: %w", sql, err)
				}
			}
			// A rewriter's statement is checked once rewritten, and then sent.
			named := `INSERT INTO txctl_effects (idem_key, what) VALUES (@key, @what)`
			if _, err := db.Exec(ctx, named, pgx.NamedArgs{"key": run.Key(), "what": "named"}); err != nil {
				return nil, fmt.Errorf("named arguments: %w", err)
			}
			b := &pgx.Batch{}
			b.Queue(named, pgx.NamedArgs{"key": run.Key(), "what": "named-batch"})
			if err := db.SendBatch(ctx, b).Close(); err != nil {
				return nil, fmt.Errorf("named arguments in a batch: %w", err)
			}
			var what string
			if err := db.QueryRow(ctx, `SELECT what FROM txctl_effects WHERE idem_key = @key AND what = 'named'`, pgx.NamedArgs{"key": run.Key()}).Scan(&what); err != nil {
				return nil, fmt.Errorf("named arguments in a query: %w", err)
			}
			return phases.JSON(201, map[string]string{"ok": "yes"})
		}),
	}}))
	res, err := s.engine.Do(context.Background(), txControlReq(flow))
	require.NoError(t, err, "an allowed statement was refused")
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, []string{"kept", "kept-too", "named", "named-batch"}, s.effects(t, flow))
}

func (s *txControlSetup) effects(t *testing.T, key string) []string {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), `SELECT what FROM txctl_effects WHERE idem_key = $1 ORDER BY id`, key)
	require.NoError(t, err)
	what, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return what
}

func txControlReq(key string) workflow.Request {
	return workflow.Request{Scope: "s", Key: key, Flow: key, Method: "POST", Route: "/txctl", Body: []byte(`{}`)}
}
