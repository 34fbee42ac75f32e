package sweeper_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// namedPool opens a pool on the test's schema whose connections carry application
// name, so that pg_stat_activity tells them apart.
func namedPool(t *testing.T, url, name string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPartitionMaintenanceUnderTraffic: while requests run, partitions are created
// ahead and a partition past retention is removed, with a long request transaction
// open on the key table all along (the case where a plain DETACH would queue every
// new request behind its lock). pg_locks is sampled throughout: no request ever waits
// on a lock.
func TestPartitionMaintenanceUnderTraffic(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: 12.1 has no DETACH … CONCURRENTLY, so requests do wait on its plain detach there (bounded: " +
			"TestDetachBounded, and measured by TestPartitionsUnderTraffic), which is what this test rules out")
	}
	ctx := context.Background()
	b := setupPartitioned(t)
	old, from := addMinutePartition(t, b.db, -30)
	insertFinishedAt(t, b.db, "old", from)

	app, maintApp := "idemflow_traffic_"+b.db.Schema, "idemflow_maint_"+b.db.Schema
	traffic := namedPool(t, b.db.URL, app)
	maint := namedPool(t, b.db.URL, maintApp)
	cfg := (&workflow.Config{}).WithDefaults()
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := workflow.New(traffic, cfg)
	require.NoError(t, err)
	require.NoError(t, registerFlows(e, b.provider.URL, nil))

	// A request's transaction left open on the key table: a look-up in progress.
	slow, err := traffic.Begin(ctx)
	require.NoError(t, err)
	defer slow.Rollback(ctx)
	_, err = slow.Exec(ctx, `SELECT count(*) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'old'`)
	require.NoError(t, err)

	stop := make(chan struct{})
	done, wait := runRequests(ctx, e, stop)
	st := store.New()
	res := make(chan maintResult, 1)
	go func() {
		var r maintResult
		r.ensured, r.err = st.EnsurePartitions(ctx, maint, 20*time.Minute)
		if r.err == nil {
			r.removed, r.err = st.RemovePartitions(ctx, maint, 10*time.Minute)
		}
		res <- r
	}()
	s, r := sampleMaintenanceLocks(t, b, app, maintApp, slow, res)
	close(stop)
	wait()
	t.Logf("samples %d, with maintenance waiting %d, requests waiting for each other %d, requests finished %d, created %d, removed %d",
		s.samples, s.maintWaits, s.otherWaits, done.Load(), r.ensured.Created, r.removed.Removed)
	require.NoError(t, r.err)
	require.Equal(t, 1, r.removed.Removed)
	require.GreaterOrEqual(t, r.ensured.Created, 1)
	require.NotContains(t, partitionNamesOf(t, b), old)
	require.Positive(t, s.maintWaits, "the detach waited for the slow transaction")
	require.Positive(t, done.Load())
	require.Zero(t, s.trafficWaits, "no request waited on a lock maintenance held or queued for")
}

// maintResult is what a maintenance step reported.
type maintResult struct {
	ensured, removed store.PartitionReport
	err              error
}

// runRequests makes requests on e from four workers until stop is closed; it returns
// the count of those that succeeded and a function that waits for the workers to end.
func runRequests(ctx context.Context, e *workflow.Engine, stop <-chan struct{}) (*atomic.Int64, func()) {
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.Do(ctx, chargeReq(fmt.Sprintf("live-%d-%d", w, i))); err == nil {
					done.Add(1)
				}
			}
		})
	}
	return &done, wg.Wait
}

// lockSamples counts what sampleMaintenanceLocks saw.
type lockSamples struct {
	samples, trafficWaits, otherWaits, maintWaits int
}

// sampleMaintenanceLocks samples pg_locks until maintenance (on connections named
// maintApp) reports on res. Once its backend is seen waiting (for the slow
// transaction), it takes 50 more samples, then commits slow.
//
// A request (on connections named app) counts when maintenance is among what it waits
// for (pg_blocking_pids: the holders of the lock and those queued ahead of it).
// Requests waiting for each other (two inserts extending the table, say) are counted
// apart: they are not what this test is about, and a busy machine makes them now and
// then.
func sampleMaintenanceLocks(t *testing.T, b *bundle, app, maintApp string, slow pgx.Tx, res <-chan maintResult) (lockSamples, maintResult) {
	t.Helper()
	ctx := context.Background()
	const sample = `SELECT
	count(*) FILTER (WHERE a.application_name = $1 AND EXISTS (
		SELECT FROM pg_stat_activity m WHERE m.pid = ANY (pg_blocking_pids(a.pid)) AND m.application_name = $2)),
	count(*) FILTER (WHERE a.application_name = $1),
	count(*) FILTER (WHERE a.application_name = $2)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted`
	var s lockSamples
	afterWait := 0
	for {
		var tw, aw, mw int
		require.NoError(t, b.db.Pool.QueryRow(ctx, sample, app, maintApp).Scan(&tw, &aw, &mw))
		s.samples++
		s.trafficWaits += tw
		s.otherWaits += aw - tw
		if mw > 0 {
			s.maintWaits++
		}
		if s.maintWaits > 0 || s.samples == 20000 {
			afterWait++
			if afterWait == 50 || s.samples == 20000 { // the latter only if it never waits
				require.NoError(t, slow.Commit(ctx))
			}
		}
		select {
		case r := <-res:
			return s, r
		default:
		}
	}
}

func partitionNamesOf(t *testing.T, b *bundle) []string {
	t.Helper()
	parts, err := store.New().Partitions(context.Background(), b.db.Pool)
	require.NoError(t, err)
	var names []string
	for _, p := range parts {
		names = append(names, p.Name)
	}
	return names
}
