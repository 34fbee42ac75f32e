package otelsdk_test

import (
	"context"
	"github.com/idemflow/idemflow/workflow"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// lastPass is the gauge idemflow.sweeper.last_pass (Unix seconds) as a time, and
// whether it has a point.
func lastPass(t *testing.T, b *bundle) (time.Time, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idemflow.sweeper.last_pass" {
				continue
			}
			require.Equal(t, "s", m.Unit)
			g, ok := m.Data.(metricdata.Gauge[float64])
			require.True(t, ok, "a float64 gauge")
			require.LessOrEqual(t, len(g.DataPoints), 1, "one series per process")
			for _, p := range g.DataPoints {
				require.Zero(t, p.Attributes.Len(), "no attribute")
				return time.Unix(0, int64(p.Value*float64(time.Second))), true
			}
		}
	}
	return time.Time{}, false
}

// requireWithin checks that at lies in [from, to], to the gauge's precision (a float64
// of Unix seconds keeps about a microsecond).
func requireWithin(t *testing.T, at, from, to time.Time, msg string) {
	t.Helper()
	require.False(t, at.Before(from.Add(-time.Millisecond)), "%s: %s is before %s", msg, at, from)
	require.False(t, at.After(to.Add(time.Millisecond)), "%s: %s is after %s", msg, at, to)
}

// TestSweeperLastPass: idemflow.sweeper.last_pass has no series until SweeperHooks is
// called, then reads when it was called until a pass completes; a pass that fails
// does not move it, one that completes does, through Engine.Sweep and through the
// background loop of Engine.Start; after Stop it stays where the last pass left it,
// which is what the alert on its age (deploy/prometheus) sees of a dead sweeper.
func TestSweeperLastPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	_, ok := lastPass(t, b)
	require.False(t, ok, "no series in a process that runs no sweeper")

	before := time.Now()
	hooks := b.obs.SweeperHooks()
	made, ok := lastPass(t, b)
	require.True(t, ok, "a series once the sweeper's hooks are made")
	requireWithin(t, made, before, time.Now(), "before any pass, when the hooks were made")
	b.obs.SweeperHooks()
	again, _ := lastPass(t, b)
	require.Equal(t, made, again, "making the hooks again is no pass")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := b.engine.Sweep(cancelled, &workflow.SweeperConfig{Hooks: hooks})
	require.Error(t, err)
	failed, _ := lastPass(t, b)
	require.Equal(t, made, failed, "a failed pass is not a completed one")

	before = time.Now()
	_, err = b.engine.Sweep(ctx, &workflow.SweeperConfig{Hooks: hooks})
	require.NoError(t, err)
	swept, _ := lastPass(t, b)
	requireWithin(t, swept, before, time.Now(), "the pass of Sweep")
	require.True(t, swept.After(made))

	// The background loop: each completed pass signals, after the observer saw it.
	passed := make(chan time.Time, 100)
	loop := workflow.SweeperHooks{Pass: func(ctx context.Context, st workflow.SweepStats, err error) {
		hooks.Pass(ctx, st, err)
		if err == nil {
			passed <- time.Now()
		}
	}}
	before = time.Now()
	require.NoError(t, b.engine.Start(ctx, &workflow.SweeperConfig{Interval: time.Hour, Hooks: loop}))
	after := <-passed // the loop's first pass runs at once
	looped, _ := lastPass(t, b)
	requireWithin(t, looped, before, after, "the loop's first pass")
	require.True(t, looped.After(swept))
	require.NoError(t, b.engine.Stop(ctx))
	stopped, _ := lastPass(t, b)
	require.GreaterOrEqual(t, stopped, looped, "a pass may complete while stopping")
	for range 2 {
		still, ok := lastPass(t, b)
		require.True(t, ok, "the series stays")
		require.Equal(t, stopped, still, "a stopped sweeper no longer moves it")
	}
}
