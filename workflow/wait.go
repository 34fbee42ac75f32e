package workflow

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
)

// The bounded wait (Request.Wait). An attempt turned away because another attempt
// holds its key may, instead of answering *InProgressError at once, wait for that
// attempt's answer and replay it. A waiter holds no connection and waits on no lock:
// it waits on a channel. What it waits for is learnt in one of two ways:
//
//   - the owner runs in this engine: every attempt that runs a key (a fresh claim or a
//     takeover) is entered in an in-process registry for its duration, and its end
//     wakes the waiters. No statement is sent while it runs; one look-up after.
//   - the owner runs elsewhere (another process, a sweeper): a poller sends the
//     ordinary one-round-trip look-up, the first near the flow's observed answer
//     time, then backing off with jitter, the connection released between polls.
//
// Either way there is one watch per (scope, key) in an engine, however many attempts
// wait on it (the waiters share its look-ups), and at most Config.MaxWaiters attempts
// wait at once. The database is the only state shared between processes: no
// LISTEN/NOTIFY, no session state, so it works behind a pooler in transaction mode and
// on Citus (the look-up is a single-shard statement).
//
// A watch wakes its waiters with the row once the key is answered (finished, dead,
// or in a newer format) or released (a transient failure or an expired lease: the
// waiters then take it over as an ordinary retry would, and one of them resumes it).
// When the claim this engine had in flight ends without a row (its first transaction
// rolled back), the waiters claim the key anew; a remote claim that rolls back cannot
// be told from one still running, so its waiters answer in progress at their bound.

// waitKey names a key in the registry.
type waitKey struct{ scope, key string }

// waits is an engine's registry of the keys its attempts run and of the watches its
// waiters share. The zero value is ready to use.
type waits struct {
	mu      sync.Mutex
	running map[waitKey]*running
	watches map[waitKey]*watch
	waiters int // attempts waiting or about to, for Config.MaxWaiters

	// pollFloor, when positive, replaces the floor of the first poll's delay and lifts
	// the budget; tests set it to watch a remote owner without waiting a fraction of
	// the bound.
	pollFloor time.Duration
	// observe, when set, is told of a watch's steps ("watch", "poll", "wake"); tests
	// count them.
	observe func(step string, k waitKey)
}

// running is the attempts of this engine that run one key; done, made when a waiter
// first asks (busy), is closed when the last of them ends.
type running struct {
	n    int
	done chan struct{}
}

// watch is what the waiters on one key share: its result, once known.
type watch struct {
	k     waitKey
	flow  string
	bound time.Duration
	polls int           // its budget of look-ups
	n     int           // waiters on it
	stop  chan struct{} // closed when the last waiter left before a result
	done  chan struct{} // closed with the result set
	row   *keytable.Row // the key's row when done; nil when it has none
}

// result is the row wt read, once done, as a copy of the waiter's own: the waiters
// share nothing they could change.
func (wt *watch) result() *keytable.Row {
	if wt.row == nil {
		return nil
	}
	r := *wt.row
	r.ResponseBody = slices.Clone(r.ResponseBody)
	r.ResponseHeaders = slices.Clone(r.ResponseHeaders)
	r.PhaseData = slices.Clone(r.PhaseData)
	r.RequestBody = slices.Clone(r.RequestBody)
	return &r
}

// run enters an attempt of this engine that runs (scope, key); end(scope, key, r)
// with what it returns ends it (defer e.waits.end(scope, key, e.waits.run(scope, key))).
func (w *waits) run(scope, key string) *running {
	k := waitKey{scope, key}
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.running[k]
	if r == nil {
		if w.running == nil {
			w.running = map[waitKey]*running{}
		}
		r = &running{}
		w.running[k] = r
	}
	r.n++
	return r
}

// end ends an attempt that run entered, and wakes the waiters once no attempt of this
// engine runs the key.
func (w *waits) end(scope, key string, r *running) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.n--; r.n == 0 {
		delete(w.running, waitKey{scope, key})
		if r.done != nil {
			close(r.done)
		}
	}
}

// busy returns a channel closed when no attempt of this engine runs k any more, or
// nil when none runs it now. The channel is made on the first ask: most keys have no
// waiter.
func (w *waits) busy(k waitKey) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.running[k]
	if r == nil {
		return nil
	}
	if r.done == nil {
		r.done = make(chan struct{})
	}
	return r.done
}

func (w *waits) note(step string, k waitKey) {
	if w.observe != nil {
		w.observe(step, k)
	}
}

// keyWaiter is one attempt's bounded wait. A nil *keyWaiter never waits.
type keyWaiter struct {
	e        *Engine
	k        waitKey
	flow     string
	bound    time.Duration
	deadline time.Time
	joined   bool // holds one of Config.MaxWaiters
}

// newWaiter returns the waiter of an attempt of req, or nil when it does not wait.
func (e *Engine) newWaiter(flow string, req Request) *keyWaiter {
	if req.Wait <= 0 {
		return nil
	}
	return &keyWaiter{e: e, k: waitKey{req.Scope, req.Key}, flow: flow, bound: req.Wait, deadline: time.Now().Add(req.Wait)}
}

// join takes one of the engine's waiter places, once per attempt. False when all are
// taken: the attempt answers at once.
func (w *keyWaiter) join() bool {
	if w.joined {
		return true
	}
	ws := &w.e.waits
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.waiters >= max(w.e.cfg.MaxWaiters, 0) {
		return false
	}
	ws.waiters++
	w.joined = true
	return true
}

// leave gives back the attempt's place. Safe on nil.
func (w *keyWaiter) leave() {
	if w == nil || !w.joined {
		return
	}
	ws := &w.e.waits
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.waiters--
	w.joined = false
}

// ownerHere reports whether an attempt of this engine runs the key and the waiter
// may wait for it: then the waiter waits without sending its look-up.
func (w *keyWaiter) ownerHere() bool {
	return w != nil && time.Now().Before(w.deadline) && w.e.waits.busy(w.k) != nil && w.join()
}

// waits reports whether an attempt that got a should wait rather than answer.
func (w *keyWaiter) waits(a answer) bool {
	return w != nil && a.out.Outcome == OutcomeInProgress && time.Now().Before(w.deadline) && w.join()
}

// wait waits for the key's watch to learn something, the bound to pass or ctx to
// end. It returns the row the watch read (nil for no row), or ok false when the
// attempt should answer as it is.
func (w *keyWaiter) wait(ctx context.Context, polls int) (row *keytable.Row, ok bool) {
	ws := &w.e.waits
	ws.mu.Lock()
	wt := ws.watches[w.k]
	if wt == nil {
		if ws.watches == nil {
			ws.watches = map[waitKey]*watch{}
		}
		wt = &watch{k: w.k, flow: w.flow, bound: w.bound, polls: polls, stop: make(chan struct{}), done: make(chan struct{})}
		ws.watches[w.k] = wt
		go w.e.watch(wt)
	}
	wt.n++
	ws.mu.Unlock()
	w.e.attemptEvent(ctx, KeyEvent{Kind: OutcomeWaiting, Flow: w.flow, Scope: w.k.scope, Key: w.k.key})

	t := time.NewTimer(time.Until(w.deadline))
	defer t.Stop()
	select {
	case <-wt.done:
		return wt.result(), true
	case <-t.C:
	case <-ctx.Done():
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	select {
	case <-wt.done: // the result came as the bound passed: take it
		return wt.result(), true
	default:
	}
	if wt.n--; wt.n == 0 {
		delete(ws.watches, w.k)
		close(wt.stop)
	}
	return nil, false
}

// late is a, the answer of an attempt whose bound passed: its Retry-After, reckoned
// before the wait from the flow's average or the lease left, less the time waited (at
// least a second, as always). A fixed Config.InProgressRetryAfter is kept as it is.
func (w *keyWaiter) late(a answer) answer {
	if a.out.Outcome == OutcomeInProgress && w.e.cfg.InProgressRetryAfter <= 0 {
		waited := time.Since(w.deadline.Add(-w.bound))
		a.out.RetryAfter = max(a.out.RetryAfter-waited, time.Second)
		a.out.Err = &InProgressError{RetryAfter: a.out.RetryAfter}
	}
	return a
}

// watch learns, for the waiters of wt, when its key is answered, released or gone:
// from the registry when an attempt of this engine runs the key, else by polling.
func (e *Engine) watch(wt *watch) {
	e.waits.note("watch", wt.k)
	p := e.newPace(wt.flow, wt.bound, wt.polls)
	for {
		here, ok := e.await(wt, p)
		if !ok {
			return
		}
		e.waits.note("poll", wt.k)
		row, err := e.lookup(context.Background(), wt.k.scope, wt.k.key, false)
		switch {
		case errors.Is(err, keytable.ErrNotFound) && !here:
			// A claim in flight elsewhere (its first transaction): nothing committed yet.
			// Were it rolled back, there is nothing to wait for; the bound passes.
			continue
		case errors.Is(err, keytable.ErrNotFound):
			row = nil // this engine's claim ended without a row: claim it anew
		case err != nil:
			continue // the database is unreachable: poll again later, or let the bound pass
		case row.Status == keytable.StatusInProgress && row.LeaseLive:
			continue // still held
		}
		if e.waits.deliver(wt, row) {
			e.waits.note("wake", wt.k)
		}
		return
	}
}

// await waits until wt should look its key up: when the attempt of this engine that
// runs the key ends (here), or when the pace says. False when the waiters all left, or
// the budget is spent (then after they left).
func (e *Engine) await(wt *watch, p *pace) (here, ok bool) {
	done := e.waits.busy(wt.k)
	var tick <-chan time.Time
	if done == nil {
		delay, ok := p.next()
		if !ok {
			<-wt.stop
			return false, false
		}
		t := time.NewTimer(delay)
		defer t.Stop()
		tick = t.C
	} else if !p.spend() {
		<-wt.stop
		return false, false
	}
	select {
	case <-done: // nil, never ready, unless this engine runs the key
		return true, true
	case <-tick:
		return false, true
	case <-wt.stop:
		return false, false
	}
}

// deliver hands row to wt's waiters, unless they all left.
func (w *waits) deliver(wt *watch, row *keytable.Row) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-wt.stop:
		return false
	default:
	}
	delete(w.watches, wt.k)
	wt.row = row
	close(wt.done)
	return true
}

// Poll budgets: how many look-ups a watch sends at most, so that a waiter sends at
// most 8 statements in all. A waiter that found the key's row held sent one look-up
// before it waits, and its watch polls at most 5 times (6 statements). A waiter that
// found no row and lost the claim to an attempt in its first transaction sent the
// look-up and the claim's BEGIN, lock, look-up and ROLLBACK (5), and its watch polls at
// most 3 times (8). While an attempt of this engine runs the key the watch sends
// nothing; the look-up after it ends is one of the budget.
const (
	pollsAfterLookup = 5
	pollsAfterClaim  = 3
)

// pace spaces a watch's polls over its bound B with a budget of n polls: the first
// near the flow's observed answer time (this engine's average, as for Retry-After)
// but not before B/(2^n−1), each next one twice as late as the one before, less up to
// a quarter at random so that the watches of many processes spread out. The n-th
// poll comes before B, and the next one never does (it would be at least
// 0.75·B·(2^(n+1)−1)/(2^n−1) > B), so the budget holds by the schedule alone.
type pace struct {
	d    time.Duration
	left int
}

func (e *Engine) newPace(flow string, bound time.Duration, polls int) *pace {
	floor := bound / time.Duration(1<<polls-1)
	if e.waits.pollFloor > 0 { // a test's: polls from there on, as long as it waits
		floor, polls = e.waits.pollFloor, 30
	}
	first := floor
	if avg, ok := e.durations.estimate(flow); ok {
		first = max(avg, floor)
	}
	return &pace{d: first, left: polls}
}

// spend takes one poll of the budget without a delay (the look-up after an attempt
// of this engine ended); false when none is left.
func (p *pace) spend() bool {
	if p.left <= 0 {
		return false
	}
	p.left--
	return true
}

// next returns the delay before the next poll, or false when the budget is spent.
func (p *pace) next() (time.Duration, bool) {
	if !p.spend() {
		return 0, false
	}
	d := p.d - time.Duration(rand.Int64N(int64(p.d)/4+1))
	p.d *= 2
	return d, true
}

// durations keeps, per flow, a moving average of how long a new key took from its
// claim to its stored answer, as this engine saw it. An attempt turned away because
// another holds the key is told to retry after about that long: by then the answer is
// likely stored, whereas the end of the lease (an upper bound set for crashes) may be
// far later. The zero value is ready to use; it is safe for concurrent use.
//
// Only attempts that ran a key from the start to its answer count: a resumed key, a
// replay or a failure says nothing about how long the work takes. All middleware routes
// share one flow (idemhttp.MiddlewareFlow, idemhttp.TxMiddlewareFlow), so they share
// one average.
type durations struct {
	flows sync.Map // flow name → *movingAverage; registered flows only
}

// movingAverage is an exponentially weighted moving average of durations, in
// nanoseconds; 0 until the first observation. It is updated without a lock: every
// fresh answer of the flow observes it.
type movingAverage struct{ avg atomic.Int64 }

// averageWeight: each new duration moves the average by 1/averageWeight of its
// distance from it, so the average follows a flow that slows down within a few
// attempts without jumping with every outlier.
const averageWeight = 4

// observe records that a new key of flow took took.
func (d *durations) observe(flow string, took time.Duration) {
	v, ok := d.flows.Load(flow)
	if !ok {
		v, _ = d.flows.LoadOrStore(flow, &movingAverage{})
	}
	m := v.(*movingAverage)
	took = max(took, 1) // 0 means "none yet"
	for {
		old := m.avg.Load()
		next := int64(took)
		if old != 0 {
			next = old + (int64(took)-old)/averageWeight
		}
		if m.avg.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// estimate returns the flow's average, or false before any attempt was observed.
func (d *durations) estimate(flow string) (time.Duration, bool) {
	v, ok := d.flows.Load(flow)
	if !ok {
		return 0, false
	}
	avg := v.(*movingAverage).avg.Load()
	return time.Duration(avg), avg != 0
}

// RetryAfterLease is the Config.InProgressRetryAfter that tells a turned-away attempt
// to retry when the holder's lease ends.
const RetryAfterLease time.Duration = -1

// retryAfter is the Retry-After of an attempt turned away from a key of flow that
// another attempt holds, as Config.InProgressRetryAfter says, at most limit (the time
// left on the holder's lease) and never under one second. fallback is the answer when
// the rule has none: RetryAfterLease, or nothing observed yet.
func (e *Engine) retryAfter(flow string, fallback, limit time.Duration) time.Duration {
	d := fallback
	switch rule := e.cfg.InProgressRetryAfter; {
	case rule > 0:
		d = rule
	case rule == 0:
		if avg, ok := e.durations.estimate(flow); ok {
			d = avg
		}
	}
	return max(min(d, limit), time.Second)
}
