package workflow_test

import (
	"context"
	"go/ast"
	"go/token"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/gosource"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

type ctxKey string

// recorder is one observer: it records attempt ends and phase events, and sees the
// context values every observer set.
type recorder struct {
	name   string
	mu     sync.Mutex
	ends   []workflow.AttemptEvent
	phases []string
	seen   []string // context values seen at AttemptEnd
}

func (r *recorder) hooks() workflow.Hooks {
	return workflow.Hooks{
		AttemptStart: func(ctx context.Context, ev workflow.AttemptEvent) context.Context {
			return context.WithValue(ctx, ctxKey(r.name), ev.Key)
		},
		AttemptEnd: func(ctx context.Context, ev workflow.AttemptEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.ends = append(r.ends, ev)
			for _, n := range []string{"a", "b"} {
				if v, ok := ctx.Value(ctxKey(n)).(string); ok {
					r.seen = append(r.seen, n+"="+v)
				}
			}
		},
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.phases = append(r.phases, string(ev.Executor)+":"+ev.Phase)
		},
	}
}

func (r *recorder) last() workflow.AttemptEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ends[len(r.ends)-1]
}

func TestHooksJoin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := &recorder{name: "a"}, &recorder{name: "b"}
	var derived []string
	var derivedRun []string
	hooks := workflow.JoinHooks(a.hooks(), workflow.Hooks{}, b.hooks(), workflow.Hooks{
		Origin: func(ctx context.Context) string { return "origin-of-" + ctx.Value(ctxKey("a")).(string) },
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				derived = append(derived, ev.DerivedKey())
			}
			return ctx
		},
	})
	require.Nil(t, workflow.JoinHooks(workflow.Hooks{}, workflow.Hooks{}).AttemptStart, "nothing set: nothing to call")
	bd := setup(t, setupOpts{cfg: &workflow.Config{Hooks: hooks}, before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx == nil {
			derivedRun = append(derivedRun, run.DerivedKey())
		}
		return nil
	}})
	e := bd.engine

	_, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":1}`))
	require.NoError(t, err)
	end := a.last()
	require.Equal(t, b.last(), end, "every observer sees the same event")
	require.Equal(t, workflow.OutcomeFinished, end.Outcome)
	require.Equal(t, workflow.ExecutorClient, end.Executor)
	require.Equal(t, testflow.Name, end.Flow)
	require.Equal(t, 1, end.Attempt)
	require.Equal(t, mustID(t, bd, "acct", "k"), end.ID)
	require.Equal(t, "origin-of-k", end.Origin)
	require.Equal(t, phases.Finished, end.RecoveryPoint)
	require.Equal(t, []string{"a=k", "b=k"}, a.seen, "start hooks chain their contexts")
	require.Equal(t, []string{"client:reserve", "client:pay", "client:settle"}, a.phases)
	require.Equal(t, derivedRun, derived, "PhaseEvent.DerivedKey is the phase's")

	_, err = e.Do(ctx, chargeReq("acct", "k", `{"amount":1}`))
	require.NoError(t, err)
	end = a.last()
	require.Equal(t, workflow.OutcomeReplayed, end.Outcome)
	require.Equal(t, "origin-of-k", end.Origin)
	require.Zero(t, end.Attempt, "a replay runs nothing")

	_, err = e.Resume(ctx, "acct", "k")
	require.NoError(t, err)
	end = a.last()
	require.Equal(t, workflow.OutcomeReplayed, end.Outcome)
	require.Equal(t, testflow.Name, end.Flow, "Resume learns the flow from the key")

	_, err = e.Do(ctx, chargeReq("acct", "k", `{"amount":2}`))
	require.ErrorIs(t, err, workflow.ErrMismatch)
	require.Equal(t, workflow.OutcomeMismatch, a.last().Outcome)

	bd.provider.FailNext(1)
	_, err = e.Do(ctx, chargeReq("acct", "t", `{"amount":1}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	end = a.last()
	require.Equal(t, workflow.OutcomeReleased, end.Outcome)
	require.Equal(t, testflow.Pay, end.Phase)
	require.Equal(t, testflow.Reserve, end.RecoveryPoint)

	sweepable(t, bd.db)
	require.Equal(t, []workflow.Outcome{workflow.OutcomeFinished}, sweepOnce(t, e, 0))
	end = a.last()
	require.Equal(t, workflow.ExecutorSweeper, end.Executor)
	require.Equal(t, workflow.OutcomeFinished, end.Outcome)
	require.Equal(t, 2, end.Attempt)
	require.Equal(t, "origin-of-t", end.Origin, "a sweep knows who claimed the key")
	require.Equal(t, "sweeper:settle", a.phases[len(a.phases)-1])

	requireHeldEnd(t, bd, a)
}

// requireHeldEnd checks that an attempt on a key another engine holds ends in progress
// for the observer a of bd's engine.
func requireHeldEnd(t *testing.T, bd *bundle, a *recorder) {
	t.Helper()
	ctx := context.Background()
	h := testflow.NewHolder("held")
	holding := bd.newEngine(t, setupOpts{before: h.Before})
	done := make(chan error, 1)
	go func() {
		_, err := holding.Do(ctx, chargeReq("acct", "held", `{"amount":1}`))
		done <- err
	}()
	<-h.Entered
	_, err := bd.engine.Do(ctx, chargeReq("acct", "held", `{"amount":1}`))
	require.ErrorIs(t, err, workflow.ErrInProgress)
	require.Equal(t, workflow.OutcomeInProgress, a.last().Outcome)
	h.Let()
	require.NoError(t, <-done)
}

// BenchmarkReplayNoHooks measures a replay with no hooks set; with JoinHooks of empty
// hooks it must cost the same (every field nil). Run with -benchmem.
func BenchmarkReplayNoHooks(b *testing.B) {
	for _, c := range []struct {
		name  string
		hooks workflow.Hooks
	}{{"none", workflow.Hooks{}}, {"joined-empty", workflow.JoinHooks(workflow.Hooks{}, workflow.Hooks{})}} {
		b.Run(c.name, func(b *testing.B) {
			bd := &bundle{}
			bd.db, bd.provider = testflow.Start(b)
			e := testflow.Engine(b, bd.db.Pool, &workflow.Config{Hooks: c.hooks}, bd.provider, nil)
			ctx := context.Background()
			req := chargeReq("acct", "k", `{"amount":1}`)
			_, err := e.Do(ctx, req)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Do(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestOperatorKeyEvents: each operator action that changes a key emits one key event,
// with its fields, once its change committed; a refused action emits none.
func TestOperatorKeyEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	var got []workflow.KeyEvent
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{Key: func(ctx context.Context, ev workflow.KeyEvent) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev)
	}}}})
	adminKeys(t, b) // through another engine: b.engine has seen nothing yet
	e := b.engine
	point := func(key string) string {
		info, err := e.InspectKey(ctx, "acct", key)
		require.NoError(t, err)
		return info.RecoveryPoint
	}
	dead, stuck := point("dead"), point("stuck")

	requireWrongStatus(t, e.ReleaseKey(ctx, "acct", "done"), "not in progress")
	requireWrongStatus(t, e.Redrive(ctx, "acct", "stuck"), "not dead-lettered")
	require.ErrorIs(t, e.PurgeKey(ctx, "acct", "missing"), workflow.ErrNotFound)
	requireWrongStatus(t, e.CancelKey(ctx, "acct", "done", workflow.CancelOptions{Status: 200, Force: true}), "finished")
	mu.Lock()
	require.Empty(t, got, "refused: no event")
	mu.Unlock()

	require.NoError(t, e.ReleaseKey(ctx, "acct", "stuck"))
	require.NoError(t, e.Redrive(ctx, "acct", "dead"))
	require.NoError(t, e.PurgeKey(ctx, "acct", "done"))
	require.NoError(t, e.CancelKey(ctx, "acct", "stuck", workflow.CancelOptions{Status: 200, Force: true}))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []workflow.KeyEvent{
		{Kind: workflow.OutcomeOperatorReleased, Scope: "acct", Key: "stuck"},
		{Kind: workflow.OutcomeRedriven, Flow: testflow.Name, Scope: "acct", Key: "dead", RecoveryPoint: dead},
		{Kind: workflow.OutcomePurged, Scope: "acct", Key: "done"},
		{Kind: workflow.OutcomeOperatorCancelled, Flow: testflow.Name, Scope: "acct", Key: "stuck", RecoveryPoint: stuck},
	}, got)
}

// TestOneKeyEventEmitter: the engine calls Hooks.Key in three places, attemptEvent (an
// attempt's outcome, from report, and its milestones), the executor's keyEvent (the
// milestone of a claim made durable) and acted (what is done to a key outside any
// attempt), and each of those is called from the places pinned here
// once each: a new place that emits key events fails this test.
func TestOneKeyEventEmitter(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string][]string{
		"Hooks.Key":    {"acted", "attemptEvent", "keyEvent"},
		"attemptEvent": {"existingRow", "report", "wait"},
		// keyEvent: the executor's (internal/attempt), the claim made durable
		"keyEvent": {"committed"},
		"acted":    {"CancelKey", "abandon", "bulkOne", "operate", "startupCheck", "takeoverService"}, // takeoverService: the takeover service's Event (swept, given back)
	}, callSites(t, "Hooks.Key", "attemptEvent", "keyEvent", "acted"))
}

// callSites returns, for each of the functions of the package and of its executor
// (internal/attempt) named in callees (a method of a field Hooks as "Hooks.Key"), the
// names of the functions that call it, one entry a call, sorted.
func callSites(t *testing.T, callees ...string) map[string][]string {
	sites := map[string][]string{}
	for _, f := range gosource.Files(t, token.NewFileSet(), ".", "../internal/attempt") {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				callee := sel.Sel.Name
				if x, ok := sel.X.(*ast.SelectorExpr); ok && x.Sel.Name == "Hooks" {
					callee = "Hooks." + callee
				}
				if slices.Contains(callees, callee) {
					sites[callee] = append(sites[callee], fn.Name.Name)
				}
				return true
			})
		}
	}
	for _, s := range sites {
		slices.Sort(s)
	}
	return sites
}
