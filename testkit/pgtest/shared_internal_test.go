package pgtest

import (
	"context"
	"testing"
	"time"
)

// TestSharedOutlivesItsCaller: the shared server's start is not bounded by the context
// of the test that happens to call Shared first. Under the stress run that test's bound
// ran out during initdb, the start was killed half-way and every test of the package
// waiting behind it failed. Here the first caller's context has already ended: the
// server still starts and answers. Not parallel: it swaps the package's shared server
// for one of its own while no other test runs, and puts it back.
func TestSharedOutlivesItsCaller(t *testing.T) {
	if dir, looked := findBinDir(); dir == "" && !CitusMode() {
		t.Skipf("no PostgreSQL server binaries (looked in %s)", looked)
	}
	shared.mu.Lock()
	saved, savedErr := shared.srv, shared.err
	shared.srv, shared.err = nil, nil
	shared.mu.Unlock()
	t.Cleanup(func() {
		shared.mu.Lock()
		mine := shared.srv
		shared.srv, shared.err = saved, savedErr
		shared.mu.Unlock()
		if mine != nil {
			if err := mine.Stop(); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
	})

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	srv, err := Shared(ended)
	if err != nil {
		t.Fatalf("Shared with an ended context: %v", err)
	}
	if err := ping(context.Background(), srv.URL, time.Minute); err != nil {
		t.Fatalf("the shared server does not answer: %v", err)
	}
}
