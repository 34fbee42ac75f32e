package reliability

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestDrainAfterStandbyWait runs a primary with a streaming standby and
// Config.StandbyWait set: a drain that begins once the standby confirmed the commit
// that precedes the call (the wait returned; PhaseStart of the call, the hook right
// after it) starts no call. The attempt answers ErrDraining, not ErrStandbyBehind (so
// the wait did pass), the provider never sees the derived key, the key is released at
// its recovery point, and another engine's retry finishes it with one payment.
func TestDrainAfterStandbyWait(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := startPrimary(ctx, t)
	standby, err := pgtest.StartStandby(ctx, primary, primary.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	pool, err := pgxpool.New(ctx, primary.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, migrations.Migrate(ctx, pool))
	require.NoError(t, testflow.CreateTables(ctx, pool))
	remote := idemflowtest.NewRemote(t, nil)
	waitCaughtUp(ctx, t, pool)

	for _, flow := range []string{testflow.PayFirstName, testflow.Name} {
		t.Run(flow, func(t *testing.T) {
			drainAfterStandbyWait(ctx, t, pool, remote, flow)
		})
	}
}

func drainAfterStandbyWait(ctx context.Context, t *testing.T, pool *pgxpool.Pool, remote *idemflowtest.Remote, flow string) {
	var e atomic.Pointer[workflow.Engine]
	drained := make(chan error, 1)
	began := false
	cfg := &workflow.Config{StandbyWait: time.Minute, Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind != phases.KindCall || began {
				return ctx
			}
			began = true
			go func() { drained <- e.Load().Drain(context.Background()) }()
			for { // a Resume is refused, sending nothing, once the drain began
				if _, err := e.Load().Resume(ctx, "acct", "probe"); errors.Is(err, workflow.ErrDraining) {
					return ctx
				}
			}
		},
	}}
	e.Store(testflow.Engine(t, pool, cfg, remote, nil))
	require.NoError(t, e.Load().Register(testflow.PayFirst(testflow.Options{ProviderURL: remote.URL})))
	req := workflow.Request{Scope: "acct", Key: "drain-" + flow, Flow: flow, Method: "POST", Route: "/charges", Body: []byte(`{"amount":5}`)}
	made := remote.Made()

	_, err := e.Load().Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrDraining)
	require.NotErrorIs(t, err, workflow.ErrStandbyBehind)
	require.NoError(t, <-drained)
	require.Equal(t, made, remote.Made(), "a call started after the drain began")
	st := testflow.State(t, pool, "acct", req.Key)
	require.Equal(t, "in_progress", st.Status)
	require.False(t, st.HasLease)

	other := testflow.Engine(t, pool, &workflow.Config{StandbyWait: time.Minute}, remote, nil)
	require.NoError(t, other.Register(testflow.PayFirst(testflow.Options{ProviderURL: remote.URL})))
	res, err := other.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.Equal(t, made+1, remote.Made(), "one payment")
	e2, err := testflow.CountEffects(ctx, pool, "acct", req.Key)
	require.NoError(t, err)
	require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, e2)
}
