package workflow_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/faultproxy"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestCommitAnswerLostExecModes: a Go-code phase's commit (the engine's key write and
// COMMIT, after the phase's statements) commits, and the connection dies before its
// answer reaches the engine, in every query exec mode (in the exec and simple-protocol
// modes pgx before v5.13 reported that as a request never sent, and v5.13 as a closed
// connection); the engine must read the key row, learn the commit happened, and go on:
// the first attempt answers, with one effect.
// Reserve's commit carries the new key's claim (the key row's insert); settle's finishes
// the key.
func TestCommitAnswerLostExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, phase := range []string{testflow.Reserve, testflow.Settle} {
			t.Run(mode.String()+"/"+phase, func(t *testing.T) {
				t.Parallel()
				testCommitAnswerLost(t, mode, phase)
			})
		}
	}
}

func testCommitAnswerLost(t *testing.T, mode pgx.QueryExecMode, phase string) {
	b := setup(t, setupOpts{})
	pool, proxy := proxiedModePool(t, b, mode)
	requireLostAckResolved(t, b, pool, proxy, phase)
}

// TestCommitAloneAnswerLostExecModes: the engine's own transactions lose their
// answer once committed, in every query exec mode: the commit that claims a call-first
// flow's key before its first call (claim), and the one that finishes the key with the
// response of its last call phase (finish). The engine reads the key row, learns the
// commit happened, and goes on: each call runs once and the first attempt answers.
func TestCommitAloneAnswerLostExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, at := range []string{"claim", "finish"} {
			t.Run(mode.String()+"/"+at, func(t *testing.T) {
				t.Parallel()
				testCommitAloneAnswerLost(t, mode, at)
			})
		}
	}
}

func testCommitAloneAnswerLost(t *testing.T, mode pgx.QueryExecMode, at string) {
	ctx := context.Background()
	b := setup(t, setupOpts{})
	pool, proxy := proxiedModePool(t, b, mode)
	var calls [2]atomic.Int32
	flow := phases.Flow{Name: "calls", Phases: []phases.Phase{
		phases.Call("ping", func(context.Context, *phases.Run) (*phases.Response, error) { calls[0].Add(1); return nil, nil }),
		phases.Tx("note", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("answer", func(context.Context, *phases.Run) (*phases.Response, error) {
			calls[1].Add(1)
			return phases.JSON(201, map[string]string{"ok": "yes"})
		}),
	}}
	arm := map[string]string{"claim": "ping", "finish": "answer"}[at]
	var armed atomic.Bool
	e, err := workflow.New(pool, &workflow.Config{Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Phase == arm && armed.CompareAndSwap(false, true) {
				proxy.DropNextCommitAck()
			}
			return ctx
		},
	}})
	require.NoError(t, err)
	require.NoError(t, e.Register(flow))
	require.NoError(t, workflow.StartUp(ctx, e))
	req := workflow.Request{Scope: "acct", Key: "alone", Flow: "calls", Method: "POST", Route: "/calls", Body: []byte(`{}`)}
	res, err := e.Do(ctx, req)
	require.NoError(t, err, "the engine re-reads the key and learns the commit happened")
	require.EqualValues(t, 1, proxy.Dropped(), "the fault fired")
	require.Equal(t, [2]int32{1, 1}, [2]int32{calls[0].Load(), calls[1].Load()}, "each call ran once")
	require.Equal(t, 201, res.Response.Status)
	replay, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
}

// proxiedModePool opens a pool on the schema whose connections go through a fault
// proxy, in query exec mode mode.
func proxiedModePool(t *testing.T, b *bundle, mode pgx.QueryExecMode) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	proxy, err := faultproxy.New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil // the proxy reads plain protocol
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, proxy
}
