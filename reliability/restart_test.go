package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
	"github.com/stretchr/testify/require"
)

// TestDatabaseRestart crashes a test-owned Postgres with an immediate shutdown (SIGQUIT
// to the postmaster, as `pg_ctl stop -m immediate`) at random moments under continuous
// load, and restarts it on the same data directory and port (crash recovery from the
// WAL). Clients keep retrying and a sweeper keeps sweeping; every request must end
// exactly once. The drain time is how long after the last restart the last key got its
// final answer. Backs invariants 1, 3, 5 and 6 across a database crash.
func TestDatabaseRestart(t *testing.T) {
	t.Parallel()
	srv, db := pgtest.NewDedicated(t)
	env := newEnv(t, db).withSide(t)
	// A short lease: a commit whose outcome the crash made unknown keeps its key leased
	// until the lease ends.
	cfg := &workflow.Config{Lease: 2 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}
	en := env.engine(env.pool(poolOpts{connectTimeout: 2 * time.Second}), cfg)
	sw := env.sweeper(en, &workflow.SweeperConfig{Interval: 100 * time.Millisecond, MaxAttempts: 1000})
	require.NoError(t, sw.Start(context.Background()))
	l := env.startLoad(en, loadOpts{workers: tier(4, 8), prefix: "restart", attemptTimeout: 5 * time.Second})

	restarts := scale(2, 25, 150)
	var worstRestart time.Duration
	stop := make(chan struct{})
	for range restarts {
		require.True(t, pause(stop, 300*time.Millisecond, 1500*time.Millisecond))
		require.NoError(t, srv.Crash())
		pause(stop, 0, 300*time.Millisecond) // down for a moment
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		require.NoError(t, srv.Restart(ctx))
		cancel()
		worstRestart = max(worstRestart, time.Since(start))
	}
	drain := l.finish(t)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	require.NoError(t, sw.Stop(sctx))
	cancel()

	keys := l.submitted()
	r := env.check(t, checkOpts{keys: keys})
	require.Positive(t, restarts)
	t.Logf("database restart: crashes=%d keys=%d attempts=%d drain=%s worst_restart=%s longest_attempt=%s duplicates=%d unfinished=%d",
		restarts, len(keys), l.attempts.Load(), drain.Round(time.Millisecond), worstRestart.Round(time.Millisecond),
		l.maxAttempt().Round(time.Millisecond), r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}
