package workflow_test

import (
	"context"
	"testing"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
	"github.com/stretchr/testify/require"
)

// Zero in the takeover's options means what it means in workflow.SweeperConfig, and the
// deprecated sweeper names are the same values.
func TestSweepDefaultsMatchTheSweeper(t *testing.T) {
	t.Parallel()
	require.Equal(t, workflow.SweepGraceDefault, workflow.TakeoverGraceDefault)
	require.Equal(t, workflow.SweepMaxAttemptsDefault, workflow.TakeoverMaxAttemptsDefault)
	require.Equal(t, workflow.SweepGraceDefault, workflow.SweepGraceDefault)
	require.Equal(t, workflow.SweepMaxAttemptsDefault, workflow.SweepMaxAttemptsDefault)
}

// released makes every in-progress key due now, its lease gone, claimed age ago by the
// database clock.
func released(t *testing.T, db *pgtest.DB, age string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		UPDATE idemflow_keys
		SET created_at = statement_timestamp() - $1::interval,
			next_attempt_at = statement_timestamp() - interval '1 millisecond',
			locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END
		WHERE status = 'in_progress'`, age)
	require.NoError(t, err)
}

func TestSweepOptsGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.provider.FailNext(1)
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.ErrorIs(t, err, workflow.ErrTransient)

	released(t, b.db, "1 second")
	taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, taken, "zero grace is the default, 5s")

	released(t, b.db, "10 seconds")
	taken, err = b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: 0})
	require.NoError(t, err)
	require.Len(t, taken, 1, "past the default grace")
	require.NoError(t, b.engine.Maintenance().GiveBack(ctx, taken[0]))

	released(t, b.db, "0 seconds")
	taken, err = b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: -1})
	require.NoError(t, err)
	require.Len(t, taken, 1, "-1 means no grace")
	require.NoError(t, b.engine.Maintenance().GiveBack(ctx, taken[0]))
}

func TestRunTakenOptsMaxAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		opts *workflow.RunOpts
		want workflow.Outcome
	}{
		"NilIsTheDefault":  {nil, workflow.OutcomeDeadLettered},
		"ZeroIsTheDefault": {&workflow.RunOpts{}, workflow.OutcomeDeadLettered},
		"MinusOneIsNever":  {&workflow.RunOpts{MaxAttempts: -1}, workflow.OutcomeReleased},
		"MoreThanTaken":    {&workflow.RunOpts{MaxAttempts: workflow.SweepMaxAttemptsDefault + 1}, workflow.OutcomeReleased},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			b.provider.FailNext(1)
			_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
			require.ErrorIs(t, err, workflow.ErrTransient)
			// The takeover makes this the default's last attempt.
			_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET attempts = $1`, workflow.SweepMaxAttemptsDefault-1)
			require.NoError(t, err)
			released(t, b.db, "1 hour")
			taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 1})
			require.NoError(t, err)
			require.Len(t, taken, 1)
			require.Equal(t, workflow.SweepMaxAttemptsDefault, taken[0].Attempts)

			b.provider.FailNext(1)
			res, err := b.engine.Maintenance().Run(ctx, taken[0], tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.want, res.Outcome)
		})
	}
}
