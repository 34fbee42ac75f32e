package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
)

// Drain stops the engine for a shutdown, such as on SIGTERM before the process exits.
// From its call on, the engine takes no new attempt (Do and Resume answer a *ShedError
// with ErrDraining: an HTTP handler answers 503 with Retry-After, and a load balancer
// sends the retry to another server), and no running attempt starts a call phase: it
// releases its key instead (its Do returns a *TransientError with ErrDraining), so that
// no call leaves the process after the drain began. Attempts in a tx phase go on.
//
// Drain returns nil once no attempt runs. If ctx ends first, Drain gives up the
// attempts still running: it takes each one's key away from it, bumping the key's lock
// version, so that the attempt can commit nothing more should it still run (a phase or
// a call that outlives the deadline), and clearing the lease, so that a retry reaching
// another server resumes the key at once instead of waiting for the lease to end. It
// then returns an error wrapping ctx's, after the keys are released. An attempt whose
// claim has not committed yet leaves nothing to release: it can no longer commit it.
//
// Call Drain once, after the HTTP server stopped taking connections or together with
// its Shutdown; the engine refuses work for good after it. Stop the process's sweeper
// first (Engine.Stop): its attempts are released the same way, but it should not
// take new keys.
func (e *Engine) Drain(ctx context.Context) error {
	a := e.adm
	a.mu.Lock()
	a.draining = true
	for _, w := range a.waiting {
		w.refused = shed(ErrDraining)
		close(w.ready)
	}
	a.waiting = nil
	a.mu.Unlock()
	for {
		a.mu.Lock()
		idle := a.used == 0 && len(a.running) == 0
		changed := a.changed
		a.watched = true
		a.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return e.abandon(ctx)
		}
	}
}

// abandon gives up the executors still running when a drain's deadline passed: none
// may start after it, none may commit a claim, and the key of each whose row exists is
// released with its lock version bumped.
func (e *Engine) abandon(ctx context.Context) error {
	a := e.adm
	a.mu.Lock()
	a.closed = true
	running := make([]*attempt.Exec, 0, len(a.running))
	for x := range a.running {
		running = append(running, x)
	}
	a.mu.Unlock()
	rctx, cancel := e.bounded(context.WithoutCancel(ctx))
	defer cancel()
	var errs []error
	released := 0
	for _, x := range running {
		g := x.Abandon()
		if !g.Durable {
			continue
		}
		err := e.store.Abandon(rctx, e.pool, g.Fence, "drain: the process stopped before the attempt ended",
			e.entry(Attempt{Attempt: g.Attempt, By: g.By, Outcome: OutcomeReleased, Error: "drained"}))
		switch {
		case err == nil:
			released++
			e.acted(rctx, KeyEvent{Kind: OutcomeReleased, Flow: g.Flow, Scope: g.Fence.Scope, Key: g.Fence.Key, Err: ErrDraining})
		case errors.Is(err, keytable.ErrLeaseLost): // it released its key, or lost it, meanwhile
		default:
			errs = append(errs, err)
		}
	}
	return fmt.Errorf("workflow: drain: %d attempts were still running, %d keys released: %w",
		len(running), released, errors.Join(append([]error{ctx.Err()}, errs...)...))
}

// takeover takes an expired or released lease: the claim of a key whose row exists.
// The caller's ctx is honoured until the statement is sent (and for the wait for a
// connection, bounded by AdmitWait); the statement itself is detached, so that a
// caller going away cannot leave a lease taken that nobody runs.
func (e *Engine) takeover(ctx context.Context, row *keytable.Row) (*keytable.Row, error) {
	if e.adm.Draining() {
		return nil, shed(ErrDraining)
	}
	pc, err := e.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer pc.Release()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("take over key: the caller gave up before the claim: %w", err)
	}
	tctx, cancel := e.bounded(context.WithoutCancel(ctx))
	defer cancel()
	return e.store.Takeover(tctx, pc, row.Fence(), e.cfg.Lease, e.cfg.historyKeep())
}
