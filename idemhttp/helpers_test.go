package idemhttp_test

import (
	"context"
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// bundle is what a test of the HTTP layer works with: a migrated schema with the test
// flow's tables, a fake provider, and an engine with the test flow registered.
type bundle struct {
	db       *pgtest.DB
	provider *idemflowtest.Remote
	engine   *workflow.Engine
}

type setupOpts struct {
	cfg    *workflow.Config
	before func(ctx context.Context, tx phases.DBTX, run *phases.Run) error
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	db, p := testflow.Start(t)
	return &bundle{db: db, provider: p, engine: testflow.Engine(t, db.Pool, o.cfg, p, o.before)}
}

// keyRow is the whole key row as text, to compare before and after.
func keyRow(t *testing.T, db *pgtest.DB, scope, key string) string {
	return testflow.KeyRow(t, db.Pool, scope, key)
}

func countKeys(t *testing.T, db *pgtest.DB) int { return testflow.CountKeys(t, db.Pool) }

type keyState = testflow.KeyState

func state(t *testing.T, db *pgtest.DB, scope, key string) keyState {
	return testflow.State(t, db.Pool, scope, key)
}

// requireOneEffect checks that a finished key has exactly one of each effect, locally
// and at the provider.
func requireOneEffect(t *testing.T, b *bundle, scope, key string) {
	testflow.RequireOneEffect(t, b.db.Pool, b.provider, scope, key)
}

// sweepable moves every key's claim, backoff and lease into the past.
func sweepable(t *testing.T, db *pgtest.DB) { testflow.Sweepable(t, db.Pool) }
