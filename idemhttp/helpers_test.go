package idemhttp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgtest"
	"github.com/idemflow/idemflow/internal/testflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// bundle is what a test of the HTTP layer works with: a migrated schema with the test
// flow's tables, a fake provider, and an engine with the test flow registered.
type bundle struct {
	db       *pgtest.DB
	provider *testflow.Provider
	engine   *workflow.Engine
}

type setupOpts struct {
	cfg    *workflow.Config
	before func(ctx context.Context, tx phases.DBTX, run *phases.Run) error
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	db := pgtest.New(t)
	require.NoError(t, testflow.CreateTables(context.Background(), db.Pool))
	p := testflow.NewProvider()
	t.Cleanup(p.Close)
	e, err := workflow.New(db.Pool, o.cfg)
	require.NoError(t, err)
	require.NoError(t, e.Register(testflow.Flow(testflow.Options{ProviderURL: p.URL, Before: o.before})))
	return &bundle{db: db, provider: p, engine: e}
}

// keyRow is the whole key row as text, to compare before and after.
func keyRow(t *testing.T, db *pgtest.DB, scope, key string) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(),
		`SELECT coalesce((SELECT to_jsonb(k)::text FROM idemflow_keys k WHERE scope = $1 AND idempotency_key = $2), '')`,
		scope, key).Scan(&s)
	require.NoError(t, err)
	return s
}

func countKeys(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idemflow_keys`).Scan(&n))
	return n
}

type keyState struct {
	Status        string
	RecoveryPoint string
	LockVersion   int64
	Leased        bool
	Attempts      int
	LastError     *string
}

func state(t *testing.T, db *pgtest.DB, scope, key string) keyState {
	t.Helper()
	var s keyState
	err := db.Pool.QueryRow(context.Background(), `
		SELECT status, recovery_point, lock_version, locked_until IS NOT NULL, attempts, last_error
		FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).
		Scan(&s.Status, &s.RecoveryPoint, &s.LockVersion, &s.Leased, &s.Attempts, &s.LastError)
	require.NoError(t, err)
	return s
}

// requireOneEffect checks that a finished key has exactly one of each effect, locally
// and at the provider.
func requireOneEffect(t *testing.T, b *bundle, scope, key string) {
	t.Helper()
	e, err := testflow.CountEffects(context.Background(), b.db.Pool, scope, key)
	require.NoError(t, err)
	require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, e)
	var id string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT id::text FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&id))
	_, paid := b.provider.Payment(id + ":" + testflow.Pay)
	require.True(t, paid, "no provider payment for the key's derived key")
}

// sweepable moves every key's claim, backoff and lease into the past, so that a sweep
// may take it: the database-clock equivalent of waiting.
func sweepable(t *testing.T, db *pgtest.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		UPDATE idemflow_keys
		SET created_at = clock_timestamp() - interval '1 hour',
			next_attempt_at = clock_timestamp() - interval '1 millisecond',
			locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE clock_timestamp() - interval '1 millisecond' END
		WHERE status = 'in_progress'`)
	require.NoError(t, err)
}
