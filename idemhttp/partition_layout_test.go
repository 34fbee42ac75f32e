package idemhttp_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// TestMiddlewareLayoutUnknownRunsOnce (issue 36, hole 1): idemhttp.Middleware on a
// partitioned key table, behind an engine whose start-up check of the layout failed
// (the backend of its first pooled connection was terminated, as a pooler's restart
// would): concurrent duplicates each claim with the insert at commit, which takes the
// partitioned layout's checks while the layout is unknown. Each key gets one row and
// one run of the handler; every answer is its 201, the replay, or 409 with
// Retry-After. Before the fix the claim was the plain table's single INSERT, which the
// partitioned primary key does not stop: two rows, two runs.
func TestMiddlewareLayoutUnknownRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	require.NoError(t, store.New().SetupPartitioned(ctx, b.db.Pool, store.PartitionDay, 0))
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	var armed atomic.Bool
	armed.Store(true)
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if !armed.CompareAndSwap(true, false) {
			return true, nil
		}
		var gone bool // pg_terminate_backend waits, up to its timeout, for the backend to exit
		err := b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1::int, 60000::bigint)`, c.PgConn().PID()).Scan(&gone)
		if err == nil && !gone {
			err = fmt.Errorf("backend %d did not exit", c.PgConn().PID())
		}
		return true, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var logs lockedBuffer
	var unknown atomic.Int64
	e, err := workflow.New(pool, &workflow.Config{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Hooks: workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
			if ev.Kind == workflow.OutcomeLayoutUnknown {
				unknown.Add(1)
			}
		}},
	})
	require.NoError(t, err)

	var mu sync.Mutex
	runs := map[string]int{}
	srv := middlewareServer(t, e, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs[r.PathValue("id")]++ // the effect
		n := runs[r.PathValue("id")]
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, n)
	}))

	first := mustSend(t, srv, "POST", "/v1/things/first", keyed("acct", "first"), `{}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, "the first request ran on a terminated connection: %s", first.body)
	require.EqualValues(t, 1, unknown.Load(), "OutcomeLayoutUnknown events")
	require.Contains(t, logs.String(), "level=WARN", logs.String())

	const keys, dups = 20, 4
	out := make(chan reply, keys*dups)
	errs := make(chan error, keys*dups)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		id := fmt.Sprintf("dup-%02d", k)
		for range dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := send(ctx, srv, "POST", "/v1/things/"+id, keyed("acct", id), `{}`)
				if err != nil {
					errs <- err
					return
				}
				out <- r
			}()
		}
	}
	close(start)
	wg.Wait()
	close(out)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for r := range out {
		switch r.status {
		case http.StatusCreated:
			require.Equal(t, `{"run":1}`, string(r.body), "the one run's answer, or its replay")
		case http.StatusConflict:
			require.NotEmpty(t, r.header.Get("Retry-After"), "a 409 carries Retry-After")
		default:
			require.Failf(t, "undocumented answer", "%d %s", r.status, r.body)
		}
	}
	for k := range keys {
		id := fmt.Sprintf("dup-%02d", k)
		var rows int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, id).Scan(&rows))
		require.Equal(t, 1, rows, "key rows for %s", id)
		mu.Lock()
		require.Equal(t, 1, runs[id], "runs of the handler for %s", id)
		mu.Unlock()
		again := mustSend(t, srv, "POST", "/v1/things/"+id, keyed("acct", id), `{}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.True(t, again.replayed())
		require.Equal(t, `{"run":1}`, string(again.body))
	}
}

// lockedBuffer is a bytes.Buffer safe for the engine's concurrent logging.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
