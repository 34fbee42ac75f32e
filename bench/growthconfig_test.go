package main

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRecentRingPicksOnlyRecentKeys: keys finished longer ago than recentWindow are
// never drawn, across the ring's wrap-around, and an empty window draws nothing.
func TestRecentRingPicksOnlyRecentKeys(t *testing.T) {
	r := newRecentRing(8)
	for i := range 13 { // wraps: the ring keeps keys 5..12, oldest first from start
		r.add("s", strconv.Itoa(i))
	}
	old := time.Now().Add(-2 * recentWindow)
	for i := range 8 { // the five oldest kept (5..9) are old; 10, 11 and 12 recent
		if k, _ := strconv.Atoi(r.keys[i][1]); k < 10 {
			r.at[i] = old
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	for range 500 {
		k, ok := r.pick(rng)
		require.True(t, ok)
		seen[k[1]] = true
	}
	require.Equal(t, map[string]bool{"10": true, "11": true, "12": true}, seen)

	for i := range r.at {
		r.at[i] = old
	}
	_, ok := r.pick(rng)
	require.False(t, ok, "no key within the window: nothing to draw")
}

// TestProductionSettingsSizeToTheMachine: a quarter of the memory for shared buffers,
// three quarters as the cache estimate.
func TestProductionSettingsSizeToTheMachine(t *testing.T) {
	s := productionSettings(24 << 20) // 24 GiB in kB
	require.Contains(t, s, "shared_buffers=6144MB")
	require.Contains(t, s, "effective_cache_size=18432MB")
	_, err := growthConfigsOf("production,default", 1<<20)
	require.NoError(t, err)
	_, err = growthConfigsOf("prod", 1<<20)
	require.Error(t, err)
}
