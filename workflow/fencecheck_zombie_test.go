package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// The child program "fencezombie": the test flow's request in a real process that
// pauses itself (SIGSTOP) in its call phase, at the point named by envZombiePoint.
const (
	envZombieDB       = "IDEMFLOW_FENCE_ZOMBIE_DB"
	envZombieProvider = "IDEMFLOW_FENCE_ZOMBIE_PROVIDER"
	envZombiePoint    = "IDEMFLOW_FENCE_ZOMBIE_POINT"
)

// zombieLine is what the child prints: "settle" when it starts its settle phase, and
// "answer" with how its attempt ended.
type zombieLine struct {
	Event     string
	LeaseLost bool
	Status    int
	Err       string
}

// witness is the test flow's Before: settle's first statement takes a value of the
// sequence fence_witness, which no rollback gives back, so the sequence counts the
// settle phases whose statements the server ran.
func witness(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
	if tx == nil || run.Phase() != testflow.Settle {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT nextval($1::regclass)`, "fence_witness")
	return err
}

func init() {
	childproc.Register("fencezombie", func() {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, os.Getenv(envZombieDB))
		if err != nil {
			childproc.Fail("connect", err)
		}
		defer pool.Close()
		hooks := childproc.NewPoints(os.Getenv(envZombiePoint), 0, func(string) { childproc.Stop() }).Hooks(workflow.Hooks{
			PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
				if ev.Phase == testflow.Settle {
					childproc.Emit(zombieLine{Event: "settle"})
				}
				return ctx
			},
		})
		e, err := workflow.New(pool, &workflow.Config{Hooks: hooks})
		if err != nil {
			childproc.Fail("engine", err)
		}
		if err := e.Register(testflow.Flow(testflow.Options{ProviderURL: os.Getenv(envZombieProvider), Before: witness})); err != nil {
			childproc.Fail("register", err)
		}
		res, err := e.Do(ctx, chargeReq("acct", "zombie", `{"amount":900}`))
		line := zombieLine{Event: "answer", LeaseLost: errors.Is(err, workflow.ErrLeaseLost)}
		if err != nil {
			line.Err = err.Error()
		} else {
			line.Status = res.Response.Status
		}
		childproc.Emit(line)
	})
}

// TestTxFenceCheckZombie pauses a real process (SIGSTOP) in its call phase, before or
// after the call, lets its lease run out by the database clock, has a retry or a
// sweep take the key over and finish it, then lets the process go on (SIGCONT). The
// zombie starts its settle phase, runs none of its statements (the witness sequence
// says so), changes nothing and answers lease lost; every effect happened once.
func TestTxFenceCheckZombie(t *testing.T) {
	t.Parallel()
	for _, point := range []string{testflow.Pay + "/" + childproc.BeforeCall, testflow.Pay + "/" + childproc.AfterCall} {
		for _, by := range []string{"Retry", "Sweep"} {
			t.Run(strings.ReplaceAll(point, "/", "_")+"/"+by, func(t *testing.T) {
				t.Parallel()
				testTxFenceCheckZombie(t, point, by == "Sweep")
			})
		}
	}
}

func testTxFenceCheckZombie(t *testing.T, point string, sweep bool) {
	ctx := context.Background()
	b := setup(t, setupOpts{before: witness})
	_, err := b.db.Pool.Exec(ctx, `CREATE SEQUENCE fence_witness`)
	require.NoError(t, err)
	zombie := childproc.Start(t, "^$", childproc.Program("fencezombie"),
		envZombieDB+"="+b.db.URL, envZombieProvider+"="+b.provider.URL, envZombiePoint+"="+point)
	zombie.Paused(t)
	st := state(t, b.db, "acct", "zombie")
	require.Equal(t, testflow.Reserve, st.RecoveryPoint)
	require.True(t, st.HasLease)

	expireLease(t, b.db, "acct", "zombie") // by the database clock
	var res workflow.Result
	if sweep {
		taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: -1})
		require.NoError(t, err)
		require.Len(t, taken, 1)
		res, err = b.engine.Maintenance().Run(ctx, taken[0], nil)
		require.NoError(t, err)
	} else {
		r, err := b.engine.Do(ctx, chargeReq("acct", "zombie", `{"amount":900}`))
		require.NoError(t, err)
		require.False(t, r.Replayed)
		res = *r
	}
	require.Equal(t, 201, res.Response.Status)
	require.EqualValues(t, 1, witnessRuns(t, b), "the new owner's settle")
	row := keyRow(t, b.db, "acct", "zombie")

	var settled, answered bool
	for _, l := range zombie.Resume(t) {
		var zl zombieLine
		require.NoError(t, json.Unmarshal(l, &zl))
		switch zl.Event {
		case "settle":
			settled = true
		case "answer":
			answered = true
			require.True(t, zl.LeaseLost, "the zombie answered %+v", zl)
		}
	}
	require.True(t, settled, "the zombie started its settle phase")
	require.True(t, answered)
	require.EqualValues(t, 1, witnessRuns(t, b), "the zombie ran none of settle's statements")
	require.Equal(t, row, keyRow(t, b.db, "acct", "zombie"), "the zombie changed the key row")
	requireOneEffect(t, b, "acct", "zombie")

	replay, err := b.engine.Do(ctx, chargeReq("acct", "zombie", `{"amount":900}`))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, res.Response.Body, replay.Response.Body)
}

// witnessRuns is how many values fence_witness gave out.
func witnessRuns(t *testing.T, b *bundle) int64 {
	t.Helper()
	var n int64
	var called bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT last_value, is_called FROM fence_witness`).Scan(&n, &called))
	if !called {
		return 0
	}
	return n
}
