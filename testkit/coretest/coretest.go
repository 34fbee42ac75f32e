// Package coretest is the engine's core cases (a fresh request, its replay, a
// mismatch, a key in progress, a transient failure resumed by a retry, a key finished
// by the sweeper) as one suite that runs wherever the caller puts the key table: on
// each of pgx's query exec modes, behind a connection pooler, in a named schema.
//
// This package imports idemflow's phases, workflow, sweeper and idemflowtest packages,
// and testkit/testflow.
package coretest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// Env is where one case runs: a database (or schema) of its own, migrated, with
// testflow's tables.
type Env struct {
	// Pool is what the engine and the sweeper run on.
	Pool workflow.Pool
	// DB is what the case reads the key table and the effects through. It must see the
	// engine's tables unqualified (its search_path, or the default schema).
	DB testflow.DB
	// Schema is the engine's Schema option ("" for the default); the sweeper works on
	// its engine's.
	Schema string
	// Provider is the fake provider the flow pays through.
	Provider *idemflowtest.Remote
}

// Run runs every core case as a subtest of t, each on the Env that newEnv makes for it.
func Run(t *testing.T, newEnv func(t *testing.T) *Env) {
	cases := []struct {
		name string
		run  func(t *testing.T, c *kit)
	}{
		{"FreshThenReplay", freshThenReplay},
		{"Mismatch", mismatch},
		{"InProgress", inProgress},
		{"WaitForOtherEngine", waitForOtherEngine},
		{"TransientThenResume", transientThenResume},
		{"SweeperTakesOver", sweeperTakesOver},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t)
			c := &kit{Env: env, ctx: context.Background()}
			c.engine = c.newEngine(t, nil)
			tc.run(t, c)
		})
	}
}

type kit struct {
	*Env
	ctx    context.Context
	engine *workflow.Engine
}

func (c *kit) newEngine(t *testing.T, before func(context.Context, phases.DBTX, *phases.Run) error) *workflow.Engine {
	return testflow.Engine(t, c.Pool, &workflow.Config{Schema: c.Schema}, c.Provider, before)
}

func req(key, body string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
}

func freshThenReplay(t *testing.T, c *kit) {
	first, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.NoError(t, err)
	require.False(t, first.Replayed)
	require.Equal(t, 201, first.Response.Status)
	again, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Response.Body, again.Response.Body)
	require.Equal(t, first.Response.Header.Get("Location"), again.Response.Header.Get("Location"))
	testflow.RequireOneEffect(t, c.DB, c.Provider, "acct", "k")
	require.Equal(t, "finished", testflow.State(t, c.DB, "acct", "k").Status)
}

func mismatch(t *testing.T, c *kit) {
	_, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.NoError(t, err)
	row := testflow.KeyRow(t, c.DB, "acct", "k")
	_, err = c.engine.Do(c.ctx, req("k", `{"amount":501}`))
	require.ErrorIs(t, err, workflow.ErrMismatch)
	require.Equal(t, row, testflow.KeyRow(t, c.DB, "acct", "k"), "a mismatch writes nothing")
}

// inProgress holds a key in its call phase while a second attempt is turned away.
func inProgress(t *testing.T, c *kit) {
	inCall, release := make(chan struct{}), make(chan struct{})
	holder := c.newEngine(t, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			close(inCall)
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := holder.Do(c.ctx, req("k", `{"amount":500}`))
		done <- err
	}()
	select {
	case <-inCall:
	case err := <-done:
		t.Fatalf("the holder ended before its call phase: %v", err)
	}
	_, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	var ip *workflow.InProgressError
	require.ErrorAs(t, err, &ip)
	require.ErrorIs(t, err, workflow.ErrInProgress)
	close(release)
	require.NoError(t, <-done)
	testflow.RequireOneEffect(t, c.DB, c.Provider, "acct", "k")
}

// waitForOtherEngine: an attempt with a bounded wait, on another engine than the
// key's owner (the database the only state they share), polls until the owner's answer
// is stored and replays it.
func waitForOtherEngine(t *testing.T, c *kit) {
	inCall, release := make(chan struct{}), make(chan struct{})
	holder := c.newEngine(t, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			close(inCall)
			<-release
		}
		return nil
	})
	waiting := make(chan struct{}, 1)
	waiter := testflow.Engine(t, c.Pool, &workflow.Config{Schema: c.Schema, Hooks: workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
		if ev.Kind == workflow.OutcomeWaiting {
			waiting <- struct{}{}
		}
	}}}, c.Provider, nil)
	owner := make(chan *workflow.Result, 1)
	go func() {
		res, err := holder.Do(c.ctx, req("k", `{"amount":500}`))
		assert.NoError(t, err)
		owner <- res
	}()
	<-inCall
	got := make(chan *workflow.Result, 1)
	go func() {
		r := req("k", `{"amount":500}`)
		r.Wait = 30 * time.Second // polled from about 1s on: the owner is let go first
		res, err := waiter.Do(c.ctx, r)
		assert.NoError(t, err)
		got <- res
	}()
	<-waiting
	close(release)
	first, replay := <-owner, <-got
	require.NotNil(t, replay)
	require.True(t, replay.Replayed)
	require.Equal(t, first.Response.Body, replay.Response.Body)
	testflow.RequireOneEffect(t, c.DB, c.Provider, "acct", "k")
}

func transientThenResume(t *testing.T, c *kit) {
	c.Provider.FailNext(1)
	_, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	st := testflow.State(t, c.DB, "acct", "k")
	require.Equal(t, testflow.Reserve, st.RecoveryPoint)
	require.False(t, st.HasLease, "released after a transient failure")
	res, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 201, res.Response.Status)
	testflow.RequireOneEffect(t, c.DB, c.Provider, "acct", "k")
}

func sweeperTakesOver(t *testing.T, c *kit) {
	c.Provider.FailNext(1)
	_, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	testflow.Sweepable(t, c.DB)
	stats, err := c.engine.Sweep(c.ctx, &workflow.SweeperConfig{Grace: -1})
	require.NoError(t, err)
	require.Equal(t, 1, stats.Taken)
	require.Equal(t, 1, stats.Finished)
	res, err := c.engine.Do(c.ctx, req("k", `{"amount":500}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	testflow.RequireOneEffect(t, c.DB, c.Provider, "acct", "k")
}
