package workflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetryAfterRule(t *testing.T) {
	t.Parallel()
	e := &Engine{cfg: (&Config{}).WithDefaults()}
	const lease = 30 * time.Second

	require.Equal(t, lease, e.retryAfter("f", lease, lease), "nothing observed: the fallback")
	require.Equal(t, time.Second, e.retryAfter("f", 0, lease), "never under a second")

	e.durations.observe("f", 3*time.Second)
	require.Equal(t, 3*time.Second, e.retryAfter("f", lease, lease), "a 3s flow: 3s, not the 30s lease")
	require.Equal(t, lease, e.retryAfter("other", lease, lease), "per flow")

	e.durations.observe("f", 7*time.Second)
	require.Equal(t, 4*time.Second, e.retryAfter("f", lease, lease), "moves a quarter of the way")
	require.Equal(t, 2*time.Second, e.retryAfter("f", lease, 2*time.Second), "capped by the lease left")
	require.Equal(t, time.Second, e.retryAfter("f", lease, 10*time.Millisecond), "and floored at a second")

	for range 20 {
		e.durations.observe("f", 40*time.Millisecond)
	}
	require.Equal(t, time.Second, e.retryAfter("f", lease, lease), "a fast flow: a second")

	t.Run("Configured", func(t *testing.T) {
		t.Parallel()
		fixed := &Engine{cfg: (&Config{InProgressRetryAfter: 5 * time.Second}).WithDefaults()}
		fixed.durations.observe("f", 40*time.Millisecond)
		require.Equal(t, 5*time.Second, fixed.retryAfter("f", lease, lease))
		require.Equal(t, 2*time.Second, fixed.retryAfter("f", lease, 2*time.Second), "capped by the lease left")

		byLease := &Engine{cfg: (&Config{InProgressRetryAfter: RetryAfterLease}).WithDefaults()}
		byLease.durations.observe("f", 40*time.Millisecond)
		require.Equal(t, 12*time.Second, byLease.retryAfter("f", 12*time.Second, 12*time.Second), "the lease left, as before")

		twice := (&Config{InProgressRetryAfter: RetryAfterLease}).WithDefaults().WithDefaults()
		require.Equal(t, RetryAfterLease, twice.InProgressRetryAfter, "kept as written")
		require.ErrorContains(t, (&Config{InProgressRetryAfter: -2}).WithDefaults().validate(), "InProgressRetryAfter")
	})
}
