package reliability

import (
	"context"
	"math/rand/v2"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// TestPgbouncerFaults runs the three flows under load through a pgbouncer of the
// test's own in transaction mode (pgx in pgtest.PooledExecMode), on a database of its
// own, while server connections behind the pooler are terminated at random
// (pg_terminate_backend) and the pooler itself is restarted: killed, which cuts every
// client connection at once, in the middle of a transaction too, and started again (on
// another port, which the pool's BeforeConnect follows). Every key must end finished
// under the checker's invariants. Backs invariants 1, 3, 5 and 6 behind a pooler.
//
// The restart is a kill, not pgbouncer's safe shutdown (Pgbouncer.Stop, SIGINT), which
// waits for every transaction in progress to end: each restart waited on them (40 to
// 380 ms measured here under load; Stop fails past 30 s), the longer the busier the
// machine, and no transaction was ever cut.
func TestPgbouncerFaults(t *testing.T) {
	t.Parallel()
	testPgbouncerFaults(t, false)
}

// TestPgbouncerFaultsPipelined is TestPgbouncerFaults with the flows' pipelined tx
// phases (pipelined_test.go): a phase's BEGIN, claim or fence, statements and COMMIT
// go through the pooler in one round trip (two for the two-call flow's), in the
// pooled exec mode.
func TestPgbouncerFaultsPipelined(t *testing.T) {
	t.Parallel()
	testPgbouncerFaults(t, true)
}

// testPgbouncerFaults is TestPgbouncerFaults, with the pipelined flows if pipelined.
func testPgbouncerFaults(t *testing.T, pipelined bool) {
	pgtest.RequirePgbouncer(t)
	ctx := context.Background()
	srv, err := pgtest.Shared(ctx)
	require.NoError(t, err)
	db := pgtest.NewDatabase(t)
	env := newEnv(t, db).withSide(t)
	env.shape.Pipelined = pipelined
	dbName := func() string { u, _ := url.Parse(db.URL); return u.Path[1:] }()

	var mu sync.Mutex
	start := func() *pgtest.Pgbouncer {
		p, err := pgtest.StartPgbouncer(ctx, srv)
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Stop() })
		return p
	}
	bouncer := start()
	cfg, err := pgxpool.ParseConfig(bouncer.URLFor(dbName, pgtest.PooledExecMode))
	require.NoError(t, err)
	cfg.MaxConns = 8
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.ConnConfig.RuntimeParams["application_name"] = env.appName
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		mu.Lock()
		u, _ := url.Parse(bouncer.URL)
		mu.Unlock()
		port, _ := strconv.Atoi(u.Port())
		cc.Host, cc.Port = u.Hostname(), uint16(port)
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	en := env.engine(pool, &workflow.Config{Lease: 2 * time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond})
	sw := env.sweeper(en, nil)
	require.NoError(t, sw.Start(ctx))

	l := env.startLoad(en, loadOpts{workers: tier(4, 8), prefix: "pgbouncer", attemptTimeout: 5 * time.Second})
	terminated, restarts := 0, 0
	until := time.Now().Add(time.Duration(scale(3, 20, 180)) * time.Second)
	more := chaosRounds(until, func() bool { return terminated > 0 && restarts > 0 })
	for i := 0; more(); i++ {
		pause(nil, 30*time.Millisecond, 150*time.Millisecond)
		if i%15 == 7 {
			mu.Lock()
			old := bouncer
			mu.Unlock()
			require.NoError(t, old.Kill())
			next := start()
			mu.Lock()
			bouncer = next
			mu.Unlock()
			restarts++
			continue
		}
		if rand.IntN(2) == 0 {
			n, err := env.terminate(ctx, 1)
			require.NoError(t, err)
			terminated += n
		}
	}
	drain := l.finish(t)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, sw.Stop(sctx))
	cancel()
	r := env.check(t, checkOpts{keys: l.submitted()})
	require.Positive(t, terminated, "server connections behind the pooler were terminated")
	require.Positive(t, restarts, "the pooler was restarted")
	t.Logf("pgbouncer faults (pipelined=%v): server_connections_terminated=%d pgbouncer_restarts=%d keys=%d attempts=%d drain=%s longest_attempt=%s duplicates=%d unfinished=%d",
		pipelined, terminated, restarts, len(l.submitted()), l.attempts.Load(), drain.Round(time.Millisecond), l.maxAttempt().Round(time.Millisecond),
		r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}
