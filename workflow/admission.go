package workflow

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
)

// Defaults of the admission settings of Config (MaxInFlight, AdmitWait).
const (
	// MaxInFlightDefault is the cap on attempts in flight when the pool does not say
	// its size (it is not a *pgxpool.Pool).
	MaxInFlightDefault = 64
	// InFlightPerConnDefault is, with a *pgxpool.Pool, how many attempts in flight
	// the default cap allows per connection of the pool: an attempt holds a connection
	// only during its transactions, not during its call phases or between phases.
	InFlightPerConnDefault = 64
	// AdmitWaitDefault is how long an attempt waits at most, before its claim, for a
	// place in flight and then for a pool connection.
	AdmitWaitDefault = 5 * time.Second
)

// Shedding under sustained overload (adaptive LIFO, after CoDel): while the engine is
// only busy, waiters get places oldest first. When more attempts wait than it has
// places and some have waited without a break for overloadAfter, it is overloaded
// rather than meeting a burst: places go to the newest waiter (its client is the
// likeliest still waiting) and each new arrival turns away the waiters that have waited
// longer than overloadWait (the oldest), so that refusals are fast.
const (
	overloadAfter = 100 * time.Millisecond
	overloadWait  = 10 * time.Millisecond
)

var (
	// ErrOverloaded: the attempt was turned away before its claim, because the engine
	// had Config.MaxInFlight attempts in flight or no pool connection came within
	// Config.AdmitWait, or at once because the queue it would have joined was hopeless
	// (its last waits took over a quarter of AdmitWait, or over what was left of the
	// caller's deadline). Nothing was written. It comes inside a *ShedError.
	ErrOverloaded = vocab.ErrOverloaded
	// ErrDraining: the attempt was turned away, or released its key before a call
	// phase, because the engine is draining (Engine.Drain). It comes inside a
	// *ShedError when nothing was written, inside a *TransientError when the key was
	// released.
	ErrDraining = vocab.ErrDraining
)

// ShedError turns an attempt away before its claim: the engine is overloaded or
// draining. Nothing was written; the client should retry, with the same key, after
// RetryAfter (one second; an idemhttp handler answers 503 with Retry-After). Err is
// ErrOverloaded or ErrDraining (Unwrap).
type ShedError = vocab.ShedError

func shed(why error) *ShedError { return vocab.Shed(why) }

// admission caps the attempts in flight (Do's), keeps the waiting ones newest first,
// and knows the executors running, for a drain.
type admission struct {
	limit         int           // 0: no cap
	overloadAfter time.Duration // see overloaded

	mu        sync.Mutex
	used      int           // attempts admitted and not yet done
	waiting   []*waiter     // a stack: the newest waiter last
	busySince time.Time     // since when waiting has not been empty
	waitAvg   time.Duration // moving average of the last waits for a place (1/8 the newest)
	draining  bool          // no attempt is admitted
	closed    bool          // the drain's deadline passed: no executor may start
	running   map[*attempt.Exec]struct{}
	changed   chan struct{} // closed (and replaced) when used or running shrinks, once watched
	watched   bool          // a drain took changed since it was made

	conns connQueue // the waits for a pool connection before the claim
}

// connQueue follows the waits for a pool connection before the claim (look-ups, first
// transactions, takeovers), so that a new attempt can be turned away at once when
// the queue it would join is hopeless, instead of after AdmitWait: the pool's queue
// is first come, first served, so a new waiter waits about as long as the last ones
// did. Lock-free: every attempt passes here.
type connQueue struct {
	pending atomic.Int64 // waits under way
	wait    atomic.Int64 // moving average of the last waits (1/8 the newest), ns
}

// observe adds a wait that ended (with a connection, or at its bound).
func (q *connQueue) observe(d time.Duration) {
	for {
		old := q.wait.Load()
		if q.wait.CompareAndSwap(old, old+(int64(d)-old)/8) {
			return
		}
	}
}

// expected is how long a wait that began now would likely last: none while nobody
// waits, else about as long as the last waits.
func (q *connQueue) expected() time.Duration {
	if q.pending.Load() == 0 {
		return 0
	}
	return time.Duration(q.wait.Load())
}

type waiter struct {
	ready   chan struct{}
	since   time.Time
	granted bool  // the place was handed over
	refused error // else why it was turned away (overload, drain)
}

func newAdmission(limit int) *admission {
	return &admission{limit: max(limit, 0), overloadAfter: overloadAfter, running: map[*attempt.Exec]struct{}{}, changed: make(chan struct{})}
}

// inFlightLimit is the cap on attempts in flight for cfg.MaxInFlight on pool: 0 for
// no cap.
func inFlightLimit(pool Pool, maxInFlight int) int {
	switch {
	case maxInFlight < 0:
		return 0
	case maxInFlight > 0:
		return maxInFlight
	}
	if p, ok := pool.(*pgxpool.Pool); ok {
		return InFlightPerConnDefault * int(p.Config().MaxConns)
	}
	return MaxInFlightDefault
}

// admit takes a place in flight, waiting at most wait (forever when negative) and as
// long as ctx, newest waiter first. It returns a *ShedError when the wait passed or the
// engine drains, and ctx's error when the caller gave up.
func (a *admission) admit(ctx context.Context, wait time.Duration) error {
	a.mu.Lock()
	switch {
	case a.draining:
		a.mu.Unlock()
		return shed(ErrDraining)
	case a.limit == 0 || a.used < a.limit:
		a.used++
		a.mu.Unlock()
		return nil
	}
	now := time.Now()
	if bound := hopeless(ctx, wait); bound >= 0 && len(a.waiting) > 0 && a.waitAvg > bound {
		a.mu.Unlock() // the last waiters waited too long: this one would too
		return shed(ErrOverloaded)
	}
	w := &waiter{ready: make(chan struct{}), since: now}
	if len(a.waiting) == 0 {
		a.busySince = now
	} else if a.overloaded(now) && wait >= 0 {
		a.shedOldest(now)
	}
	a.waiting = append(a.waiting, w)
	a.mu.Unlock()
	var expired <-chan time.Time
	if wait >= 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-w.ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = shed(ErrOverloaded)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted || w.refused == nil && ctx.Err() == nil { // a caller that gave up says nothing of the queue
		a.waitAvg += (time.Since(w.since) - a.waitAvg) / 8
	}
	switch {
	case w.granted && err == nil:
		return nil
	case w.granted: // handed over as we gave up: pass it on
		a.handOn()
		return err
	case !isClosed(w.ready): // still waiting: leave the stack
		a.waiting = slices.DeleteFunc(a.waiting, func(o *waiter) bool { return o == w })
		return err
	}
	return w.refused
}

// shedOldest turns away the waiters that have waited longer than overloadWait. a.mu
// is held.
func (a *admission) shedOldest(now time.Time) {
	n := 0
	for n < len(a.waiting) && now.Sub(a.waiting[n].since) > overloadWait {
		a.waiting[n].refused = shed(ErrOverloaded)
		close(a.waiting[n].ready)
		n++
	}
	a.waiting = slices.Delete(a.waiting, 0, n)
}

// done gives an attempt's place back, to the newest waiter if there is one.
func (a *admission) done() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handOn()
}

// overloaded reports whether the engine is overloaded rather than busy: more attempts
// wait than it has places, and some have waited without a break for overloadAfter.
// a.mu is held.
func (a *admission) overloaded(now time.Time) bool {
	return len(a.waiting) > a.limit && now.Sub(a.busySince) > a.overloadAfter
}

// handOn passes a place to a waiter, or frees it: the oldest waiter while the engine
// is only busy (no waiter starves), the newest once it is overloaded. a.mu is held.
func (a *admission) handOn() {
	if n := len(a.waiting); n > 0 {
		i := 0
		if a.overloaded(time.Now()) {
			i = n - 1
		}
		w := a.waiting[i]
		a.waiting = slices.Delete(a.waiting, i, i+1)
		w.granted = true
		close(w.ready)
		return
	}
	a.used--
	a.signal()
}

// signal wakes a drain waiting for attempts to end. a.mu is held.
func (a *admission) signal() {
	if !a.watched {
		return // nobody waits on it: a request's end makes nothing
	}
	close(a.changed)
	a.changed, a.watched = make(chan struct{}), false
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Enter registers an executor that is about to run phases; false once the drain's
// deadline passed (the executor must then release its key at once).
func (a *admission) Enter(x *attempt.Exec) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.running[x] = struct{}{}
	return true
}

// Leave unregisters an executor.
func (a *admission) Leave(x *attempt.Exec) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.running, x)
	a.signal()
}

// Draining reports whether Drain was called: from then on the engine turns every new
// attempt away before its claim (a *ShedError with ErrDraining), before it looks at
// the request's body, so a caller may skip reading one; a readiness probe may answer
// unready. It never turns false again.
func (e *Engine) Draining() bool { return e.adm.Draining() }

// Draining reports whether a drain began.
func (a *admission) Draining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.draining
}

// admitNew admits a new attempt (Do): it is turned away at once, having sent
// nothing, when the wait for a pool connection it would join is hopeless (see
// hopeless), and otherwise takes a place in flight (admission.admit).
func (e *Engine) admitNew(ctx context.Context) error {
	if bound := hopeless(ctx, e.cfg.AdmitWait); bound >= 0 && e.adm.conns.expected() > bound {
		return shed(ErrOverloaded)
	}
	return e.adm.admit(ctx, e.cfg.AdmitWait)
}

// hopeless is the expected wait over which a new attempt is turned away at once
// rather than queued (-1: never): a quarter of wait (AdmitWait), or what is left of
// ctx's deadline if that is less. Waiting out a queue that cannot be served in time
// would only make the refusal slow, or answer a client that is gone; the quarter
// leaves room for the queue's ups and downs (most waits end well before wait), and
// bursts of a few hundred attempts on a small pool wait well under it.
func hopeless(ctx context.Context, wait time.Duration) time.Duration {
	bound := time.Duration(-1)
	if wait > 0 {
		bound = wait / 4
	}
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); bound < 0 || left < bound {
			bound = max(left, 0)
		}
	}
	return bound
}

// acquire takes a pool connection for a statement before the claim: it waits at most
// AdmitWait (a *ShedError with ErrOverloaded after it) and as long as ctx.
func (e *Engine) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if e.cfg.AdmitWait > 0 {
		actx, cancel = context.WithTimeout(ctx, e.cfg.AdmitWait)
	}
	defer cancel()
	q := &e.adm.conns
	q.pending.Add(1)
	start := time.Now()
	pc, err := e.pool.Acquire(actx)
	if err == nil || ctx.Err() == nil {
		q.observe(time.Since(start)) // a caller that gave up says nothing of the queue
	}
	q.pending.Add(-1)
	switch {
	case err == nil:
		if !e.layout.learnt.Load() {
			e.startupCheck(ctx, pc) // partition.go
		}
		return pc, nil
	case ctx.Err() == nil && actx.Err() != nil:
		return nil, shed(ErrOverloaded)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("acquire connection: %w", ctx.Err())
	}
	return nil, fmt.Errorf("acquire connection: %w", keytable.Classify(err))
}
