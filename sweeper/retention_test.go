package sweeper_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/testflow"
)

func TestRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for _, k := range []string{"expired", "live"} {
		res, err := b.engine.Do(ctx, chargeReq(k))
		require.NoError(t, err)
		require.Equal(t, 201, res.Response.Status)
	}
	// An unfinished key and a dead-lettered one, both far older than the retention.
	b.stuck(t, chargeReq("unfinished"), testflow.Pay)
	b.stuck(t, chargeReq("dead"), testflow.Pay)
	_, err := b.db.Pool.Exec(ctx, `
		UPDATE idemflow_keys SET created_at = statement_timestamp() - interval '30 days',
			updated_at = statement_timestamp() - interval '30 days',
			next_attempt_at = statement_timestamp() + interval '1 hour'
		WHERE idempotency_key IN ('unfinished', 'dead');
		UPDATE idemflow_keys SET status = 'dead' WHERE idempotency_key = 'dead';
		UPDATE idemflow_keys SET finished_at = statement_timestamp() - interval '24 hours 1 minute',
			created_at = statement_timestamp() - interval '25 hours'
		WHERE idempotency_key = 'expired';
		UPDATE idemflow_keys SET finished_at = statement_timestamp() - interval '23 hours 59 minutes'
		WHERE idempotency_key = 'live'`)
	require.NoError(t, err)
	kept := map[string]string{}
	for _, k := range []string{"live", "unfinished", "dead"} {
		kept[k] = keyRow(t, b.db, k)
	}

	// Past its retention but not yet deleted, a finished key is still replayed: the
	// window is at least Retention.
	res, err := b.engine.Do(ctx, chargeReq("expired"))
	require.NoError(t, err)
	require.True(t, res.Replayed)

	var passes []sweeper.Stats
	s := b.newSweeper(t, &sweeper.Config{Hooks: sweeper.Hooks{Pass: func(_ context.Context, st sweeper.Stats, _ error) {
		passes = append(passes, st)
	}}})
	stats, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Expired: 1}, stats)
	require.Equal(t, []sweeper.Stats{{Expired: 1}}, passes, "the pass hook reports the count")
	require.Equal(t, "", keyRow(t, b.db, "expired"))
	for k, row := range kept {
		require.Equal(t, row, keyRow(t, b.db, k), "%s is kept unchanged", k)
	}

	stats, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{}, stats)

	// After the deletion the same key is a new request.
	res, err = b.engine.Do(ctx, chargeReq("expired"))
	require.NoError(t, err)
	require.False(t, res.Replayed)
}

// Cleaning up a large backlog of expired keys, in short batches, while requests keep
// being served.
func TestRetentionBacklogWhileServing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	const backlog = 200_000
	start := time.Now()
	// One statement, every value computed once or cheaply: the test is about the
	// cleanup, not the insert.
	_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body,
			recovery_point, status, lock_version, locked_until, response_status, response_headers, response_body,
			created_at, updated_at, finished_at)
		SELECT 'old', 'k-' || g, md5('k-' || g)::uuid, 'charge3', 'POST', '/charges', c.fp, '{"amount":1}',
			'finished', 'finished', 1, NULL, 201, '{}', '{"ok":true}',
			c.now - interval '3 days', c.now - interval '3 days',
			c.now - interval '2 days' - g * interval '1 millisecond'
		FROM generate_series(1, %d) g, (SELECT sha256('request') AS fp, statement_timestamp() AS now) c`, backlog))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `ANALYZE idemflow_keys`)
	require.NoError(t, err)
	t.Logf("inserted %d expired keys in %s", backlog, time.Since(start))

	// Requests, one after another, for as long as the cleanup runs.
	var (
		wg        sync.WaitGroup
		stop      = make(chan struct{})
		first     = make(chan struct{})
		latencies []time.Duration
		failures  []error
	)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			res, err := b.engine.Do(ctx, chargeReq(fmt.Sprintf("live-%d", i)))
			latencies = append(latencies, time.Since(t0))
			if err == nil && res.Response.Status != 201 {
				err = fmt.Errorf("status %d", res.Response.Status)
			}
			if err != nil {
				failures = append(failures, err)
			}
			if i == 0 {
				close(first)
			}
		}
	})
	<-first
	start = time.Now()
	stats, err := b.newSweeper(t, nil).RunOnce(ctx)
	took := time.Since(start)
	close(stop)
	wg.Wait()
	require.NoError(t, err)
	require.EqualValues(t, backlog, stats.Expired)
	require.Zero(t, stats.Taken)
	require.Empty(t, failures, "every request during the cleanup succeeded")

	var old, live int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE scope = 'old'),
		count(*) FILTER (WHERE scope = 'acct' AND status = 'finished') FROM idemflow_keys`).Scan(&old, &live))
	require.Zero(t, old)
	require.Equal(t, len(latencies), live, "every live key is kept")

	slices.Sort(latencies)
	pct := func(p float64) time.Duration { return latencies[int(float64(len(latencies)-1)*p)] }
	t.Logf("cleanup of %d keys took %s; %d requests served meanwhile: p50 %s, p99 %s, max %s",
		backlog, took, len(latencies), pct(0.5), pct(0.99), latencies[len(latencies)-1])
}
