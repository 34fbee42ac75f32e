package workflow_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestDrainJustBeforeCall: the drain check that guards a call phase is the last thing
// before the call's function runs. A drain that begins right after the commit of the
// claim that precedes the call (the pay-first flow's claim, committed alone; the
// Claimed key event) or right after the standby wait (PhaseStart of the call) starts
// no call: the provider never sees the derived key, and the attempt releases its key
// at its recovery point (a *TransientError with ErrDraining). Another engine's retry,
// or its sweeper, then finishes the key with one payment.
func TestDrainJustBeforeCall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		flow string
		at   string // "claimed" or "call"
		rp   string // the recovery point the drained attempt leaves
	}{
		{name: "PayFirstAfterClaimCommit", flow: testflow.PayFirstName, at: "claimed", rp: phases.Started},
		{name: "PayFirstAfterStandbyWait", flow: testflow.PayFirstName, at: "call", rp: phases.Started},
		{name: "AfterStandbyWait", flow: testflow.Name, at: "call", rp: testflow.Reserve},
	} {
		for _, by := range []string{"Retry", "Sweeper"} {
			t.Run(c.name+"/"+by, func(t *testing.T) {
				t.Parallel()
				requireDrainedBeforeCall(t, c.flow, c.at, c.rp, by == "Sweeper")
			})
		}
	}
}

func requireDrainedBeforeCall(t *testing.T, flow, at, rp string, sweep bool) {
	ctx := context.Background()
	var e atomic.Pointer[workflow.Engine]
	drained := make(chan (<-chan error), 1)
	drainAt := func(point string) {
		if point == at && len(drained) == 0 {
			drained <- startDrain(ctx, e.Load())
		}
	}
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{
		Key: func(_ context.Context, ev workflow.KeyEvent) {
			if ev.Kind == workflow.OutcomeClaimed {
				drainAt("claimed")
			}
		},
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				drainAt("call")
			}
			return ctx
		},
	}}})
	e.Store(b.engine)
	require.NoError(t, b.engine.Register(testflow.PayFirst(testflow.Options{ProviderURL: b.provider.URL})))
	req := chargeReq("acct", "k1", `{"amount":5}`)
	req.Flow = flow

	_, err := b.engine.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.ErrorIs(t, err, workflow.ErrDraining)
	require.Len(t, drained, 1, "the drain did not begin at %s", at)
	require.NoError(t, <-<-drained)
	require.Zero(t, b.provider.Made(), "a call started after the drain began")
	st := state(t, b.db, "acct", "k1")
	require.Equal(t, "in_progress", st.Status)
	require.Equal(t, rp, st.RecoveryPoint)
	require.False(t, st.HasLease, "the drained attempt kept its lease")
	call := testflow.Pay
	if flow == testflow.PayFirstName {
		call = testflow.PayFirstCharge
	}
	derived := keyID(t, b, "k1") + ":" + call
	require.Zero(t, b.provider.Requests(derived), "the provider saw the derived key")

	other := b.newEngine(t, setupOpts{})
	require.NoError(t, other.Register(testflow.PayFirst(testflow.Options{ProviderURL: b.provider.URL})))
	if sweep {
		testflow.Sweepable(t, b.db.Pool)
		stats, err := other.Sweep(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, 1, stats.Finished)
	}
	res, err := other.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.Equal(t, sweep, res.Replayed)
	require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, effects(t, b.db, "acct", "k1"))
	require.Equal(t, 1, b.provider.Made(), "one payment")
	_, paid := b.provider.Effect(derived)
	require.True(t, paid, "the payment was not made under the key's derived key")
}

// keyID is the key row's id, what its derived keys are built from.
func keyID(t *testing.T, b *bundle, key string) string {
	t.Helper()
	var id string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT id::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&id))
	return id
}
