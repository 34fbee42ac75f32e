package workflow

import (
	"context"
	"time"
)

// The engine's side of its sweeper (sweep.go), for the tests that drive it call by
// call; services reach it only through Engine.Start, Stop and Sweep.
type (
	Maintenance = maintenance
	Taken       = taken
	TakeDueOpts = takeDueOpts
	RunOpts     = runOpts
)

// Maintenance returns the engine's side of its sweeper.
func (e *Engine) Maintenance() Maintenance { return maintenance{e} }

// SetStoppingHook makes Stop call f right after it told e's sweeper loop to stop, so
// tests can order their steps after that moment without sleeping. Call it before Start.
func SetStoppingHook(e *Engine, f func()) { e.sweeping.stopping = f }

// SetRestHook makes e's sweeper cleanups call f instead of resting between full
// batches. Call it before the sweeper runs.
func SetRestHook(e *Engine, f func(d time.Duration)) {
	e.sweeping.rest = func(_ context.Context, _ <-chan struct{}, d time.Duration) { f(d) }
}
