package keytable

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOrphanWidth: with no partition attached, the width is learnt from the detached
// ones' names: a day or an hour by their form, a week when day-named ones are a week
// apart, else the smallest gap.
func TestOrphanWidth(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		orphans []string
		want    time.Duration
	}{
		{[]string{"idemflow_keys_p20261130", "idemflow_keys_p20261207"}, PartitionWeek},
		{[]string{"idemflow_keys_p20261130", "idemflow_keys_p20261201"}, PartitionDay},
		{[]string{"idemflow_keys_p20261130"}, PartitionDay},
		{[]string{"idemflow_keys_p2026113013"}, PartitionHour},
		{[]string{"idemflow_keys_p202611301300", "idemflow_keys_p202611301305"}, 5 * time.Minute},
		{[]string{"idemflow_keys_p202611301300"}, PartitionMinute},
	} {
		l := &partitionLayout{orphans: c.orphans}
		w, err := l.orphanWidth()
		require.NoError(t, err, c.orphans)
		require.Equal(t, c.want, w, c.orphans)
	}
	require.NoError(t, validWidth(PartitionWeek))
	require.Error(t, validWidth(2*PartitionWeek))
}
