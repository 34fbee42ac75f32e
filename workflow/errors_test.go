package workflow_test

import (
	"context"
	"errors"
	"go/token"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/gosource"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// The errors a caller branches on are the vocabulary's own values, not copies, and the
// key table's driver returns the same values.
func TestErrorsAreAliases(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ ours, store error }{
		"Unavailable":  {workflow.ErrUnavailable, keytable.ErrUnavailable},
		"Conflict":     {workflow.ErrConflict, keytable.ErrConflict},
		"LeaseLost":    {workflow.ErrLeaseLost, keytable.ErrLeaseLost},
		"NotFound":     {workflow.ErrNotFound, keytable.ErrNotFound},
		"Refused":      {workflow.ErrRefused, keytable.ErrRefused},
		"Misconfigred": {workflow.ErrMisconfigured, keytable.ErrMisconfigured},
		"ClaimBusy":    {workflow.ErrClaimBusy, keytable.ErrClaimBusy},
		"ClaimExists":  {workflow.ErrClaimExists, keytable.ErrClaimExists},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.True(t, tc.ours == tc.store, "%v is a copy of %v", tc.ours, tc.store)
		})
	}
}

// publicErrors is every exported error variable of package workflow: the value, the
// vocabulary's value it must be, and its class.
var publicErrors = map[string]struct {
	ours, vocab error
	class       workflow.Class
}{
	"ErrInvalidKey":           {workflow.ErrInvalidKey, vocab.ErrInvalidKey, workflow.ClassClientFault},
	"ErrInvalidScope":         {workflow.ErrInvalidScope, vocab.ErrInvalidScope, workflow.ClassClientFault},
	"ErrControlCharacter":     {workflow.ErrControlCharacter, vocab.ErrControlCharacter, workflow.ClassClientFault},
	"ErrInvalidRequest":       {workflow.ErrInvalidRequest, vocab.ErrInvalidRequest, workflow.ClassClientFault},
	"ErrBodyNotJSON":          {workflow.ErrBodyNotJSON, vocab.ErrBodyNotJSON, workflow.ClassClientFault},
	"ErrBodyTooLarge":         {workflow.ErrBodyTooLarge, vocab.ErrBodyTooLarge, workflow.ClassClientFault},
	"ErrMismatch":             {workflow.ErrMismatch, vocab.ErrMismatch, workflow.ClassClientFault},
	"ErrNotFound":             {workflow.ErrNotFound, vocab.ErrNotFound, workflow.ClassClientFault},
	"ErrInProgress":           {workflow.ErrInProgress, vocab.ErrInProgress, workflow.ClassRetry},
	"ErrNewerFormat":          {workflow.ErrNewerFormat, vocab.ErrNewerFormat, workflow.ClassRetry},
	"ErrUnknownRecoveryPoint": {workflow.ErrUnknownRecoveryPoint, vocab.ErrUnknownRecoveryPoint, workflow.ClassRetry},
	"ErrTransient":            {workflow.ErrTransient, vocab.ErrTransient, workflow.ClassRetry},
	"ErrLeaseExpired":         {workflow.ErrLeaseExpired, vocab.ErrLeaseExpired, workflow.ClassRetry},
	"ErrLeaseLost":            {workflow.ErrLeaseLost, vocab.ErrLeaseLost, workflow.ClassRetry},
	"ErrClaimBusy":            {workflow.ErrClaimBusy, vocab.ErrClaimBusy, workflow.ClassRetry},
	"ErrClaimExists":          {workflow.ErrClaimExists, vocab.ErrClaimExists, workflow.ClassRetry},
	"ErrConflict":             {workflow.ErrConflict, vocab.ErrConflict, workflow.ClassRetry},
	"ErrUnavailable":          {workflow.ErrUnavailable, vocab.ErrUnavailable, workflow.ClassRetry},
	"ErrOverloaded":           {workflow.ErrOverloaded, vocab.ErrOverloaded, workflow.ClassRetry},
	"ErrDraining":             {workflow.ErrDraining, vocab.ErrDraining, workflow.ClassRetry},
	"ErrStandbyBehind":        {workflow.ErrStandbyBehind, vocab.ErrStandbyBehind, workflow.ClassRetry},
	"ErrDeadLettered":         {workflow.ErrDeadLettered, vocab.ErrDeadLettered, workflow.ClassDeadLettered},
	"ErrResponseTooLarge":     {workflow.ErrResponseTooLarge, vocab.ErrResponseTooLarge, workflow.ClassServerFault},
	"ErrPhaseDataTooLarge":    {workflow.ErrPhaseDataTooLarge, vocab.ErrPhaseDataTooLarge, workflow.ClassServerFault},
	"ErrNoResponse":           {workflow.ErrNoResponse, vocab.ErrNoResponse, workflow.ClassServerFault},
	"ErrUnstorable":           {workflow.ErrUnstorable, vocab.ErrUnstorable, workflow.ClassServerFault},
	"ErrNeedsClient":          {workflow.ErrNeedsClient, vocab.ErrNeedsClient, workflow.ClassServerFault},
	"ErrUnknownFlow":          {workflow.ErrUnknownFlow, vocab.ErrUnknownFlow, workflow.ClassServerFault},
	"ErrOpenSealed":           {workflow.ErrOpenSealed, vocab.ErrOpenSealed, workflow.ClassServerFault},
	"ErrMisconfigured":        {workflow.ErrMisconfigured, vocab.ErrMisconfigured, workflow.ClassServerFault},
	"ErrRefused":              {workflow.ErrRefused, vocab.ErrRefused, workflow.ClassServerFault},

	// The operator API's errors: no attempt returns them. An operator's request that
	// does not apply to the keys as they are, or here, is the caller's fault; a
	// compensation that failed is the flow's.
	"ErrUnknownStatus":       {workflow.ErrUnknownStatus, vocab.ErrUnknownStatus, workflow.ClassClientFault},
	"ErrWrongStatus":         {workflow.ErrWrongStatus, vocab.ErrWrongStatus, workflow.ClassClientFault},
	"ErrInvalidCursor":       {workflow.ErrInvalidCursor, vocab.ErrInvalidCursor, workflow.ClassClientFault},
	"ErrEmptyFilter":         {workflow.ErrEmptyFilter, vocab.ErrEmptyFilter, workflow.ClassClientFault},
	"ErrCallMayHaveRun":      {workflow.ErrCallMayHaveRun, vocab.ErrCallMayHaveRun, workflow.ClassClientFault},
	"ErrCompensationUnknown": {workflow.ErrCompensationUnknown, vocab.ErrCompensationUnknown, workflow.ClassClientFault},
	"ErrCompensationFailed":  {workflow.ErrCompensationFailed, vocab.ErrCompensationFailed, workflow.ClassServerFault},
}

// Every error an attempt can return is the vocabulary's value, so it has the class the
// engine gave it; an exported error added to the package without an entry in
// publicErrors fails here.
func TestEveryErrorIsClassified(t *testing.T) {
	t.Parallel()
	var names []string
	for _, name := range gosource.ExportedVars(gosource.Files(t, token.NewFileSet(), ".")) {
		if strings.HasPrefix(name, "Err") {
			names = append(names, name)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e, ok := publicErrors[name]
			require.True(t, ok, "%s is not in publicErrors: make it the vocabulary's (internal/vocab) and class it there", name)
			if e.vocab != nil {
				require.True(t, e.ours == e.vocab, "%s is a copy of the vocabulary's value", name)
			}
			require.Equal(t, e.class, workflow.Classify(e.ours), "%s", name)
		})
	}
	require.Len(t, names, len(publicErrors), "every exported error of the package is in publicErrors")
}

func TestErrorsMatchThroughTheEngine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Unavailable", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		// Nothing listens on port 1: every connection is refused.
		pool, err := pgxpool.New(ctx, "postgres://idemflow@127.0.0.1:1/idemflow?connect_timeout=5")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		e := b.newEngine(t, setupOpts{pool: pool})
		_, err = e.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.ErrorIs(t, err, workflow.ErrUnavailable)
		_, err = e.Resume(ctx, "acct", "k")
		require.ErrorIs(t, err, workflow.ErrUnavailable)
	})

	t.Run("Conflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{
			cfg: &workflow.Config{TxRetries: -1},
			before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
				if run.Phase() != testflow.Settle {
					return nil
				}
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
				return err
			},
		})
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
		require.ErrorIs(t, err, workflow.ErrConflict)
	})

	// A statement the database refuses for good (here an undefined function, 42883; on
	// Citus a statement it cannot run on one shard, 0A000) is not transient: the key is
	// dead-lettered with the refusal, and no sweep takes it again.
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{
			before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
				if run.Phase() != testflow.Settle {
					return nil
				}
				_, err := tx.Exec(ctx, `SELECT idemflow_no_such_function()`)
				return err
			},
		})
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.ErrorIs(t, err, workflow.ErrRefused)
		var te *workflow.TransientError
		require.False(t, errors.As(err, &te), "a refusal is not transient: %v", err)
		require.ErrorContains(t, err, "permanently")
		st := testflow.State(t, b.db.Pool, "acct", "k")
		require.Equal(t, keytable.StatusDead, st.Status)
		require.NotNil(t, st.LastError)
		require.Contains(t, *st.LastError, "refused")
		sweepable(t, b.db)
		taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: -1})
		require.NoError(t, err)
		require.Empty(t, taken)
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		_, err := b.engine.Resume(ctx, "acct", "none")
		require.ErrorIs(t, err, workflow.ErrNotFound)
		require.ErrorIs(t, b.engine.Redrive(ctx, "acct", "none"), workflow.ErrNotFound)
		require.Equal(t, 1, strings.Count(err.Error(), "not found"), err.Error())
	})
}

// A lost lease is named once in the message, however many layers saw it.
func TestLeaseLostIsNamedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// The fenced commit of a zombie: TestZombieCannotCommit checks its message.

	t.Run("SweptKeyFinishedByItsClient", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.provider.FailNext(1)
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
		sweepable(t, b.db)
		taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 1})
		require.NoError(t, err)
		require.Len(t, taken, 1)
		sweepable(t, b.db)
		_, err = b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.NoError(t, err)

		out, err := b.engine.Maintenance().Run(ctx, taken[0], &workflow.RunOpts{MaxAttempts: 1})
		require.NoError(t, err)
		require.Equal(t, workflow.OutcomeLeaseLost, out.Outcome)
		require.ErrorIs(t, out.Err, workflow.ErrLeaseLost)
		require.Equal(t, 1, strings.Count(out.Err.Error(), "lease lost"), out.Err.Error())
	})

	t.Run("ReleaseAfterFailure", func(t *testing.T) {
		// A failed attempt whose release finds the key taken over.
		t.Parallel()
		var lost atomic.Bool
		var b *bundle
		b = setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Settle && lost.CompareAndSwap(false, true) {
				// Someone else takes the key over (lock version moves) while this
				// attempt runs; its failure's release is then fenced off.
				if _, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET lock_version = lock_version + 1`); err != nil {
					return err
				}
				return errors.New("settle failed")
			}
			return nil
		}})
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.ErrorIs(t, err, workflow.ErrLeaseLost)
		require.Equal(t, 1, strings.Count(err.Error(), "lease lost"), err.Error())
	})
}
