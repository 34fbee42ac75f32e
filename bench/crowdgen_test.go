package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
)

// crowdConnsSetup is a real net/http server whose answers the test decides, the
// connections it accepted, and a generator client counting its dials.
type crowdConnsSetup struct {
	cs       *crowdConns
	accepted *atomic.Int64
	dials    *atomic.Int64
	release  chan struct{} // a request with key "hold" waits for it
}

func setupCrowdConns(t *testing.T) *crowdConnsSetup {
	t.Helper()
	s := &crowdConnsSetup{accepted: &atomic.Int64{}, dials: &atomic.Int64{}, release: make(chan struct{})}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch key := r.Header.Get(idemhttp.KeyHeader); {
		case key == "hold":
			<-s.release
			w.WriteHeader(http.StatusCreated)
		case key == "close":
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		case strings.HasPrefix(key, "refuse"):
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"ch_1"}`))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.accepted.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	counting := &atomic.Bool{}
	counting.Store(true)
	s.cs = &crowdConns{addr: strings.TrimPrefix(srv.URL, "http://"), dials: s.dials, counting: counting}
	return s
}

func TestCrowdConns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("KeepsTheConnectionAfterAnAnswer", func(t *testing.T) {
		t.Parallel()
		s := setupCrowdConns(t)
		status, ra, timedOut, err := s.cs.attempt(ctx, "refuse-1", time.Minute)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status)
		require.True(t, ra)
		require.False(t, timedOut)
		status, ra, _, err = s.cs.attempt(ctx, "new-1", time.Minute)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		require.False(t, ra)
		require.EqualValues(t, 1, s.dials.Load(), "the second attempt rides the first's connection")
		require.EqualValues(t, 1, s.accepted.Load())
	})

	t.Run("CountsTheAnswerAndDropsTheConnectionTheServerCloses", func(t *testing.T) {
		t.Parallel()
		s := setupCrowdConns(t)
		status, ra, timedOut, err := s.cs.attempt(ctx, "close", time.Minute)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status)
		require.True(t, ra)
		require.False(t, timedOut)
		status, _, _, err = s.cs.attempt(ctx, "new-3", time.Minute)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		require.EqualValues(t, 2, s.dials.Load(), "a connection the server closed is not reused")
	})

	t.Run("GivesUpAtTheDeadlineAndRetriesOnANewConnection", func(t *testing.T) {
		t.Parallel()
		s := setupCrowdConns(t)
		// The handler holds the request until the client has given up.
		_, _, timedOut, err := s.cs.attempt(ctx, "hold", 50*time.Millisecond)
		require.Error(t, err)
		require.True(t, timedOut, "an attempt past its deadline is a time-out: %v", err)
		close(s.release)
		status, _, timedOut, err := s.cs.attempt(ctx, "new-2", time.Minute)
		require.NoError(t, err)
		require.False(t, timedOut)
		require.Equal(t, http.StatusCreated, status)
		require.EqualValues(t, 2, s.dials.Load(), "the connection given up on is not reused")
		require.EqualValues(t, 2, s.accepted.Load())
	})
}

func TestSchedWaitsBetween(t *testing.T) {
	t.Parallel()
	h := schedLatencies()
	require.NotNil(t, h)
	// The first bucket whose lower bound is at least 100 ms, and one below it.
	slow := -1
	for i, b := range h.Buckets[:len(h.Counts)] {
		if b >= 0.1 {
			slow = i
			break
		}
	}
	require.Positive(t, slow)
	before := make([]uint64, len(h.Counts))
	after := make([]uint64, len(h.Counts))
	before[0], after[0] = 5, 5 // waits before the window are not counted
	after[slow-1] = 90
	after[slow] = 10
	w := schedWaitsBetween(before, after)
	require.EqualValues(t, 100, w.Wakeups)
	require.InDelta(t, 0.10, w.Over, 1e-9)
	require.Equal(t, time.Duration(h.Buckets[slow]*float64(time.Second)), w.P99)
	require.Equal(t, schedWaits{}, schedWaitsBetween(before, after[:1]), "readings of different shapes give nothing")
}
