package pooltest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/coretest"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// pooled is a fresh database through pgbouncer with the flow's tables and a provider.
func pooled(t *testing.T) (*pgtest.Pooled, *idemflowtest.Remote) {
	t.Helper()
	p := pgtest.NewPooled(t)
	require.NoError(t, testflow.CreateTables(context.Background(), p.DB.Pool))
	return p, idemflowtest.NewRemote(t, nil)
}

func req(key string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(`{"amount":5}`)}
}

// TestCore runs the engine's core cases, the sweeper's among them, through pgbouncer.
func TestCore(t *testing.T) {
	t.Parallel()
	coretest.Run(t, func(t *testing.T) *coretest.Env {
		p, provider := pooled(t)
		return &coretest.Env{Pool: p.DB.Pool, DB: p.DB.Pool, Provider: provider}
	})
}

// TestWrongExecMode: pgx's default mode keeps named prepared statements per
// connection, which pgbouncer 1.18 in transaction mode hands from one client to
// another. The engine says so, naming the fix, and writes nothing.
func TestWrongExecMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, provider := pooled(t)
	for range 2 { // Migrate sends its statements with the simple protocol: any mode will do
		require.NoError(t, migrations.Migrate(ctx, p.PoolInMode(t, 0)))
	}
	first := testflow.Engine(t, p.PoolInMode(t, 0), nil, provider, nil)
	_, err := first.Do(ctx, req("k1"))
	require.NoError(t, err, "one client connection alone prepares its statements on a fresh server connection")

	// A second client connection, sent to the same server connection by pgbouncer,
	// prepares the same statement names there again.
	second := testflow.Engine(t, p.PoolInMode(t, 0), nil, provider, nil)
	_, err = second.Do(ctx, req("k2"))
	require.ErrorIs(t, err, workflow.ErrMisconfigured)
	require.ErrorContains(t, err, "default_query_exec_mode=cache_describe")
	require.Equal(t, 1, testflow.CountKeys(t, p.Direct.Pool), "nothing written for k2")

	h, err := idemhttp.Handler(second, testflow.Name, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "acct", nil }})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":5}`))
	r.Header.Set("Idempotency-Key", `"k3"`)
	h.ServeHTTP(rec, r)
	require.Equal(t, http.StatusInternalServerError, rec.Code, "a misconfiguration is not a 503 to retry: %s", rec.Body)
}

// TestHTTPAndSweeperLoop: the HTTP handler and a running sweeper, through pgbouncer.
func TestHTTPAndSweeperLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, provider := pooled(t)
	passes := make(chan workflow.SweepStats, 16)
	engine := testflow.Engine(t, p.DB.Pool, nil, provider, nil)
	h, err := idemhttp.Handler(engine, testflow.Name, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "acct", nil }})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	post := func(key string) (*http.Response, string) {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":5}`))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}

	first, body := post("h1")
	require.Equal(t, http.StatusCreated, first.StatusCode, body)
	again, againBody := post("h1")
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, body, againBody)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))

	provider.FailNext(1)
	down, _ := post("h2")
	require.Equal(t, http.StatusServiceUnavailable, down.StatusCode)
	testflow.Sweepable(t, p.Direct.Pool)

	require.NoError(t, engine.Start(ctx, &workflow.SweeperConfig{Grace: -1, Hooks: workflow.SweeperHooks{Pass: func(_ context.Context, s workflow.SweepStats, err error) {
		if err == nil && s.Finished > 0 {
			passes <- s
		}
	}}}))
	t.Cleanup(func() { require.NoError(t, engine.Stop(context.Background())) })
	<-passes // the background loop finished h2
	replay, _ := post("h2")
	require.Equal(t, http.StatusCreated, replay.StatusCode)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	testflow.RequireOneEffect(t, p.Direct.Pool, provider, "acct", "h2")
}
