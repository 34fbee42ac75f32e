package sweeper

import (
	"context"
	"time"
)

// SetStoppingHook makes Stop call f right after it told the loop to stop, so tests can
// order their steps after that moment without sleeping.
func SetStoppingHook(s *Sweeper, f func()) { s.stopping = f }

// SetRestHook makes the cleanup call f instead of resting between full batches.
func SetRestHook(s *Sweeper, f func(d time.Duration)) {
	s.rest = func(_ context.Context, _ <-chan struct{}, d time.Duration) { f(d) }
}
