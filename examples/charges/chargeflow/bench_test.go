package chargeflow_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// BenchmarkChargeFlow is a fresh key through the charges example's flow, with Go-code
// phases (Flow) and pipelined ones (PipelinedFlow), with its fake provider in process
// at latency 0, on a one-connection pool (so its statement cache is warm); it reports
// round trips per request. It moved here from workflow's benchmarks when the examples
// became a module of their own:
//
//	go test -run '^$' -bench ChargeFlow -benchtime 2000x ./examples/charges/chargeflow
func BenchmarkChargeFlow(b *testing.B) {
	b.Run("Go", func(b *testing.B) { benchChargeFlow(b, chargeflow.Flow) })
	b.Run("Pipelined", func(b *testing.B) { benchChargeFlow(b, chargeflow.PipelinedFlow) })
}

func benchChargeFlow(b *testing.B, flow func(*chargeflow.ProviderClient) phases.Flow) {
	ctx := context.Background()
	srv := httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
	b.Cleanup(srv.Close)
	db := idemflowtest.NewDB(b, chargeflow.Schema)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(b, err)
	cfg.MaxConns = 1
	rt := &roundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	e, err := workflow.New(pool, nil)
	require.NoError(b, err)
	require.NoError(b, e.Register(flow(&chargeflow.ProviderClient{BaseURL: srv.URL, HTTP: srv.Client()})))

	var keys int
	req := func() workflow.Request {
		keys++
		return workflow.Request{Scope: "acct", Key: "bench-" + strconv.Itoa(keys), Flow: chargeflow.FlowName,
			Method: "POST", Route: "/v1/charges", Body: []byte(`{"amount":1999,"currency":"usd","source":"tok_visa"}`)}
	}
	_, err = e.Do(ctx, req()) // warms the statement cache; not timed
	require.NoError(b, err)
	rt.n.Store(0)
	rt.stmts.Store(0)
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		res, err := e.Do(ctx, req())
		if err != nil {
			b.Fatal(err)
		}
		if res.Replayed {
			b.Fatal("a fresh key was replayed")
		}
		n++
	}
	b.ReportMetric(float64(rt.n.Load())/float64(n), "roundtrips/op")
	b.ReportMetric(float64(rt.stmts.Load())/float64(n), "stmts/op")
}

// roundTrips counts a connection's queries and batches, one round trip each, and the
// statements they carry.
type roundTrips struct{ n, stmts atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	r.stmts.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	r.stmts.Add(int64(len(d.Batch.QueuedQueries)))
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
