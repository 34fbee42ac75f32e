package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

type bundle struct {
	db       *pgtest.DB
	provider *idemflowtest.Remote
	engine   *workflow.Engine
}

type setupOpts struct {
	cfg    *workflow.Config
	before func(ctx context.Context, tx phases.DBTX, run *phases.Run) error
	pool   *pgxpool.Pool // defaults to the schema's pool
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	db, p := testflow.Start(t)
	b := &bundle{db: db, provider: p}
	b.engine = b.newEngine(t, o)
	return b
}

func (b *bundle) newEngine(t *testing.T, o setupOpts) *workflow.Engine {
	t.Helper()
	pool := o.pool
	if pool == nil {
		pool = b.db.Pool
	}
	return testflow.Engine(t, pool, o.cfg, b.provider, o.before)
}

func chargeReq(scope, key, body string) workflow.Request {
	return workflow.Request{Scope: scope, Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
}

// keyRow is the whole key row as text, to compare before and after.
func keyRow(t *testing.T, db *pgtest.DB, scope, key string) string {
	return testflow.KeyRow(t, db.Pool, scope, key)
}

func countKeys(t *testing.T, db *pgtest.DB) int { return testflow.CountKeys(t, db.Pool) }

// expireLease moves a key's lease into the past: the database-clock equivalent of
// waiting for it to run out.
func expireLease(t *testing.T, db *pgtest.DB, scope, key string) {
	t.Helper()
	tag, err := db.Pool.Exec(context.Background(),
		`UPDATE idemflow_keys SET locked_until = statement_timestamp() - interval '1 millisecond'
		 WHERE scope = $1 AND idempotency_key = $2 AND locked_until IS NOT NULL`, scope, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "key %s/%s has no lease to expire", scope, key)
}

type keyState = testflow.KeyState

func state(t *testing.T, db *pgtest.DB, scope, key string) keyState {
	return testflow.State(t, db.Pool, scope, key)
}

func effects(t *testing.T, db *pgtest.DB, scope, key string) testflow.Effects {
	t.Helper()
	e, err := testflow.CountEffects(context.Background(), db.Pool, scope, key)
	require.NoError(t, err)
	return e
}

// requireOneEffect checks that a finished key has exactly one of each effect, locally
// and at the provider.
func requireOneEffect(t *testing.T, b *bundle, scope, key string) {
	testflow.RequireOneEffect(t, b.db.Pool, b.provider, scope, key)
}

func isInProgress(err error) (*workflow.InProgressError, bool) {
	var ip *workflow.InProgressError
	ok := errors.As(err, &ip)
	return ip, ok
}

// terminateOwnBackend terminates, through admin, the backend of the transaction tx
// runs on, and then sends tx a statement: the phase's connection dies under it.
func terminateOwnBackend(ctx context.Context, tx phases.DBTX, admin *pgxpool.Pool) error {
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() WHERE $1::int > 0`, 1).Scan(&pid); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT 1 WHERE $1::int > 0`, 1)
	return err
}
