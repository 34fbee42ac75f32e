package maintenance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Zero means the default number of attempts, -1 never dead-letters (0 to the executor).
func TestRunOptsAttempts(t *testing.T) {
	t.Parallel()
	require.Equal(t, MaxAttemptsDefault, RunOpts{}.Attempts())
	require.Equal(t, 0, RunOpts{MaxAttempts: -1}.Attempts())
	require.Equal(t, 3, RunOpts{MaxAttempts: 3}.Attempts())
}

// Each fate is counted once, in its own count; FateOther in none.
func TestTakeoverStatsCount(t *testing.T) {
	t.Parallel()
	var st TakeoverStats
	for _, f := range []Fate{FateFinished, FateReleased, FateReleased, FateParked, FateDeadLettered, FateLeaseLost, FateOther} {
		st.count(f)
	}
	require.Equal(t, TakeoverStats{Finished: 1, Released: 2, Parked: 1, DeadLettered: 1, LeaseLost: 1}, st)
}

func TestStopped(t *testing.T) {
	t.Parallel()
	require.False(t, Stopped(context.Background(), nil))
	stop := make(chan struct{})
	require.False(t, Stopped(context.Background(), stop))
	close(stop)
	require.True(t, Stopped(context.Background(), stop))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.True(t, Stopped(ctx, nil))
}

func TestKindString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "finished", Finished.String())
	require.Equal(t, "dead-lettered", Dead.String())
	require.Equal(t, "parked", Parked.String())
}
