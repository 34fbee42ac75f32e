package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// roundTrips counts what a pgx connection sends: each query and each batch (a
// pipeline with one sync) is one round trip once statements are cached.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestRoundTrips holds the engine to the budget in DESIGN.md: a fresh key costs two
// round trips more than the flow's own statements (the lookup, and the claim, which
// must come back before any of the flow's code runs; BEGIN, the key row's insert, the
// fenced updates and COMMIT all ride along with them), and a replay costs one. The
// test flow has three statements of its own (the charges example has two, so 6).
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e, rt := countedEngine(t, b)

	rt.n.Store(0)
	res, err := e.Do(ctx, chargeReq("acct", "fresh", `{"amount":1}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	fresh := rt.n.Load()
	// The flow's own statements: INSERT in reserve; UPDATE and INSERT in settle. The
	// engine adds the lookup and the claim and rides everything else along with them.
	require.LessOrEqual(t, fresh, int64(7), "round trips for a fresh request")
	require.Equal(t, int64(7), fresh, "lookup, BEGIN+claim, INSERT, key INSERT+COMMIT, BEGIN+UPDATE, INSERT, finish+COMMIT")

	rt.n.Store(0)
	res, err = e.Do(ctx, chargeReq("acct", "fresh", `{"amount":1}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, int64(1), rt.n.Load(), "round trips for a replay")
}

// TestRoundTripsClaimWithFirstStatement is TestRoundTrips with the claim folded into
// the round trip of the first phase's first statement (Config.ClaimWithFirstStatement):
// one round trip less for a fresh key (the charges example's flow: 5), a replay the same.
func TestRoundTripsClaimWithFirstStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e, rt := countedEngineWith(t, b, &workflow.Config{ClaimWithFirstStatement: true})

	rt.n.Store(0)
	res, err := e.Do(ctx, chargeReq("acct", "fresh", `{"amount":1}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, int64(6), rt.n.Load(), "lookup, BEGIN+claim+INSERT, key INSERT+COMMIT, BEGIN+UPDATE, INSERT, finish+COMMIT")

	rt.n.Store(0)
	res, err = e.Do(ctx, chargeReq("acct", "fresh", `{"amount":1}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, int64(1), rt.n.Load(), "round trips for a replay")
}

// countedEngine is an engine of b on a pool of one connection whose round trips rt
// counts, warmed by a fresh request and its replay, so that its statement cache holds
// every statement a fresh request and a replay send.
func countedEngine(t *testing.T, b *bundle) (*workflow.Engine, *roundTrips) {
	t.Helper()
	return countedEngineWith(t, b, nil)
}

// countedEngineWith is countedEngine with the engine's configuration cfg.
func countedEngineWith(t *testing.T, b *bundle, cfg *workflow.Config) (*workflow.Engine, *roundTrips) {
	t.Helper()
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 1 // one connection, so its statement cache is warm after one request
	rt := &roundTrips{}
	pcfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := b.newEngine(t, setupOpts{pool: pool, cfg: cfg})
	_, err = e.Do(ctx, chargeReq("acct", "warm", `{"amount":1}`))
	require.NoError(t, err)
	_, err = e.Do(ctx, chargeReq("acct", "warm", `{"amount":1}`))
	require.NoError(t, err)
	return e, rt
}
