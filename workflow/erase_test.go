package workflow_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// scopeKeys counts the key rows of scope.
func scopeKeys(t *testing.T, db *pgtest.DB, scope string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idemflow_keys WHERE scope = $1`, scope).Scan(&n))
	return n
}

// TestEraseScope: bad scopes are refused, changing nothing; a dry run counts what
// the erasure then does; without force the finished and dead-lettered keys of the
// scope go and the one in progress stays; forced, the key a paused holder leases goes
// too, and the holder, let go, cannot commit (fenced) nor bring the row back; another
// scope is untouched throughout.
func TestEraseScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for _, k := range []string{"f1", "f2", "f3"} {
		_, err := b.engine.Do(ctx, chargeReq("subject", k, `{"amount":3}`))
		require.NoError(t, err)
	}
	_, err := b.engine.Do(ctx, chargeReq("other", "f1", `{"amount":3}`))
	require.NoError(t, err)
	deadKeys(t, b, "subject", "d1", "d2")
	deadKeys(t, b, "other", "d1")
	others := map[string]string{"f1": keyRow(t, b.db, "other", "f1"), "d1": keyRow(t, b.db, "other", "d1")}

	h := testflow.NewHolder("held")
	e := b.newEngine(t, setupOpts{before: h.Before})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, chargeReq("subject", "held", `{"amount":4}`))
		done <- err
	}()
	<-h.Entered
	held := keyRow(t, b.db, "subject", "held")

	for _, bad := range []string{"", "a\x00b", strings.Repeat("s", 256), "\xff"} {
		_, err := b.engine.EraseScope(ctx, bad, workflow.EraseOptions{Force: true})
		require.ErrorIs(t, err, workflow.ErrInvalidScope, "%q", bad)
	}
	require.Equal(t, 6, scopeKeys(t, b.db, "subject"), "a refused erasure changes nothing")

	dry, err := b.engine.EraseScope(ctx, "subject", workflow.EraseOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, workflow.EraseResult{Erased: 5, Left: 1}, dry)
	require.Equal(t, 6, scopeKeys(t, b.db, "subject"), "a dry run changes nothing")

	res, err := b.engine.EraseScope(ctx, "subject", workflow.EraseOptions{})
	require.NoError(t, err)
	require.Equal(t, dry, res, "erased what the dry run counted")
	require.Equal(t, 1, scopeKeys(t, b.db, "subject"))
	require.Equal(t, held, keyRow(t, b.db, "subject", "held"), "the key in progress is left as it was")

	dry, err = b.engine.EraseScope(ctx, "subject", workflow.EraseOptions{Force: true, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, workflow.EraseResult{Erased: 1, Fenced: 1}, dry)
	res, err = b.engine.EraseScope(ctx, "subject", workflow.EraseOptions{Force: true})
	require.NoError(t, err)
	require.Equal(t, workflow.EraseResult{Erased: 1, Fenced: 1}, res)
	require.Zero(t, scopeKeys(t, b.db, "subject"))

	h.Let()
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost, "the holder's commit is fenced")
	require.Zero(t, scopeKeys(t, b.db, "subject"), "the holder brought no row back")
	require.Equal(t, testflow.Effects{Ledger: 1}, effects(t, b.db, "subject", "held"), "nothing settled by the holder")
	for k, row := range others {
		require.Equal(t, row, keyRow(t, b.db, "other", k), "%s: another scope is untouched", k)
	}
	again, err := b.engine.EraseScope(ctx, "subject", workflow.EraseOptions{Force: true})
	require.NoError(t, err)
	require.Zero(t, again, "nothing left to erase")
}

// TestEraseScopeBatches: a scope of more keys than one statement deletes is erased
// whole, batch after batch, and the count is exact.
func TestEraseScopeBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(ctx, chargeReq("many", "k", `{"amount":1}`))
	require.NoError(t, err)
	_, err = b.engine.Do(ctx, chargeReq("other", "k", `{"amount":1}`))
	require.NoError(t, err)
	// Copies of the finished key under 1100 more keys: two full batches and a part.
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
		SELECT (jsonb_populate_record(NULL::idemflow_keys, to_jsonb(k)
			|| jsonb_build_object('idempotency_key', 'k' || g, 'id', gen_random_uuid()))).*
		FROM idemflow_keys k, generate_series(1, 1100) g
		WHERE scope = 'many' AND idempotency_key = 'k'`)
	require.NoError(t, err)
	require.Equal(t, 1101, scopeKeys(t, b.db, "many"))

	res, err := b.engine.EraseScope(ctx, "many", workflow.EraseOptions{})
	require.NoError(t, err)
	require.Equal(t, workflow.EraseResult{Erased: 1101}, res)
	require.Zero(t, scopeKeys(t, b.db, "many"))
	require.Equal(t, 1, scopeKeys(t, b.db, "other"))
}
