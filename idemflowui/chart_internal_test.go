package idemflowui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The chart's buckets start where the database's date_bin(bucket, ts, epoch) puts
// them, also for a bucket that does not divide a day (a 50 minute window's 250 s).
func TestEpochBucket(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 13, 27, 41, 5e8, time.UTC)
	for _, bucket := range []time.Duration{250 * time.Second, 5 * time.Minute, 7 * time.Second, time.Hour} {
		start := epochBucket(at, bucket)
		require.Zero(t, time.Duration(start.UnixNano())%bucket, "%v: aligned on the epoch", bucket)
		require.False(t, start.After(at), "%v", bucket)
		require.Less(t, at.Sub(start), bucket, "%v: the bucket holding the time", bucket)
	}
}
