package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
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

// The child program "draincall": the pay-first flow's request, or the test flow's, in
// a real process that begins a drain at the point envDrainPoint names ("claimed": the
// commit of the claim; "call": PhaseStart of the call, after the standby wait) and
// then pauses itself (SIGSTOP) before its call phase goes on.
const (
	envDrainDB       = "IDEMFLOW_DRAIN_CALL_DB"
	envDrainProvider = "IDEMFLOW_DRAIN_CALL_PROVIDER"
	envDrainPoint    = "IDEMFLOW_DRAIN_CALL_POINT"
	envDrainFlow     = "IDEMFLOW_DRAIN_CALL_FLOW"
)

// drainLine is what the child prints once its attempt ended.
type drainLine struct {
	Draining  bool
	LeaseLost bool
	Err       string
}

func init() {
	childproc.Register("draincall", func() {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, os.Getenv(envDrainDB))
		if err != nil {
			childproc.Fail("connect", err)
		}
		defer pool.Close()
		var e *workflow.Engine
		point := os.Getenv(envDrainPoint)
		drainAndStop := func(at string) {
			if at != point {
				return
			}
			go func() { _ = e.Drain(ctx) }()
			for !workflow.Draining(e) {
				runtime.Gosched()
			}
			childproc.Stop()
		}
		e, err = workflow.New(pool, &workflow.Config{Hooks: workflow.Hooks{
			Key: func(_ context.Context, ev workflow.KeyEvent) {
				if ev.Kind == workflow.OutcomeClaimed {
					drainAndStop("claimed")
				}
			},
			PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
				if ev.Kind == phases.KindCall {
					drainAndStop("call")
				}
				return ctx
			},
		}})
		if err != nil {
			childproc.Fail("engine", err)
		}
		o := testflow.Options{ProviderURL: os.Getenv(envDrainProvider)}
		if err := errors.Join(e.Register(testflow.Flow(o)), e.Register(testflow.PayFirst(o))); err != nil {
			childproc.Fail("register", err)
		}
		req := chargeReq("acct", "zombie", `{"amount":900}`)
		req.Flow = os.Getenv(envDrainFlow)
		_, err = e.Do(ctx, req)
		line := drainLine{Draining: errors.Is(err, workflow.ErrDraining), LeaseLost: errors.Is(err, workflow.ErrLeaseLost)}
		if err != nil {
			line.Err = err.Error()
		}
		childproc.Emit(line)
	})
}

// TestDrainJustBeforeCallCrash: a real process begins a drain right after the claim's
// commit, or right after the standby wait, and is paused there (SIGSTOP) with its
// lease held. Once the lease ran out by the database clock, another process's retry or
// a sweep takes the key over and finishes it; then the paused process goes on
// (SIGCONT): it starts no call (the provider saw the derived key once, from the new
// owner), changes nothing (its release is fenced) and answers. One payment, one
// ledger row.
func TestDrainJustBeforeCallCrash(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, flow, point, rp string }{
		{"PayFirstAfterClaimCommit", testflow.PayFirstName, "claimed", phases.Started},
		{"PayFirstAfterStandbyWait", testflow.PayFirstName, "call", phases.Started},
		{"AfterStandbyWait", testflow.Name, "call", testflow.Reserve},
	} {
		for _, by := range []string{"Retry", "Sweep"} {
			t.Run(c.name+"/"+by, func(t *testing.T) {
				t.Parallel()
				testDrainCallCrash(t, c.flow, c.point, c.rp, by == "Sweep")
			})
		}
	}
}

func testDrainCallCrash(t *testing.T, flow, point, rp string, sweep bool) {
	ctx := context.Background()
	b := setup(t, setupOpts{})
	require.NoError(t, b.engine.Register(testflow.PayFirst(testflow.Options{ProviderURL: b.provider.URL})))
	zombie := childproc.Start(t, "^$", childproc.Program("draincall"),
		envDrainDB+"="+b.db.URL, envDrainProvider+"="+b.provider.URL, envDrainPoint+"="+point, envDrainFlow+"="+flow)
	zombie.Paused(t)
	st := state(t, b.db, "acct", "zombie")
	require.Equal(t, rp, st.RecoveryPoint)
	require.True(t, st.HasLease)
	require.Zero(t, b.provider.Made())

	expireLease(t, b.db, "acct", "zombie") // by the database clock
	req := chargeReq("acct", "zombie", `{"amount":900}`)
	req.Flow = flow
	if sweep {
		taken, err := b.engine.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: -1})
		require.NoError(t, err)
		require.Len(t, taken, 1)
		res, err := b.engine.Maintenance().Run(ctx, taken[0], nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
	} else {
		res, err := b.engine.Do(ctx, req)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
	}
	row := keyRow(t, b.db, "acct", "zombie")

	lines := zombie.Resume(t)
	require.Len(t, lines, 1)
	var zl drainLine
	require.NoError(t, json.Unmarshal(lines[0], &zl))
	require.True(t, zl.Draining || zl.LeaseLost, "the paused attempt answered %+v", zl)
	require.Equal(t, row, keyRow(t, b.db, "acct", "zombie"), "the paused attempt changed the key row")
	call := testflow.Pay
	if flow == testflow.PayFirstName {
		call = testflow.PayFirstCharge
	}
	derived := keyID(t, b, "zombie") + ":" + call
	require.Equal(t, 1, b.provider.Requests(derived), "the paused attempt called after the drain began")
	require.Equal(t, 1, b.provider.Made())
	require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, effects(t, b.db, "acct", "zombie"))
}
