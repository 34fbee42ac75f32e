package sweeper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestPartitionBoundaryUnderLoad runs the charge flow from four clients across a
// partition boundary of a key table partitioned by the minute, with a sweeper
// maintaining the partitions and finishing keys: new keys, replays of finished ones,
// and keys failed before the boundary (released at settle, paid already) retried after
// it. Every key ends with one row, one ledger row, one settlement and one payment, and
// every answer equals the stored one; keys were claimed on both sides of the boundary
// and some claimed before it finished after it.
func TestPartitionBoundaryUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPartitioned(t)
	sw := b.newSweeper(t, &sweeper.Config{Interval: 100 * time.Millisecond, Retention: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, sw.Start(ctx))
	dbNow := func() time.Time {
		var now time.Time
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now))
		return now
	}
	boundary := dbNow().Truncate(time.Minute).Add(time.Minute)

	var mu sync.Mutex
	answers := map[string][]byte{} // key -> its first final answer
	var pending []string           // keys left released before the boundary
	var failures []error
	record := func(key string, res *workflow.Result, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, workflow.ErrTransient), errors.Is(err, workflow.ErrInProgress):
			pending = append(pending, key)
		case err != nil:
			failures = append(failures, fmt.Errorf("%s: %w", key, err))
		case answers[key] == nil:
			answers[key] = res.Response.Body
		case !bytes.Equal(answers[key], res.Response.Body):
			failures = append(failures, fmt.Errorf("%s: answered %s, then %s", key, answers[key], res.Response.Body))
		}
	}
	// Each worker makes a few keys at once, then waits by the database clock until two
	// seconds before the boundary: the keys (and the checks after the load) stay a few
	// thousand however fast the machine is and however far off the boundary lies.
	approach := boundary.Add(-2 * time.Second)
	const early = 25 // keys a worker makes before it waits for the boundary's approach
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				now := dbNow()
				if now.After(boundary.Add(2 * time.Second)) {
					return
				}
				if i == early && now.Before(approach) {
					if _, err := b.db.Pool.Exec(ctx, `SELECT pg_sleep_until($1)`, approach); err != nil {
						record("wait", nil, err)
						return
					}
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				if i%4 == 3 {
					b.fail.set(key, testflow.Settle, true)
				}
				res, err := b.engine.Do(ctx, chargeReq(key))
				b.fail.set(key, testflow.Settle, false)
				record(key, res, err)
				if i%3 == 2 { // a replay of an earlier key of this worker
					prev := fmt.Sprintf("w%d-%d", w, i/2)
					res, err := b.engine.Do(ctx, chargeReq(prev))
					record(prev, res, err)
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, failures)
	require.True(t, dbNow().After(boundary), "the load crossed the boundary")

	// The released keys, retried after the boundary (a sweeper may have finished some
	// already: then the retry is a replay), and every key once more: a replay.
	// A key may stay in progress while a sweeper finishes it; a minute by the database
	// clock is far beyond any lease here, so a key still refused then is a failure.
	retryUntil := dbNow().Add(time.Minute)
	for _, key := range pending {
		for {
			res, err := b.engine.Do(ctx, chargeReq(key))
			if errors.Is(err, workflow.ErrInProgress) || errors.Is(err, workflow.ErrTransient) {
				require.True(t, dbNow().Before(retryUntil), "%s: still refused a minute after the load: %v", key, err)
				continue // a sweeper holds it, or a retry failed: the client retries
			}
			record(key, res, err)
			break
		}
	}
	require.Empty(t, failures)
	for key, body := range answers {
		res, err := b.engine.Do(ctx, chargeReq(key))
		require.NoError(t, err, key)
		require.True(t, res.Replayed, key)
		require.Equal(t, body, res.Response.Body, key)
		require.Equal(t, 1, keyRows(t, b.db, key), key)
		requireOneEffect(t, b, key, testflow.Pay)
	}
	requireCrossed(t, b, boundary, len(answers), len(pending))
}

// requireCrossed checks that keys were claimed on both sides of boundary and that
// some claimed before it finished after it.
func requireCrossed(t *testing.T, b *bundle, boundary time.Time, keys, released int) {
	t.Helper()
	var before, after, crossed int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE created_at < $1),
	count(*) FILTER (WHERE created_at >= $1),
	count(*) FILTER (WHERE created_at < $1 AND finished_at >= $1)
FROM idemflow_keys`, boundary).Scan(&before, &after, &crossed))
	t.Logf("keys=%d claimed before the boundary=%d after=%d claimed before and finished after=%d released=%d",
		keys, before, after, crossed, released)
	require.Positive(t, before)
	require.Positive(t, after)
	require.Positive(t, crossed, "some key claimed before the boundary finished after it")
}
