package reliability

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// Regression tests for the bugs the suite found. Each fails until its fix lands.

// TestSweeperPassBoundedOnHalfOpenConnection: a sweeper pass runs keys under the
// background loop's context, which has no deadline, and the engine adds none to a tx
// phase's statements or its COMMIT. A connection that goes half-open while a swept key's
// tx phase runs (the server's side is gone, the client's side never hears of it) blocks
// the pass for good (in the wild: until TCP keepalive gives up, minutes; through a
// middlebox that acknowledges keepalives, forever), and with it the whole sweeper loop:
// no other key is swept. Invariant 6 (liveness). The bound is checked on the deadlines
// of the pass's waits on the database (at most a lease or the engine's clean-up bound
// away), not on the clock; stuckLimit only ends a pass blocked for good.
//
// The lease is what ends the half-open COMMIT, so the pass waits it out; it is long
// because it also bounds every step before the fault: no call starts with less than a
// tenth of it left, and it is the deadline of each tx phase's transaction. A lease of
// 2 s let a machine that stalled the sweep 1.8 s before its call refuse the call (or
// a stall inside finalize's transaction cancel its statements), so finalize never
// reached its COMMIT and the fault never fired (shown by a temporary 1.9 s sleep
// before the call's lease check).
func TestSweeperPassBoundedOnHalfOpenConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	proxy := env.proxy()
	var cut atomic.Bool
	cfg := &workflow.Config{Lease: settleBound, Hooks: workflow.Hooks{
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
			if ev.Phase == chargeflow.PhaseFinalize && cut.CompareAndSwap(false, true) {
				proxy.HalfOpen() // the COMMIT about to be sent will never be answered
			}
		},
	}}
	dl := &deadlines{}
	en := env.engine(env.pool(poolOpts{via: proxy, deadlines: dl}), cfg)
	req := request("acct", "k", chargeflow.FlowName, 100)
	env.provider.FailNext(1)
	_, err := env.do(ctx, en, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	env.expireLease(t, "acct", "k")
	dl.reset() // the sweep's waits only

	sw := env.sweeper(en, nil)
	done := make(chan error, 1)
	go func() {
		_, err := sw.RunOnce(context.Background()) // as the background loop runs it: no deadline
		done <- err
	}()
	timer := time.NewTimer(stuckLimit)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Errorf("the sweeper pass is still blocked %s after its connection went half-open", stuckLimit)
		_ = proxy.Close() // unblock it, so that the test can end
		<-done
	}
	require.True(t, cut.Load(), "the fault fired")
	dl.requireWithin(t, max(cfg.Lease, settleBound))
	t.Logf("sweeper pass on a half-open connection: %s", dl)
}

// TestHandlerBoundedOnHalfOpenConnection: idemhttp.Handler runs the flow under
// context.WithoutCancel(r.Context()), with no deadline, so that the flow outlives a
// client that went away; nothing else bounds its statements. A connection that goes
// half-open under a COMMIT blocks the request's goroutine for good, and the client
// never gets its 503. Invariant 6. As above, the bound is checked on the deadlines of
// the request's waits on the database, and stuckLimit only ends a request blocked for
// good.
//
// The lease is long for the reason given above: a lease of 2 s let a stall of 2 s in
// create's transaction cancel its statements before its COMMIT, so the fault never
// fired (shown by a temporary 2.1 s sleep before the phase's function).
func TestHandlerBoundedOnHalfOpenConnection(t *testing.T) {
	t.Parallel()
	env := newEnv(t, pgtest.New(t))
	proxy := env.proxy()
	var cut atomic.Bool
	cfg := &workflow.Config{Lease: settleBound, Hooks: workflow.Hooks{
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
			if ev.Phase == chargeflow.PhaseCreate && cut.CompareAndSwap(false, true) {
				proxy.HalfOpen()
			}
		},
	}}
	dl := &deadlines{}
	en := env.engine(env.pool(poolOpts{via: proxy, deadlines: dl}), cfg)
	h, err := idemhttp.Handler(en, chargeflow.FlowName, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "acct", nil }})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer proxy.Close() // first: unblocks a stuck handler so that srv.Close can return

	req := request("acct", "k", chargeflow.FlowName, 100)
	hr, err := http.NewRequest(http.MethodPost, srv.URL+chargesRoute, bytes.NewReader(req.Body))
	require.NoError(t, err)
	hr.Header.Set("Idempotency-Key", "k")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: stuckLimit}).Do(hr)
	require.True(t, cut.Load(), "the fault fired")
	if err != nil {
		t.Errorf("no answer %s after the connection went half-open under a COMMIT: %v", stuckLimit, err)
		return
	}
	resp.Body.Close()
	require.Contains(t, []int{201, 503}, resp.StatusCode)
	dl.requireWithin(t, max(cfg.Lease, settleBound))
	t.Logf("handler on a half-open connection: %s", dl)
}

// TestUnknownCommitResolvedWithOneConnection: when a COMMIT's acknowledgement is lost,
// the engine re-reads the key to learn whether it committed (exec.resolve) — but it
// does so while still holding the connection the failed transaction ran on (txOnce,
// finishAlone and the claim's commit before a call release it only when they return),
// and after a failed finishAlone it releases the key (exec.transient) with that
// connection still held too. With a pool of one connection the re-read waits for
// itself until its 10s timeout, the outcome stays unknown and the client gets a 503 for
// a charge that was made; with N connections, N such executors stall the whole pool
// for 10s (TestPoolExhaustion's longest attempt: deadline + 10s). STYLE.md: "never call
// the pool from inside a transaction".
func TestUnknownCommitResolvedWithOneConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	proxy := env.proxy()
	var armed atomic.Bool
	cfg := &workflow.Config{Hooks: workflow.Hooks{
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
			if ev.Phase == chargeflow.PhaseFinalize && armed.CompareAndSwap(false, true) {
				proxy.DropNextCommitAck()
			}
		},
	}}
	pool := env.pool(poolOpts{via: proxy, maxConns: 1})
	en := env.engine(pool, cfg)
	res, err := env.do(ctx, en, request("acct", "k", chargeflow.FlowName, 100))
	require.EqualValues(t, 1, proxy.Dropped(), "the fault fired")
	require.NoError(t, err, "the engine re-reads the key and learns that the commit happened")
	require.Equal(t, 201, res.Response.Status)
	// With one connection, a re-read that waited for the connection its own transaction
	// held could only give up (its context ends): pgxpool counts that acquire as
	// canceled. Counted, not timed, so that a slow machine cannot fail it.
	require.Zero(t, pool.Stat().CanceledAcquireCount(), "the re-read waited for the connection its own transaction held")
}
