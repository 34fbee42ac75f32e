package workflow_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
)

// TestReviewPipelinedLock: LOCK, which the server runs only inside a transaction
// block (25P01 in an implicit transaction), works in a pipelined phase as it did when
// every phase began with BEGIN, and makes one effect.
func TestReviewPipelinedLock(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
	require.NoError(t, b.engine.Register(phases.Flow{Name: "lock", Phases: []phases.Phase{
		phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			// A nested comment hides the LOCK from the engine's prefix check (blockOnly):
			// the server's refusal of the implicit batch sends it again with BEGIN.
			p.Queue(`/* /* nested */ */ LOCK TABLE pipe_effects IN SHARE ROW EXCLUSIVE MODE`)
			p.Queue(insert, run.Scope(), run.Key(), 1)
			return phases.JSON(http.StatusCreated, "locked")
		}),
	}}))
	req := pipeReq("lock", `{}`)
	req.Flow = "lock"
	_, err := b.engine.Do(context.Background(), req)
	require.NoError(t, err)
	_, err = b.engine.Do(context.Background(), req)
	require.NoError(t, err, "a replay")
	require.Equal(t, 1, countKeysOf(t, b, "lock"))
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pipe_effects`).Scan(&n))
	require.Equal(t, 1, n, "one effect: the implicit batch that LOCK refused rolled back whole")
}

// lockFlow: two one-round-trip pipelined phases whose first statement is LOCK: the
// first goes with BEGIN from the start (blockOnly), the second's LOCK hides behind a
// nested comment, so its implicit batch is refused whole and sent again with BEGIN.
func lockFlow() phases.Flow {
	phase := func(name string, answer bool) phases.Phase {
		return phases.Pipelined(name, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			lock := `LOCK TABLE pipe_effects IN ROW EXCLUSIVE MODE`
			if answer {
				lock = `/* /* nested */ */ ` + lock
			}
			p.Queue(lock)
			p.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, $3, 1)`, run.Scope(), run.Key(), name)
			if answer {
				return phases.JSON(http.StatusCreated, "locked")
			}
			return nil, nil
		})
	}
	return phases.Flow{Name: "lockflow", Phases: []phases.Phase{phase("first", false), phase("second", true)}}
}

// TestReviewPipelinedLockCrashMatrix kills a real child process at every boundary of
// lockFlow, whose phases go through the refused implicit batch and its resend with
// BEGIN, and recovers each key: one effect per phase and key.
func TestReviewPipelinedLockCrashMatrix(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, pipeSchema)
	flow := lockFlow()
	cases := 0
	req := pipeReq("lockcrash", `{}`)
	req.Flow = flow.Name
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    flow,
		Request: req,
		Check: func(t testing.TB, c *idemflowtest.Case) {
			cases++
			var first, second int
			require.NoError(t, c.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE phase = 'first'),
				count(*) FILTER (WHERE phase = 'second') FROM pipe_effects WHERE scope = $1 AND idem_key = $2`,
				c.Request.Scope, c.Request.Key).Scan(&first, &second))
			require.Equal(t, [2]int{1, 1}, [2]int{first, second}, "effects per key")
			require.Equal(t, http.StatusCreated, c.Answer.Status)
		},
	})
	require.Equal(t, len(idemflowtest.Boundaries(flow))*3, cases)
}
