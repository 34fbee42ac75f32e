package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// syncBuffer is a bytes.Buffer safe for the printer's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStatsLines checks CHARGES_STATS_EVERY: lines of the process's live heap,
// goroutines and pool, and a clear error for a value that is not a duration.
func TestStatsLines(t *testing.T) {
	db := pgtest.New(t)
	t.Setenv(envStatsEvery, "abc")
	require.ErrorContains(t, startStats(context.Background(), db.Pool, &syncBuffer{}), "want a positive duration")
	t.Setenv(envStatsEvery, "0s")
	require.Error(t, startStats(context.Background(), db.Pool, &syncBuffer{}))

	t.Setenv(envStatsEvery, "10ms")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	runtime.GC() // the live heap is known from the first collection on
	require.NoError(t, startStats(ctx, db.Pool, out))
	require.Eventually(t, func() bool { return strings.Count(out.String(), "\n") >= 2 }, time.Minute, 10*time.Millisecond)
	first, _, _ := strings.Cut(out.String(), "\n")
	raw, ok := strings.CutPrefix(first, "charges-stats ")
	require.True(t, ok, first)
	var st processStats
	require.NoError(t, json.Unmarshal([]byte(raw), &st))
	require.Positive(t, st.HeapLive)
	require.Positive(t, st.Goroutines)
	require.Positive(t, st.PoolTotal, "pgtest.New's pool has a connection open")
}

// TestHeapProfiles checks CHARGES_HEAP_PROFILE_DIR and CHARGES_HEAP_PROFILE_EVERY:
// gzipped heap profiles written into the directory one after another, and a clear
// error for an interval that is not a duration or a variable set without the other.
func TestHeapProfiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "heap")
	t.Setenv(envHeapProfileDir, dir)
	t.Setenv(envHeapProfileEvery, "")
	require.ErrorContains(t, startHeapProfiles(context.Background()), "go together")
	t.Setenv(envHeapProfileEvery, "abc")
	require.ErrorContains(t, startHeapProfiles(context.Background()), "want a positive duration")
	_, err := os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing made for a refused setting")

	t.Setenv(envHeapProfileEvery, "10ms")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, startHeapProfiles(ctx))
	var files []string
	require.Eventually(t, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, fmt.Sprintf("heap-%d-*.pb.gz", os.Getpid())))
		return len(files) >= 2
	}, time.Minute, 10*time.Millisecond)
	cancel()
	raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("heap-%d-1.pb.gz", os.Getpid())))
	require.NoError(t, err)
	require.Greater(t, len(raw), 2)
	require.Equal(t, []byte{0x1f, 0x8b}, raw[:2], "gzipped")
}
