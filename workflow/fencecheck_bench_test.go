package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// stmtTrips counts a pool's round trips (a query or a batch each) and the statements
// sent in them.
type stmtTrips struct{ trips, stmts atomic.Int64 }

func (c *stmtTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.trips.Add(1)
	c.stmts.Add(1)
	return ctx
}
func (c *stmtTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *stmtTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	c.stmts.Add(int64(len(d.Batch.QueuedQueries)))
	return ctx
}
func (c *stmtTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *stmtTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// BenchmarkGoPhases is a Go-code flow (tx, call, tx: an insert in each tx phase) on a
// one-connection traced pool: Fresh runs a new key; Resume runs a retry of a key
// released at its first phase (the takeover, the call, and the last phase, whose
// transaction checks the fence first). Each reports round trips and statements per
// operation, with the CPU time of this process (client-cpu-ns/op) and of the pool's one
// server backend (server-cpu-ns/op, in 10 ms ticks: use a few hundred operations).
// FreshClaimWithFirstStatement is Fresh with Config.ClaimWithFirstStatement (the claim
// in the first statement's round trip: 5 round trips against Fresh's 6, as many statements):
//
//	go test -run '^$' -bench GoPhases -benchtime 2000x ./workflow/
func BenchmarkGoPhases(b *testing.B) {
	b.Run("Fresh", func(b *testing.B) { benchGoPhases(b, false, nil) })
	b.Run("FreshClaimWithFirstStatement", func(b *testing.B) {
		benchGoPhases(b, false, &workflow.Config{ClaimWithFirstStatement: true})
	})
	b.Run("Resume", func(b *testing.B) { benchGoPhases(b, true, nil) })
}

var errBenchRelease = errors.New("released for the benchmark")

func benchGoPhases(b *testing.B, resume bool, ecfg *workflow.Config) {
	ctx := context.Background()
	db := pgtest.New(b)
	_, err := db.Pool.Exec(ctx, pipeSchema)
	require.NoError(b, err)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(b, err)
	cfg.MaxConns = 1
	ct := &stmtTrips{}
	cfg.ConnConfig.Tracer = ct
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	e, err := workflow.New(pool, ecfg)
	require.NoError(b, err)
	flow := goGateFlow("go_bench", settleStmts["ExecArgs"], nil)
	flow.Phases[1] = phases.Call("pay", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
		if strings.HasPrefix(run.Key(), "r-") && run.Attempt() == 1 {
			return nil, phases.RetryLater(errBenchRelease, time.Millisecond)
		}
		return nil, nil
	})
	require.NoError(b, e.Register(flow))
	key := func(i int) string {
		if resume {
			return "r-" + benchKey()
		}
		return benchKey()
	}
	run := func(k string) {
		if resume {
			if _, err := e.Do(ctx, goReq("go_bench", k)); !errors.Is(err, workflow.ErrTransient) {
				b.Fatalf("the first attempt was not released: %v", err)
			}
		}
	}
	k := key(0)
	run(k)
	_, err = e.Do(ctx, goReq("go_bench", k)) // warms the statement cache; not counted
	require.NoError(b, err)
	var backend int
	require.NoError(b, pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend))
	var trips, stmts int64
	var client, server time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		k := key(i)
		run(k)
		t0, s0 := ct.trips.Load(), ct.stmts.Load()
		_, sv0, _ := cpumeter.ProcStat(backend)
		c0 := cpumeter.Self()
		b.StartTimer()
		res, err := e.Do(ctx, goReq("go_bench", k))
		if err != nil || res.Replayed || res.Response.Status != http.StatusCreated {
			b.Fatalf("%s: %v %+v", k, err, res)
		}
		b.StopTimer()
		client += cpumeter.Self() - c0
		_, sv1, _ := cpumeter.ProcStat(backend)
		server += sv1 - sv0
		trips += ct.trips.Load() - t0
		stmts += ct.stmts.Load() - s0
		b.StartTimer()
	}
	b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(stmts)/float64(b.N), "stmts/op")
	b.ReportMetric(float64(client.Nanoseconds())/float64(b.N), "client-cpu-ns/op")
	b.ReportMetric(float64(server.Nanoseconds())/float64(b.N), "server-cpu-ns/op")
}
