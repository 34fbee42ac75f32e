package workflow_test

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func TestConfigWithDefaultsIsIdempotent(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hooks := workflow.Hooks{
		PhaseStart:   func(ctx context.Context, ev workflow.PhaseEvent) context.Context { return ctx },
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {},
		PhaseEnd:     func(ctx context.Context, ev workflow.PhaseEvent, err error) {},
		Key:          func(ctx context.Context, ev workflow.KeyEvent) {},
	}
	for name, cfg := range map[string]*workflow.Config{
		"Nil":              nil,
		"Zero":             {},
		"TxRetriesOff":     {TxRetries: -1},
		"TxRetriesOne":     {TxRetries: 1},
		"NoStoredHeaders":  {StoredHeaders: []string{}},
		"OwnStoredHeaders": {StoredHeaders: []string{"Content-Type", "X-Request-Id"}},
		"HooksAndLogger":   {Hooks: hooks, Logger: logger},
		"Everything": {
			Lease: time.Minute, MaxBodyBytes: 1, MaxResponseBytes: 2, MaxPhaseDataBytes: 3,
			TxRetries: -1, BackoffBase: time.Millisecond, BackoffMax: time.Hour,
			StoredHeaders: []string{"ETag"}, Hooks: hooks, Logger: logger,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			once := cfg.WithDefaults()
			twice := once.WithDefaults()
			requireSameConfig(t, once, twice)
			if cfg != nil && cfg.TxRetries != 0 {
				require.Equal(t, cfg.TxRetries, once.TxRetries, "a value the user set is kept as written")
			}
		})
	}

	d := (*workflow.Config)(nil).WithDefaults()
	require.Equal(t, workflow.LeaseDefault, d.Lease)
	require.Equal(t, workflow.MaxBodyBytesDefault, d.MaxBodyBytes)
	require.Equal(t, workflow.MaxResponseBytesDefault, d.MaxResponseBytes)
	require.Equal(t, workflow.MaxPhaseDataBytesDefault, d.MaxPhaseDataBytes)
	require.Equal(t, workflow.TxRetriesDefault, d.TxRetries)
	require.Equal(t, workflow.BackoffBaseDefault, d.BackoffBase)
	require.Equal(t, workflow.BackoffMaxDefault, d.BackoffMax)
	require.Equal(t, workflow.StoredHeadersDefault(), d.StoredHeaders)
	require.Same(t, slog.Default(), d.Logger)
}

// requireSameConfig compares two configs field by field: Logger and Hooks by pointer
// (functions are never equal under reflect.DeepEqual), the rest by value.
func requireSameConfig(t *testing.T, want, got *workflow.Config) {
	t.Helper()
	require.Same(t, want.Logger, got.Logger, "Logger")
	for _, f := range []struct {
		name      string
		want, got any
	}{
		{"PhaseStart", want.Hooks.PhaseStart, got.Hooks.PhaseStart},
		{"BeforeCommit", want.Hooks.BeforeCommit, got.Hooks.BeforeCommit},
		{"PhaseEnd", want.Hooks.PhaseEnd, got.Hooks.PhaseEnd},
		{"Key", want.Hooks.Key, got.Hooks.Key},
	} {
		require.Equal(t, reflect.ValueOf(f.want).Pointer(), reflect.ValueOf(f.got).Pointer(), "Hooks.%s", f.name)
	}
	w, g := *want, *got
	w.Logger, g.Logger = nil, nil
	w.Hooks, g.Hooks = workflow.Hooks{}, workflow.Hooks{}
	require.Equal(t, w, g)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for name, cfg := range map[string]workflow.Config{
		"ShortLease":        {Lease: time.Millisecond},
		"NegativeBody":      {MaxBodyBytes: -1},
		"HugeResponse":      {MaxResponseBytes: 32 << 20},
		"HugePhaseData":     {MaxPhaseDataBytes: 2 << 20},
		"TxRetriesMinusTwo": {TxRetries: -2},
		"NegativeBackoff":   {BackoffBase: -time.Second},
		"MaxUnderBase":      {BackoffBase: time.Minute, BackoffMax: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := workflow.New(b.db.Pool, &cfg)
			require.Error(t, err)
		})
	}
}

func TestStoredHeadersDefaultIsACopy(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	want := workflow.StoredHeadersDefault()
	require.Contains(t, want, "Content-Type")

	got := workflow.StoredHeadersDefault()
	got[0] = "Set-Cookie"
	_ = append(got[:1], "X-Mutated")
	require.Equal(t, want, workflow.StoredHeadersDefault(), "a caller's change does not reach the next call")
	require.Equal(t, want, (*workflow.Config)(nil).WithDefaults().StoredHeaders)

	e, err := workflow.New(b.db.Pool, nil)
	require.NoError(t, err)
	cfg := e.Config()
	require.Equal(t, want, cfg.StoredHeaders, "the engine's defaults are unchanged")

	own := []string{"ETag"}
	c := (&workflow.Config{StoredHeaders: own}).WithDefaults()
	own[0] = "Set-Cookie"
	require.Equal(t, []string{"ETag"}, c.StoredHeaders, "WithDefaults copies the caller's slice")
}

// TestTxRetriesOffSurvivesASecondPass: a config that went through WithDefaults before
// New (which applies it again) still runs a conflicting tx phase only once.
func TestTxRetriesOffSurvivesASecondPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	b := setup(t, setupOpts{
		cfg: (&workflow.Config{TxRetries: -1}).WithDefaults(),
		before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() != testflow.Settle {
				return nil
			}
			runs.Add(1)
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			return err
		},
	})
	require.Equal(t, -1, b.engine.Config().TxRetries, "the engine reports -1 as the user wrote it")
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.EqualValues(t, 1, runs.Load(), "TxRetries -1 disables retries")
}
