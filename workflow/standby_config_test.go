package workflow_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// The standby wait's settings; what the wait does against real standbys is in
// reliability (TestFailoverLostCommit, TestFailoverAsyncCommit,
// TestStandbyWaitCountsOnlyPhysical).
func TestStandbyConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	t.Run("Refused", func(t *testing.T) {
		for name, cfg := range map[string]workflow.Config{
			"NegativeWait": {StandbyWait: -time.Second},
			"EmptyName":    {StandbyWait: time.Second, StandbyNames: []string{"a", ""}},
			"LongName":     {StandbyWait: time.Second, StandbyNames: []string{strings.Repeat("n", 64)}},
		} {
			_, err := workflow.New(b.db.Pool, &cfg)
			require.Error(t, err, name)
		}
	})
	t.Run("Copied", func(t *testing.T) {
		names := []string{strings.Repeat("n", 63), "walreceiver"}
		e, err := workflow.New(b.db.Pool, &workflow.Config{StandbyWait: time.Second, StandbyNames: names})
		require.NoError(t, err)
		names[1] = "other"
		require.Equal(t, []string{strings.Repeat("n", 63), "walreceiver"}, e.Config().StandbyNames, "New copies the caller's slice")
	})
}
