package sweeper_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// TestEngineWarnsAtStartUp: an engine on a partitioned key table with too few
// partitions ahead warns once, as it starts (on its first connection, before its first
// request's statements), and reports the count with CheckPartitions; on a table with
// enough ahead, and on a plain one, it says nothing.
func TestEngineWarnsAtStartUp(t *testing.T) {
	t.Parallel()
	const warning = "too few partitions of the key table exist ahead"
	ctx := context.Background()
	engine := func(t *testing.T, b *bundle) (*workflow.Engine, func() string) {
		var logs bytes.Buffer
		var mu sync.Mutex
		e, err := workflow.New(b.db.Pool, &workflow.Config{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))})
		require.NoError(t, err)
		require.NoError(t, registerFlows(e, b.provider.URL, nil))
		return e, func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }
	}
	for name, ahead := range map[string]time.Duration{"Few": 2 * time.Minute, "Enough": 0, "Plain": -1} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			if ahead >= 0 {
				require.NoError(t, store.New().SetupPartitioned(ctx, b.db.Pool, store.PartitionMinute, ahead))
			}
			e, logs := engine(t, b)
			for _, key := range []string{"first", "second"} {
				res, err := e.Do(ctx, chargeReq(key))
				require.NoError(t, err)
				require.Equal(t, 201, res.Response.Status)
			}
			r, err := e.CheckPartitions(ctx)
			switch name {
			case "Few":
				require.NoError(t, err)
				require.True(t, r.Low(), "%+v", r)
				require.Equal(t, 1, bytes.Count([]byte(logs()), []byte(warning)), logs())
			case "Enough":
				require.NoError(t, err)
				require.False(t, r.Low(), "%+v", r)
				require.NotContains(t, logs(), warning)
			default:
				require.ErrorIs(t, err, store.ErrNotPartitioned)
				require.NotContains(t, logs(), warning)
			}
		})
	}
}
