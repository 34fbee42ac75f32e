package sweeper_test

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func TestConfigWithDefaultsIsIdempotent(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hooks := sweeper.Hooks{Pass: func(context.Context, sweeper.Stats, error) {}}
	for name, cfg := range map[string]*sweeper.Config{
		"Nil":            nil,
		"Zero":           {},
		"NoGrace":        {Grace: -1},
		"OwnGrace":       {Grace: time.Minute},
		"OneAttempt":     {MaxAttempts: 1},
		"HooksAndLogger": {Hooks: hooks, Logger: logger},
		"Everything": {
			Interval: time.Millisecond, Grace: -1, BatchSize: 1, Concurrency: 2, MaxAttempts: 3,
			Retention: time.Hour, CleanupBatch: 5, CleanupShare: 0.25, Hooks: hooks, Logger: logger,
			PartitionRemoval: workflow.DailyWindow{From: 22 * time.Hour, To: 2 * time.Hour},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			once := cfg.WithDefaults()
			twice := once.WithDefaults()
			require.Same(t, once.Logger, twice.Logger, "Logger")
			require.Equal(t, reflect.ValueOf(once.Hooks.Pass).Pointer(), reflect.ValueOf(twice.Hooks.Pass).Pointer(), "Hooks.Pass")
			o, w := *once, *twice
			o.Hooks, w.Hooks = sweeper.Hooks{}, sweeper.Hooks{}
			require.Equal(t, o, w)
			if cfg != nil && cfg.Grace != 0 {
				require.Equal(t, cfg.Grace, once.Grace, "a value the user set is kept as written")
			}
		})
	}
}

func TestConfigValidateGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	_, err := b.engine.Sweep(ctx, &sweeper.Config{Grace: -2})
	require.ErrorContains(t, err, "-1 means no grace")
	require.ErrorContains(t, b.engine.Start(ctx, &sweeper.Config{Grace: -2}), "-1 means no grace")
	_, err = b.engine.Sweep(ctx, &sweeper.Config{Grace: -time.Second})
	require.Error(t, err)
}

// TestNoGraceSurvivesASecondPass: a config that went through WithDefaults before Sweep
// (which applies it again) still sweeps a key claimed a moment ago.
func TestNoGraceSurvivesASecondPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.stuck(t, chargeReq("k"), testflow.Pay)
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)

	stats, err := b.newSweeper(t, (&sweeper.Config{Grace: -1}).WithDefaults()).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
	requireOneEffect(t, b, "k", testflow.Pay)
}
