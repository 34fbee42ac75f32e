package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// TestRetryAfterFollowsObservedDurations checks that a duplicate of a key whose
// attempt is running is told to retry when the answer is likely stored (the flow's
// observed duration, here milliseconds, so the floor of one second), not when the
// holder's lease of 30 s ends.
func TestRetryAfterFollowsObservedDurations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, e.Config().Lease)

	// Keys named here wait in their call phase until their gate is closed.
	gates := map[string]chan struct{}{"first": make(chan struct{}), "slow": make(chan struct{})}
	inside := make(chan string, len(gates))
	require.NoError(t, e.Register(phases.Flow{Name: "gated", Phases: []phases.Phase{
		phases.Tx("start", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("work", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if gate, ok := gates[run.Key()]; ok {
				inside <- run.Key()
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return nil, nil
		}),
		phases.Tx("end", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) {
			return phases.JSON(201, map[string]string{"ok": "yes"})
		}),
	}}))
	req := func(key string) workflow.Request {
		return workflow.Request{Scope: "acct", Key: key, Flow: "gated", Method: "POST", Route: "/gated", Body: []byte(`{}`)}
	}
	// duplicate starts key, waits until its attempt is in the call phase, and returns
	// what a duplicate of it is told; the attempt then finishes.
	duplicate := func(key string) time.Duration {
		done := make(chan error, 1)
		go func() {
			_, err := e.Do(ctx, req(key))
			done <- err
		}()
		require.Equal(t, key, <-inside)
		_, err := e.Do(ctx, req(key))
		ip, ok := isInProgress(err)
		require.True(t, ok, "%v", err)
		close(gates[key])
		require.NoError(t, <-done)
		return ip.RetryAfter
	}

	require.Greater(t, duplicate("first"), 25*time.Second,
		"before any attempt of the flow was seen, the lease left is all there is to say")
	for _, key := range []string{"w1", "w2", "w3"} {
		_, err := e.Do(ctx, req(key))
		require.NoError(t, err)
	}
	require.Equal(t, time.Second, duplicate("slow"),
		"the flow's attempts take milliseconds: retry after the floor of 1s, not the 30s lease")
}
