package workflow_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestCommitBeforeCallFlushed: the commit that precedes a call phase, and only that
// one, makes synchronous_commit off local for its transaction (the crash itself is
// reliability's TestCrashAsyncCommitBeforeCall): once per fresh request of the
// Go-code charge flow (the claim's commit with reserve), of the pay-first flow (the
// claim's commit alone), of the pipelined flow (in its claim lock) and of a flow whose
// call follows a second tx phase; never in a flow without a call, nor in the commit
// that stores the answer. The engine's sessions run with synchronous_commit off, and
// a session's setting is the same after each request.
func TestCommitBeforeCallFlushed(t *testing.T) {
	t.Parallel()
	db, remote := testflow.Start(t)
	_, err := db.Pool.Exec(context.Background(), pipeSchema)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	tr := &flushCounter{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := testflow.Engine(t, pool, nil, remote, nil)
	require.NoError(t, e.Register(testflow.PayFirst(testflow.Options{ProviderURL: remote.URL})))
	var calls atomic.Int32
	require.NoError(t, e.Register(pipeFlow("pipe", &calls, nil)))
	tx := func(name string, resp *phases.Response) phases.Phase {
		return phases.Tx(name, func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return resp, nil })
	}
	done := &phases.Response{Status: http.StatusCreated, Body: []byte(`{}`)}
	call := phases.Call("call", func(context.Context, *phases.Run) (*phases.Response, error) { return nil, nil })
	require.NoError(t, e.Register(phases.Flow{Name: "nocall", Phases: []phases.Phase{tx("a", nil), tx("b", done)}}))
	require.NoError(t, e.Register(phases.Flow{Name: "txtxcall", Phases: []phases.Phase{tx("a", nil), tx("b", nil), call, tx("c", done)}}))
	require.NoError(t, workflow.StartUp(context.Background(), e))

	for _, tc := range []struct {
		flow, body string
		want       int64
	}{
		{testflow.Name, `{"amount":5}`, 1},
		{testflow.PayFirstName, `{"amount":5}`, 1},
		{"pipe", `{"a":1}`, 1},
		{"txtxcall", `{}`, 1},
		{"nocall", `{}`, 0},
	} {
		before := tr.n.Load()
		res, err := e.Do(context.Background(), workflow.Request{Scope: "acct", Key: "flushed-" + tc.flow, Flow: tc.flow, Method: "POST", Route: "/x", Body: []byte(tc.body)})
		require.NoError(t, err, tc.flow)
		require.Equal(t, http.StatusCreated, res.Response.Status, tc.flow)
		require.Equal(t, tc.want, tr.n.Load()-before, "%s: statements that make synchronous_commit local", tc.flow)
		var sc string
		require.NoError(t, pool.QueryRow(context.Background(), `SHOW synchronous_commit`).Scan(&sc))
		require.Equal(t, "off", sc, "%s: the session's setting after the request", tc.flow)
	}
}

// flushCounter counts the statements sent that set synchronous_commit.
type flushCounter struct{ n atomic.Int64 }

func (c *flushCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}
func (c *flushCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *flushCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		c.count(q.SQL)
	}
	return ctx
}
func (c *flushCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *flushCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *flushCounter) count(sql string) {
	if strings.Contains(sql, "set_config('synchronous_commit'") {
		c.n.Add(1)
	}
}

// TestCommitBeforeCallFlushedBusy: a call-first key's claim, which commits alone with
// the statement that flushes it, finds the key's claim lock held by another attempt
// (a Go-code tx phase of another flow, its transaction open): the attempt answers that
// the key is in progress, pays nothing, and its connection is clean for the next
// request; the holder then finishes and pays once.
func TestCommitBeforeCallFlushedBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, remote := testflow.Start(t)
	inPhase, release := make(chan struct{}), make(chan struct{})
	holder := testflow.Engine(t, db.Pool, nil, remote, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx != nil && run.Phase() == testflow.Reserve {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the claim is sent with it at the latest
				return err
			}
			close(inPhase)
			<-release
		}
		return nil
	})
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	payFirst, err := workflow.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, payFirst.Register(testflow.PayFirst(testflow.Options{ProviderURL: remote.URL})))

	done := make(chan error, 1)
	go func() {
		_, err := holder.Do(ctx, chargeReq("acct", "busy", `{"amount":5}`))
		done <- err
	}()
	<-inPhase
	req := workflow.Request{Scope: "acct", Key: "busy", Flow: testflow.PayFirstName, Method: "POST", Route: "/charges", Body: []byte(`{"amount":5}`)}
	_, err = payFirst.Do(ctx, req)
	_, busy := isInProgress(err)
	require.True(t, busy, "the pay-first attempt while the claim is held: %v", err)
	require.Equal(t, 0, remote.Made(), "the loser paid")
	close(release)
	require.NoError(t, <-done)
	require.Equal(t, 1, remote.Made())

	req.Key = "after-busy"
	res, err := payFirst.Do(ctx, req)
	require.NoError(t, err, "the next request on the loser's connection")
	require.Equal(t, http.StatusCreated, res.Response.Status)
	var sc string
	require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
	require.Equal(t, "off", sc)
}
