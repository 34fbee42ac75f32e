package testflow

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The key table as tests look at it: read straight from the database, never through
// the engine, so that a test sees what is stored.

// DB runs statements and queries; a pool or a connection.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// KeyRow is the whole key row as text ("" when there is none), to compare before and
// after.
func KeyRow(t testing.TB, db DB, scope, key string) string {
	t.Helper()
	var s string
	err := db.QueryRow(context.Background(),
		`SELECT coalesce((SELECT to_jsonb(k)::text FROM idemflow_keys k WHERE scope = $1 AND idempotency_key = $2), '')`,
		scope, key).Scan(&s)
	require.NoError(t, err)
	return s
}

// CountKeys is the number of key rows.
func CountKeys(t testing.TB, db DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM idemflow_keys`).Scan(&n))
	return n
}

// KeyState is what tests check of a key row.
type KeyState struct {
	Status        string
	RecoveryPoint string
	LockVersion   int64
	HasLease      bool // locked_until is set, live or not
	Attempts      int
	LastError     *string
}

// State reads a key row's state; the row must exist.
func State(t testing.TB, db DB, scope, key string) KeyState {
	t.Helper()
	var s KeyState
	err := db.QueryRow(context.Background(), `
		SELECT status, recovery_point, lock_version, locked_until IS NOT NULL, attempts, last_error
		FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).
		Scan(&s.Status, &s.RecoveryPoint, &s.LockVersion, &s.HasLease, &s.Attempts, &s.LastError)
	require.NoError(t, err)
	return s
}

// RequireOneEffect checks that a finished key of the flow has exactly one of each
// effect, locally and at p.
func RequireOneEffect(t testing.TB, db DB, p *idemflowtest.Remote, scope, key string) {
	t.Helper()
	e, err := CountEffects(context.Background(), db, scope, key)
	require.NoError(t, err)
	require.Equal(t, Effects{Ledger: 1, Settled: 1, Settlements: 1}, e)
	var id string
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT id::text FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&id))
	_, paid := p.Effect(id + ":" + Pay)
	require.True(t, paid, "no provider payment for the key's derived key")
}

// Sweepable moves every unfinished key's claim, backoff and lease into the past, so
// that a sweep may take it: the database-clock equivalent of waiting. A lease is moved
// to a constant long past (Citus refuses the clock inside a CASE in an UPDATE).
func Sweepable(t testing.TB, db DB) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		UPDATE idemflow_keys
		SET created_at = statement_timestamp() - interval '1 hour',
			next_attempt_at = statement_timestamp() - interval '1 millisecond',
			locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END
		WHERE status = 'in_progress'`)
	require.NoError(t, err)
}

// Start makes what a test of the engine or the HTTP layer starts from: a fresh,
// migrated schema (dropped at cleanup) with the flow's tables, and a provider (closed
// at cleanup).
func Start(t testing.TB) (*pgtest.DB, *idemflowtest.Remote) {
	t.Helper()
	db := pgtest.New(t)
	require.NoError(t, CreateTables(context.Background(), db.Pool))
	return db, idemflowtest.NewRemote(t, nil)
}

// Engine returns an engine on pool with cfg and the flow registered, its calls going to
// p and before run at the start of every phase. Unless cfg sets AdmitWait, admission
// waits as long as the caller's context (AdmitWait -1; see SlowMachine).
func Engine(t testing.TB, pool workflow.Pool, cfg *workflow.Config, p *idemflowtest.Remote, before func(ctx context.Context, tx phases.DBTX, run *phases.Run) error) *workflow.Engine {
	t.Helper()
	e, err := workflow.New(pool, SlowMachine(cfg))
	require.NoError(t, err)
	require.NoError(t, e.Register(Flow(Options{ProviderURL: p.URL, Before: before})))
	return e
}

// SlowMachine is a copy of cfg (nil: the defaults) whose admission waits as long as
// the caller's context (AdmitWait -1) unless cfg sets AdmitWait. A test whose subject
// is not overload must not have its own attempts shed as overloaded because a busy
// machine made the pool's queue slow (the default AdmitWait refuses at once once the
// last waits for a connection took over 1.25 s); a test of shedding sets AdmitWait and
// MaxInFlight itself (docs/DEVELOPMENT.md, "Rules for tests on a busy machine").
func SlowMachine(cfg *workflow.Config) *workflow.Config {
	var c workflow.Config
	if cfg != nil {
		c = *cfg
	}
	if c.AdmitWait == 0 {
		c.AdmitWait = -1
	}
	return &c
}
