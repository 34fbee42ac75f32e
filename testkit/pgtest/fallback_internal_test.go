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
