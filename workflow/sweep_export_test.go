package workflow

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/internal/maintenance"
)

// The maintenance services' calls one by one (internal/maintenance, sweep.go), for the
// tests that drive a takeover or an expiry call by call; services reach them only
// through Engine.Start, Stop and Sweep.
type (
	Taken   = maintenance.Taken
	RunOpts = maintenance.RunOpts
)

// TakeDueOpts select the keys Maintenance.TakeDue takes.
type TakeDueOpts struct {
	// Limit is the most keys taken. Required, positive.
	Limit int
	// Grace leaves keys claimed less than Grace ago to their client's own retry. Zero
	// means the default, 5s, as SweeperConfig.Grace; -1 means no grace.
	Grace time.Duration
}

// Maintenance is the engine's sweeper services with the default settings, call by call.
type Maintenance struct {
	e  *Engine
	tk *maintenance.Takeover
	ex *maintenance.Expirer
}

// Maintenance returns the engine's sweeper services with the default settings.
func (e *Engine) Maintenance() Maintenance {
	sw, err := e.newSweep(&SweeperConfig{})
	if err != nil {
		panic(err)
	}
	return Maintenance{e: e, tk: sw.takeover, ex: sw.expirer}
}

// TakeDue is the takeover service's TakeDue.
func (m Maintenance) TakeDue(ctx context.Context, opts TakeDueOpts) ([]*Taken, error) {
	return m.tk.TakeDue(ctx, opts.Limit, opts.Grace)
}

// Run runs a taken key as a sweep does, with opts (nil: the defaults).
func (m Maintenance) Run(ctx context.Context, t *Taken, opts *RunOpts) (Result, error) {
	if opts == nil {
		opts = &RunOpts{}
	}
	return m.e.runSwept(ctx, m.tk, t, *opts)
}

// GiveBack is the takeover service's GiveBack.
func (m Maintenance) GiveBack(ctx context.Context, t *Taken) error { return m.tk.GiveBack(ctx, t) }

// ExpireFinished is the expiry service's one statement on finished keys.
func (m Maintenance) ExpireFinished(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	return m.ex.Expire(ctx, maintenance.Finished, retention, limit)
}

// SetStoppingHook makes Stop call f right after it told e's sweeper loop to stop, so
// tests can order their steps after that moment without sleeping. Call it before Start.
func SetStoppingHook(e *Engine, f func()) { e.sweeping.stopping = f }

// SetRestHook makes e's sweeper cleanups call f instead of resting between full
// batches. Call it before the sweeper runs.
func SetRestHook(e *Engine, f func(d time.Duration)) {
	e.sweeping.rest = func(_ context.Context, _ <-chan struct{}, d time.Duration) { f(d) }
}
