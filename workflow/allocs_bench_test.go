package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// BenchmarkRequestAllocs reports the client's allocations per request (allocs/op,
// B/op) on each path a request takes, on a one-connection pool whose statement cache
// is warm: Fresh of a Go-code flow (goGateFlow) and of a pipelined one (pipeFlow),
// Replay of a finished key, and Loser: a copy of a key whose claim another engine
// holds inside its open first transaction, answered 409 (its look-up finds no row,
// its claim loses):
//
//	go test -run '^$' -bench RequestAllocs -benchtime 2000x -benchmem -memprofile mem.out ./workflow/
//	go tool pprof -sample_index=alloc_objects -top mem.out
func BenchmarkRequestAllocs(b *testing.B) {
	b.Run("FreshGo", func(b *testing.B) {
		ab := newAllocBench(b)
		ab.run(b, "go", benchKey, http.StatusCreated, false)
	})
	b.Run("FreshPipelined", func(b *testing.B) {
		ab := newAllocBench(b)
		ab.run(b, "pipe", benchKey, http.StatusCreated, false)
	})
	b.Run("Replay", func(b *testing.B) {
		ab := newAllocBench(b)
		key := benchKey()
		ab.run(b, "pipe", func() string { return key }, http.StatusCreated, true)
	})
	b.Run("LoserPipelined", func(b *testing.B) { benchLoser(b, "pipe_hold") })
	b.Run("LoserGo", func(b *testing.B) { benchLoser(b, "go_hold") })
}

// allocBench is an engine on a one-connection pool with pipeFlow ("pipe"), goGateFlow
// ("go") and the two holding flows registered.
type allocBench struct {
	db     *pgtest.DB
	engine *workflow.Engine
	hold   *hold
}

func newAllocBench(b *testing.B) *allocBench {
	b.Helper()
	ctx := context.Background()
	ab := &allocBench{db: pgtest.New(b), hold: newHold()}
	_, err := ab.db.Pool.Exec(ctx, pipeSchema)
	require.NoError(b, err)
	ab.engine = ab.newEngine(b, 1)
	return ab
}

// newEngine is an engine of its own on a pool of conns connections of ab's database.
func (ab *allocBench) newEngine(b *testing.B, conns int32) *workflow.Engine {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(ab.db.URL)
	require.NoError(b, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	e, err := workflow.New(pool, nil)
	require.NoError(b, err)
	var calls atomic.Int32
	holds := map[string]*hold{"held": ab.hold}
	for _, f := range []phases.Flow{pipeFlow("pipe", &calls, nil), goGateFlow("go", settleStmts["ExecArgs"], nil),
		holdPipeFlow("pipe_hold", holds), goHoldFlow("go_hold", ab.hold)} {
		require.NoError(b, e.Register(f))
	}
	require.NoError(b, workflow.StartUp(context.Background(), e))
	return e
}

// run sends requests of flow for key() b.N times, after one untimed request that warms
// the statement cache, and checks each is answered status (replayed when replay) or,
// for status 409, refused as in progress.
func (ab *allocBench) run(b *testing.B, flow string, key func() string, status int, replay bool) {
	b.Helper()
	ctx := context.Background()
	check := func(res *workflow.Result, err error) {
		if status == http.StatusConflict {
			var ip *workflow.InProgressError
			if !errors.As(err, &ip) {
				b.Fatalf("want in progress, got %v", err)
			}
			return
		}
		if err != nil || res.Replayed != replay || res.Response.Status != status {
			b.Fatalf("%v %+v", err, res)
		}
	}
	req := goReq(flow, key())
	res, err := ab.engine.Do(ctx, req)
	if status == http.StatusConflict || !replay {
		check(res, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req.Key = key()
		check(ab.engine.Do(ctx, req))
	}
}

// benchLoser holds the key "held" of flow inside its first transaction on a second
// engine, and sends copies of it: each is a loser of the claim.
func benchLoser(b *testing.B, flow string) {
	ab := newAllocBench(b)
	winner := ab.newEngine(b, 1)
	done := make(chan error, 1)
	go func() {
		_, err := winner.Do(context.Background(), goReq(flow, "held"))
		done <- err
	}()
	<-ab.hold.inside
	ab.run(b, flow, func() string { return "held" }, http.StatusConflict, false)
	b.StopTimer()
	ab.hold.open()
	require.NoError(b, <-done)
}

// goHoldFlow is holdPipeFlow with a Go-code tx phase: it inserts an effect row, then
// holds its first entrant, with the claim held and the transaction open, until the
// gate opens.
func goHoldFlow(name string, h *hold) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Tx("hold", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if _, err := tx.Exec(ctx, goInsert, run.Scope(), run.Key(), "hold"); err != nil {
				return nil, err
			}
			if err := h.wait(ctx, h.enter()); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, map[string]string{"key": run.Key()})
		}),
	}}
}
