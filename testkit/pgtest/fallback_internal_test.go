package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestFallback: StartWith's fallback step hands back the fallback's server once it
// accepts connections, and Stop calls the fallback's stop function; a fallback that
// fails is reported with its error. The fallback here starts a real throwaway server
// from local binaries, as a container would be started.
func TestFallback(t *testing.T) {
	dir, looked := findBinDir()
	if dir == "" {
		t.Skipf("no PostgreSQL server binaries (looked in %s)", looked)
	}
	ctx := context.Background()
	stopped := 0
	fb := func(ctx context.Context, settings []string) (string, func() error, error) {
		srv, err := startLocal(ctx, dir, settings)
		if err != nil {
			return "", nil, err
		}
		return srv.URL, func() error { stopped++; return srv.Stop() }, nil
	}
	srv, err := startFallback(ctx, fb, []string{"application_name=fallback"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, srv.URL, 10*time.Second); err != nil {
		t.Fatalf("the fallback's server does not answer: %v", err)
	}
	if err := srv.Stop(); err != nil || stopped != 1 {
		t.Fatalf("Stop: %v, the fallback's stop called %d times (want 1)", err, stopped)
	}

	boom := errors.New("boom")
	_, err = startFallback(ctx, func(context.Context, []string) (string, func() error, error) { return "", nil, boom }, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("a failing fallback: got %v, want an error wrapping %v", err, boom)
	}
}

// TestSharedStartOutlivesCallerDeadline: the process-wide server's start runs under a
// bound of its own, not the first caller's deadline. Under load a Citus cluster's
// start outlasted the 2-minute deadline of the test that happened to ask first, and
// every test of the package failed with it (issue 37). Here the first caller's
// deadline has passed before it asks: the start still succeeds, later callers get the
// same server without a second start, and a failed start is remembered.
func TestSharedStartOutlivesCallerDeadline(t *testing.T) {
	t.Parallel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	starts := 0
	start := func(ctx context.Context) (*Server, error) {
		starts++
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("the start has no bound")
		}
		return &Server{URL: "postgres://started"}, nil
	}
	var l lazyServer
	srv, err := l.get(expired, time.Minute, start)
	if err != nil || srv == nil || srv.URL != "postgres://started" {
		t.Fatalf("a caller whose deadline passed: got %v, %v; want the started server", srv, err)
	}
	again, err := l.get(context.Background(), time.Minute, start)
	if err != nil || again != srv || starts != 1 {
		t.Fatalf("a later caller: got %v, %v after %d starts; want the same server, one start", again, err, starts)
	}

	var failed lazyServer
	boom := errors.New("boom")
	for range 2 {
		if _, err := failed.get(context.Background(), time.Minute, func(context.Context) (*Server, error) { starts++; return nil, boom }); !errors.Is(err, boom) {
			t.Fatalf("a failed start: got %v, want %v", err, boom)
		}
	}
	if starts != 2 {
		t.Fatalf("a failed start was tried again: %d starts, want 2", starts)
	}
}
