package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// The child program "txctlcrash": the flow txControlCrashFlow (crashing) for the key
// "k", in a real process whose phase sends COMMIT after its effect and is then
// killed (SIGKILL) inside the phase, before the engine's commit.
const (
	envTxCtlDB    = "IDEMFLOW_TXCTL_DB"
	envTxCtlApp   = "IDEMFLOW_TXCTL_APP"
	envTxCtlLater = "IDEMFLOW_TXCTL_LATER"
)

// txCtlLine is what the child prints right before it is killed.
type txCtlLine struct {
	Refused bool // the COMMIT was refused with phases.ErrTxManaged
	Err     string
}

func init() {
	childproc.Register("txctlcrash", func() {
		ctx := context.Background()
		cfg, err := pgxpool.ParseConfig(os.Getenv(envTxCtlDB))
		if err != nil {
			childproc.Fail("config", err)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(envTxCtlApp)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			childproc.Fail("connect", err)
		}
		e, err := workflow.New(pool, &workflow.Config{})
		if err != nil {
			childproc.Fail("engine", err)
		}
		if err := e.Register(txControlCrashFlow(os.Getenv(envTxCtlLater) != "", true)); err != nil {
			childproc.Fail("register", err)
		}
		_, err = e.Do(ctx, txControlReq("k"))
		childproc.Fail("the phase was not killed", err)
	})
}

// txControlCrashFlow: an optional first phase that writes the effect "first", then the
// phase "write" that writes the effect "write"; crashing, it then sends COMMIT, reports
// what that returned and kills the process.
func txControlCrashFlow(later, crashing bool) phases.Flow {
	var ps []phases.Phase
	if later {
		ps = append(ps, phases.Tx("first", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
			_, err := db.Exec(ctx, `INSERT INTO txctl_effects (idem_key, what) VALUES ($1, 'first')`, run.Key())
			return nil, err
		}))
	}
	ps = append(ps, phases.Tx("write", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
		if _, err := db.Exec(ctx, `INSERT INTO txctl_effects (idem_key, what) VALUES ($1, 'write')`, run.Key()); err != nil {
			return nil, err
		}
		if crashing {
			_, err := db.Exec(ctx, "COMMIT")
			line := txCtlLine{Refused: errors.Is(err, phases.ErrTxManaged)}
			if err != nil {
				line.Err = err.Error()
			}
			childproc.Emit(line)
			childproc.Kill()
		}
		return phases.JSON(http.StatusCreated, map[string]string{"ok": "yes"})
	}))
	return phases.Flow{Name: "k", Phases: ps}
}

// TestGoPhaseTxControlCrash: a real process's Go-code phase writes its effect, sends
// COMMIT and is killed (SIGKILL) before the engine's commit. The COMMIT is refused, so
// nothing of the phase committed: a new key has no key row, an existing one is at its
// previous recovery point, and the retry (another engine, after the server ended the
// dead process's sessions and, for an existing key, once its lease ran out) runs the
// phase again: exactly one effect. Before the refusal, the COMMIT committed the effect
// without the recovery point and the retry wrote it a second time.
func TestGoPhaseTxControlCrash(t *testing.T) {
	t.Parallel()
	for _, later := range []bool{false, true} {
		name := "NewKey"
		if later {
			name = "ExistingKey"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testGoPhaseTxControlCrash(t, later)
		})
	}
}

func testGoPhaseTxControlCrash(t *testing.T, later bool) {
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE txctl_effects (id bigserial PRIMARY KEY, idem_key text NOT NULL, what text NOT NULL)`)
	require.NoError(t, err)
	app := "txctl_" + db.Schema
	env := []string{childproc.Program("txctlcrash"), envTxCtlDB + "=" + db.URL, envTxCtlApp + "=" + app}
	if later {
		env = append(env, envTxCtlLater+"=1")
	}
	child := childproc.Start(t, "^$", env...)
	var line txCtlLine
	child.Next(t, 2*time.Minute, &line) // a deadline for a hung child only
	killed, _ := child.Killed(t)
	require.True(t, killed, "the child was not killed in its phase")
	require.True(t, line.Refused, "the phase's COMMIT was not refused: %q", line.Err)
	childproc.WaitSessionsGone(t, db.Pool, app)

	effectsOf := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT what FROM txctl_effects WHERE idem_key = 'k' ORDER BY id`)
		require.NoError(t, err)
		what, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return what
	}
	want := []string{"write"}
	if later {
		want = []string{"first", "write"}
		require.Equal(t, []string{"first"}, effectsOf(), "the killed phase's effect committed")
		require.Equal(t, "first", testflow.State(t, db.Pool, "s", "k").RecoveryPoint)
		expireLease(t, db, "s", "k")
	} else {
		require.Empty(t, effectsOf(), "the killed phase's effect committed")
	}

	e, err := workflow.New(db.Pool, &workflow.Config{})
	require.NoError(t, err)
	require.NoError(t, e.Register(txControlCrashFlow(later, false)))
	res, err := e.Do(ctx, txControlReq("k"))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.Equal(t, want, effectsOf(), "each effect exactly once")
	require.Equal(t, "finished", testflow.State(t, db.Pool, "s", "k").Status)
}
