package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

func TestDailyWindowContains(t *testing.T) {
	t.Parallel()
	at := func(h, m int) time.Time { return time.Date(2026, 12, 7, h, m, 0, 0, time.UTC) }
	night := workflow.DailyWindow{From: 2 * time.Hour, To: 5 * time.Hour}
	overMidnight := workflow.DailyWindow{From: 22 * time.Hour, To: 2 * time.Hour}
	for _, tc := range []struct {
		w    workflow.DailyWindow
		t    time.Time
		want bool
	}{
		{night, at(2, 0), true}, // From is in
		{night, at(4, 59), true},
		{night, at(5, 0), false}, // To is out
		{night, at(1, 59), false},
		{night, at(14, 0), false},
		{overMidnight, at(23, 30), true},
		{overMidnight, at(0, 0), true},
		{overMidnight, at(1, 59), true},
		{overMidnight, at(2, 0), false},
		{overMidnight, at(21, 59), false},
		{workflow.DailyWindow{}, at(13, 7), true}, // the zero value is the whole day
		// The clock is read in UTC whatever the time's location.
		{night, time.Date(2026, 12, 7, 2, 30, 0, 0, time.FixedZone("UTC+1", 3600)), false},
		{night, time.Date(2026, 12, 7, 5, 30, 0, 0, time.FixedZone("UTC+1", 3600)), true},
	} {
		require.Equal(t, tc.want, tc.w.Contains(tc.t), "%s at %s", tc.w, tc.t)
	}
	require.Equal(t, "02:00-05:00 UTC", night.String())
	require.Equal(t, "any time", workflow.DailyWindow{}.String())
}

// TestSweeperRefusesABadRemovalWindow: a window that is not two times of day in whole
// minutes, or is empty, is refused by Sweep and Start before anything runs.
func TestSweeperRefusesABadRemovalWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for _, w := range []workflow.DailyWindow{
		{From: -time.Minute, To: time.Hour},
		{From: time.Hour, To: 24 * time.Hour},
		{From: time.Hour + time.Second, To: 2 * time.Hour},
		{From: 3 * time.Hour, To: 3 * time.Hour},
	} {
		cfg := &workflow.SweeperConfig{PartitionRemoval: w}
		_, err := b.engine.Sweep(ctx, cfg)
		require.ErrorContains(t, err, "sweeper: PartitionRemoval: ", "%+v", w)
		require.ErrorContains(t, b.engine.Start(ctx, cfg), "sweeper: PartitionRemoval: ", "%+v", w)
	}
}

// TestDailyWindowText: HH:MM-HH:MM read and written back, nothing for the whole day,
// and anything else refused with the window left as it was.
func TestDailyWindowText(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]workflow.DailyWindow{
		"02:00-05:30": {From: 2 * time.Hour, To: 5*time.Hour + 30*time.Minute},
		"22:00-02:00": {From: 22 * time.Hour, To: 2 * time.Hour},
		"00:00-23:59": {To: 23*time.Hour + 59*time.Minute},
		"":            {},
	} {
		var w workflow.DailyWindow
		require.NoError(t, w.UnmarshalText([]byte(text)), text)
		require.Equal(t, want, w, text)
		back, err := w.MarshalText()
		require.NoError(t, err)
		require.Equal(t, text, string(back))
	}
	before := workflow.DailyWindow{From: time.Hour, To: 2 * time.Hour}
	for _, bad := range []string{"2:00-05:00", "02:00", "02:00-", "02:00-24:00", "03:00-03:00", "02:00-05:00 UTC", "02:60-05:00", "aa:bb-cc:dd", "02:00-05:00\n", "02:00\x00-05:00"} {
		w := before
		require.Error(t, w.UnmarshalText([]byte(bad)), "%q", bad)
		require.Equal(t, before, w, "%q changes nothing", bad)
	}
	_, err := workflow.DailyWindow{From: time.Second, To: time.Hour}.MarshalText()
	require.Error(t, err, "a window that is not whole minutes is not written")
}
