package workflow_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// Benchmarks of the engine's hot paths, for profiling; the side-by-side comparison is
// `go run ./bench`. Each database benchmark reports round trips per operation, counted
// by a pgx tracer on a one-connection pool (so the statement cache is warm):
//
//	go test -run '^$' -bench . -benchtime 2000x -cpuprofile cpu.out ./workflow/
//	go tool pprof -top cpu.out

// benchKeys makes keys that are fresh across every benchmark of the process.
var benchKeys atomic.Int64

func benchKey() string { return "bench-" + strconv.FormatInt(benchKeys.Add(1), 10) }

// Flows with no SQL of their own, so that only the engine's statements are measured.
const (
	benchClaimFlow   = "bench_claim"   // one tx phase that answers: claim + finish, one commit
	benchAdvanceFlow = "bench_advance" // a tx phase that advances, then one that answers
)

func benchFlows() []phases.Flow {
	answer := func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		return phases.JSON(http.StatusCreated, map[string]string{"key": run.Key()})
	}
	advance := func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		return nil, nil
	}
	return []phases.Flow{
		{Name: benchClaimFlow, Phases: []phases.Phase{phases.Tx("answer", answer)}},
		{Name: benchAdvanceFlow, Phases: []phases.Phase{phases.Tx("advance", advance), phases.Tx("answer", answer)}},
	}
}

type benchEnv struct {
	db     *pgtest.DB
	rt     *roundTrips
	pool   *pgxpool.Pool
	engine *workflow.Engine
}

// newBenchEnv is setup for benchmarks: a fresh schema, a one-connection traced pool
// and an engine with the benchmark flows and any others given.
func newBenchEnv(b *testing.B, flows ...phases.Flow) *benchEnv {
	b.Helper()
	db := pgtest.New(b)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(b, err)
	cfg.MaxConns = 1
	rt := &roundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	e, err := workflow.New(pool, nil)
	require.NoError(b, err)
	for _, f := range append(benchFlows(), flows...) {
		require.NoError(b, e.Register(f))
	}
	return &benchEnv{db: db, rt: rt, pool: pool, engine: e}
}

func benchRequest(flow, key string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: flow, Method: "POST", Route: "/v1/charges",
		Body: []byte(`{"amount":1999,"currency":"usd","source":"tok_visa"}`)}
}

// do runs fresh keys (or the given key) through flow, b.N times, and reports round
// trips per operation. The first request warms the statement cache and is not timed.
func (be *benchEnv) do(b *testing.B, flow string, key func() string, wantReplay bool) {
	b.Helper()
	ctx := context.Background()
	_, err := be.engine.Do(ctx, benchRequest(flow, key()))
	require.NoError(b, err)
	be.rt.n.Store(0)
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		res, err := be.engine.Do(ctx, benchRequest(flow, key()))
		if err != nil {
			b.Fatal(err)
		}
		if res.Replayed != wantReplay {
			b.Fatalf("replayed = %t, want %t", res.Replayed, wantReplay)
		}
		n++
	}
	b.ReportMetric(float64(be.rt.n.Load())/float64(n), "roundtrips/op")
}

// BenchmarkClaim is a fresh key through a one-phase flow: the lookup, then BEGIN, the
// claim, the fenced finish and COMMIT in one round trip.
func BenchmarkClaim(b *testing.B) {
	be := newBenchEnv(b)
	be.do(b, benchClaimFlow, benchKey, false)
}

// BenchmarkAdvance is BenchmarkClaim plus one tx phase that advances the recovery point
// (BEGIN, the fenced advance and COMMIT in one round trip): the difference between the
// two is the cost of an advance.
func BenchmarkAdvance(b *testing.B) {
	be := newBenchEnv(b)
	be.do(b, benchAdvanceFlow, benchKey, false)
}

// BenchmarkReplay is a retry of a finished key: one lookup.
func BenchmarkReplay(b *testing.B) {
	be := newBenchEnv(b)
	key := benchKey()
	be.do(b, benchClaimFlow, func() string { return key }, true)
}

// BenchmarkFingerprint hashes a request: the exact canonical form and sha256.
func BenchmarkFingerprint(b *testing.B) {
	small := []byte(`{"source":"tok_visa","amount":1999,"currency":"usd"}`)
	large := []byte(`{"items":[`)
	for i := range 100 {
		if i > 0 {
			large = append(large, ',')
		}
		large = fmt.Appendf(large, `{"sku":"sku_%04d","qty":%d,"price":%d.5,"note":"a note of some length"}`, i, i%7+1, i*100)
	}
	large = append(large, "]}"...)
	for _, c := range []struct {
		name string
		body []byte
	}{{"ChargeJSON", small}, {"LargeJSON", large}, {"Raw", []byte("amount=1999&currency=usd&source=tok_visa")}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				_ = workflow.WholeFingerprint("POST", "/v1/charges", c.body)
			}
		})
	}
}

// BenchmarkFingerprint1MiB hashes a realistic 1 MiB JSON body (orders with line items,
// addresses and metadata, keys out of order, escapes and decimals): V2 is Fingerprint,
// V1 the RFC 8785 fingerprint it replaced, still computed for rows written before v2.
// DeepObjects is the worst case of the reordering, objects nested as deep as allowed
// with their members out of order.
func BenchmarkFingerprint1MiB(b *testing.B) {
	orders := realisticJSON(1 << 20)
	deep := deepObjectsJSON(1 << 20)
	for _, c := range []struct {
		name string
		body []byte
		fp   func(method, route string, body []byte) []byte
	}{
		{"V2", orders, workflow.WholeFingerprint},
		{"V1", orders, func(m, r string, body []byte) []byte { fp := workflow.FingerprintV1(m, r, body); return fp[:] }},
		{"V2DeepObjects", deep, workflow.WholeFingerprint},
	} {
		b.Run(c.name, func(b *testing.B) {
			spaced := append([]byte(" "), c.body...)
			require.Equal(b, c.fp("POST", "/v1/orders", c.body), c.fp("POST", "/v1/orders", spaced), "hashed as JSON, not as bytes")
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				_ = c.fp("POST", "/v1/orders", c.body)
			}
		})
	}
}

// realisticJSON returns a JSON object of at least n bytes: a page of orders.
func realisticJSON(n int) []byte {
	body := []byte(`{"object":"list","has_more":false,"data":[`)
	for i := 0; len(body) < n; i++ {
		if i > 0 {
			body = append(body, ',')
		}
		body = fmt.Appendf(body, `{"id":"ord_%08d","currency":"eur","amount_total":%d,"created":%d,`+
			`"customer":{"name":"Zoë Müller-%d","email":"zoe.%d@example.com","phone":null,`+
			`"address":{"line1":"%d Rue de l\u2019Église","city":"Paris","postal_code":"750%02d","country":"FR"}},`+
			`"items":[{"sku":"sku_%04d","qty":%d,"unit_price":"%d.%02d","tax_rate":0.2,"discount":1.5e-1},`+
			`{"sku":"sku_%04d","qty":1,"unit_price":"12.00","tax_rate":0.055,"discount":0}],`+
			`"metadata":{"source":"web","campaign":"spring \"sale\"","ab_test":true},"paid":%t}`,
			i, 1999+i*7, 1700000000+i, i, i, i%200+1, i%20, i%9000, i%5+1, i%500, i%100, (i+1)%9000, i%2 == 0)
	}
	return append(body, "]}"...)
}

// deepObjectsJSON returns a JSON array of at least n bytes of objects nested as deep as
// Fingerprint canonicalises (an empty array in the innermost) whose members come in
// reverse order, so every level is reordered.
func deepObjectsJSON(n int) []byte {
	body := []byte(`[`)
	for i := 0; len(body) < n; i++ {
		if i > 0 {
			body = append(body, ',')
		}
		for range workflow.MaxCanonicalDepth - 2 {
			body = append(body, `{"z":1,"y":"two","x":`...)
		}
		body = append(body, `null`...)
		for range workflow.MaxCanonicalDepth - 2 {
			body = append(body, `,"a":[]}`...)
		}
	}
	return append(body, ']')
}
