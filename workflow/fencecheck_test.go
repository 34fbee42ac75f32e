package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The tests in this file hold Go-code tx phases to the fence-first rule: on a key whose
// row exists, the phase's transaction checks the executor's fence before the phase's
// first statement, in BEGIN's round trip, so that an executor whose lease was taken
// over runs none of the phase's statements; and the check locks nothing. The sequence
// of pipe_effects (pipeline_test.go) is the witness that a statement ran on the
// server, even one whose transaction rolled back.

// settleStmt is how a Go-code phase sends its first statement: each goes through a
// different path of the phase's transaction to the server.
type settleStmt func(ctx context.Context, tx phases.DBTX, run *phases.Run) error

const goInsert = `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, $3, 1)`

var settleStmts = map[string]settleStmt{
	// Arguments: pipelined with BEGIN and the check.
	"ExecArgs": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		_, err := tx.Exec(ctx, goInsert, run.Scope(), run.Key(), "settle")
		return err
	},
	"QueryRow": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		var id int64
		return tx.QueryRow(ctx, goInsert+` RETURNING id`, run.Scope(), run.Key(), "settle").Scan(&id)
	},
	// A batch: pipelined with BEGIN and the check too.
	"SendBatch": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		b := &pgx.Batch{}
		b.Queue(goInsert, run.Scope(), run.Key(), "settle")
		return tx.SendBatch(ctx, b).Close()
	},
	// No arguments, a savepoint: BEGIN and the check go in a round trip of their own
	// first.
	"ExecPlain": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ('%s', '%s', 'settle', 1)`,
			run.Scope(), run.Key()))
		return err
	},
	"Savepoint": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		sp, err := tx.(pgx.Tx).Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, goInsert, run.Scope(), run.Key(), "settle"); err != nil {
			return err
		}
		return sp.Commit(ctx)
	},
	// The phase's code drops the error and answers: nothing commits all the same.
	"Swallowed": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		_, _ = tx.Exec(ctx, goInsert, run.Scope(), run.Key(), "settle")
		return nil
	},
}

// goGateFlow is pipeFlow with Go-code tx phases: reserve inserts an effect row, pay
// (a call phase) runs gate for the key "stale" when gate is set, and settle sends its
// first statement with stmt, then answers 201.
func goGateFlow(name string, stmt settleStmt, gate func()) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Tx("reserve", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			_, err := tx.Exec(ctx, goInsert, run.Scope(), run.Key(), "reserve")
			return nil, err
		}),
		phases.Call("pay", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if gate != nil && run.Key() == "stale" {
				gate()
			}
			return nil, nil
		}),
		phases.Tx("settle", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if err := stmt(ctx, tx, run); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, map[string]string{"key": run.Key()})
		}),
	}}
}

// goReq is a request of the Go-code flow name.
func goReq(flow, key string) workflow.Request {
	r := pipeReq(key, `{"a":1}`)
	r.Flow = flow
	return r
}

// effectRows counts pipe_effects rows of key per phase.
func effectRows(t *testing.T, b *pipeBundle, key string) [2]int {
	t.Helper()
	var reserve, settle int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE phase = 'reserve'),
		count(*) FILTER (WHERE phase = 'settle') FROM pipe_effects WHERE idem_key = $1`, key).Scan(&reserve, &settle))
	return [2]int{reserve, settle}
}

// staleSettle runs the key "stale" of flow (registered on b with a gate in its call
// phase) up to the call, has another executor take the key over and finish it while
// the first waits in the call, then lets the first go on: it must answer lease lost
// and run none of settle's statements.
func staleSettle(t *testing.T, b *pipeBundle, flow string, inside, gate chan struct{}) {
	t.Helper()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(ctx, goReq(flow, "stale"))
		done <- err
	}()
	<-inside
	runsBefore := seqRuns(t, b.db)
	expireLease(t, b.db, "acct", "stale")
	res, err := b.engine.Resume(ctx, "acct", "stale")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.EqualValues(t, runsBefore+1, seqRuns(t, b.db), "the new owner ran settle")
	close(gate)
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost)
	require.EqualValues(t, runsBefore+1, seqRuns(t, b.db), "the stale executor ran none of settle's statements")
	require.Equal(t, [2]int{1, 1}, effectRows(t, b, "stale"))
	again, err := b.engine.Do(ctx, goReq(flow, "stale"))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, res.Response.Body, again.Response.Body)
}

// gated returns a gate for goGateFlow and the channels staleSettle drives it with.
func gated() (gate func(), inside, open chan struct{}) {
	inside, open = make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			close(inside)
			<-open
		}
	}, inside, open
}

// TestTxFenceCheckStale: an executor whose lease was taken over while it was in a call
// phase runs none of its next Go-code phase's statements, whichever way the phase
// sends its first one, and answers lease lost.
func TestTxFenceCheckStale(t *testing.T) {
	t.Parallel()
	for name, stmt := range settleStmts {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
			gate, inside, open := gated()
			require.NoError(t, b.engine.Register(goGateFlow("go_gate", stmt, gate)))
			staleSettle(t, b, "go_gate", inside, open)
		})
	}
}

// TestTxFenceCheckModes: in every query exec mode, straight on Postgres and through
// pgbouncer in transaction mode, a fresh key of the Go-code flow costs what it did
// before the check (the look-up, three round trips for reserve, two for settle: the
// check rides with BEGIN and settle's first statement), and a stale executor runs none
// of settle's statements.
func TestTxFenceCheckModes(t *testing.T) {
	t.Parallel()
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testTxFenceCheckMode(t, pipeSetup(t, mode, ""))
		})
	}
	t.Run("Pgbouncer", func(t *testing.T) {
		t.Parallel()
		pgtest.RequirePgbouncer(t)
		p, err := pgtest.SharedPgbouncer(context.Background())
		require.NoError(t, err)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(mode.String(), func(t *testing.T) {
				db := pgtest.NewDatabase(t)
				b := &pipeBundle{db: db, trips: &tripCounter{}}
				_, err := db.Pool.Exec(context.Background(), pipeSchema)
				require.NoError(t, err)
				testTxFenceCheckMode(t, pipeSetupOn(t, b, mode, p.URLFor(dbName(t, db), mode)))
			})
		}
	})
}

func testTxFenceCheckMode(t *testing.T, b *pipeBundle) {
	ctx := context.Background()
	gate, inside, open := gated()
	require.NoError(t, b.engine.Register(goGateFlow("go_gate", settleStmts["ExecArgs"], gate)))
	for i := range 3 {
		key := fmt.Sprintf("rt%d", i)
		before := b.trips.trips.Load()
		res, err := b.engine.Do(ctx, goReq("go_gate", key))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.EqualValues(t, 6, b.trips.trips.Load()-before,
			"look-up, BEGIN+claim, INSERT, key INSERT+COMMIT, BEGIN+check+INSERT, finish+COMMIT")
		require.Equal(t, [2]int{1, 1}, effectRows(t, b, key))
	}
	staleSettle(t, b, "go_gate", inside, open)
}

// TestTxFenceCheckLocksNothing: the check holds no lock on the key row while the
// phase's Go code runs, so a takeover meanwhile never waits; the commit's fenced write
// still refuses the executor it took the key from.
func TestTxFenceCheckLocksNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	inside, open := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(open) })
	defer release() // a failed check below must not leave the phase waiting
	var held atomic.Bool
	require.NoError(t, b.engine.Register(goGateFlow("go_hold", func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if err := settleStmts["ExecArgs"](ctx, tx, run); err != nil {
			return err
		}
		if run.Key() == "held" && held.CompareAndSwap(false, true) {
			close(inside) // the check and the statement ran; the transaction is open
			<-open
		}
		return nil
	}, nil)))
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(ctx, goReq("go_hold", "held"))
		done <- err
	}()
	<-inside
	_, err := b.db.Pool.Exec(ctx, `SELECT 1 FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'held' FOR UPDATE NOWAIT`)
	require.NoError(t, err, "the phase's transaction holds no lock on the key row")
	expireLease(t, b.db, "acct", "held")
	res, err := b.engine.Resume(ctx, "acct", "held")
	require.NoError(t, err, "the takeover did not wait")
	require.Equal(t, http.StatusCreated, res.Response.Status)
	release()
	err = <-done
	require.ErrorIs(t, err, workflow.ErrLeaseLost, "the commit's fence refused the first executor")
	require.False(t, errors.Is(err, workflow.ErrTransient))
	require.Equal(t, [2]int{1, 1}, effectRows(t, b, "held"))
}

// TestTxFenceCheckAgain: on a connection that has not prepared the phase's first
// statement, the fence's check comes back a round trip before that statement is sent
// (pgpipe keeps the statement from the server until the check passed). An executor
// paused in that round trip (here, as it reads the check's result) while its key is
// taken over and finished by another runs none of the phase's statements all the same:
// the check goes again at the head of the statement's round trip. Each first
// statement that rides with the check (arguments, a query, a batch) has its own text,
// new to every connection of the pool.
func TestTxFenceCheckAgain(t *testing.T) {
	t.Parallel()
	cold := map[string]settleStmt{
		"ExecArgs": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			_, err := tx.Exec(ctx, goInsert+` -- cold Exec`, run.Scope(), run.Key(), "settle")
			return err
		},
		"QueryRow": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			var id int64
			return tx.QueryRow(ctx, goInsert+` RETURNING id -- cold QueryRow`, run.Scope(), run.Key(), "settle").Scan(&id)
		},
		"SendBatch": func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			b := &pgx.Batch{}
			b.Queue(goInsert+` -- cold SendBatch`, run.Scope(), run.Key(), "settle")
			return tx.SendBatch(ctx, b).Close()
		},
	}
	for name, stmt := range cold {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
			require.NoError(t, b.engine.Register(goGateFlow("go_cold", stmt, nil)))
			inside, open := make(chan struct{}), make(chan struct{})
			var once atomic.Bool
			pause := func(d pgx.TraceBatchQueryData) {
				// The stale executor's check, read: settle's statement is not sent yet.
				if d.Err == nil && len(d.Args) == 5 && d.Args[1] == "stale" && strings.Contains(d.SQL, "1/count(*)") &&
					once.CompareAndSwap(false, true) {
					close(inside)
					<-open
				}
			}
			b.trips.onResult.Store(&pause)
			staleSettle(t, b, "go_cold", inside, open)
		})
	}
}
