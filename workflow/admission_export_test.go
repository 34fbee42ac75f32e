package workflow

import "time"

// Waiting is how many attempts wait for a place in flight on e.
func Waiting(e *Engine) int {
	e.adm.mu.Lock()
	defer e.adm.mu.Unlock()
	return len(e.adm.waiting)
}

// SetOverloadAfter sets after how long of waiting without a break e counts as
// overloaded (see admission.overloaded).
func SetOverloadAfter(e *Engine, d time.Duration) {
	e.adm.mu.Lock()
	defer e.adm.mu.Unlock()
	e.adm.overloadAfter = d
}

// Draining reports whether a drain began on e.
func Draining(e *Engine) bool { return e.adm.Draining() }

// SetWaitAvg sets how long e's last waiters for a place waited (see admission.admit).
func SetWaitAvg(e *Engine, d time.Duration) {
	e.adm.mu.Lock()
	defer e.adm.mu.Unlock()
	e.adm.waitAvg = d
}

// SetConnQueue sets how many waits for a pool connection before the claim are under
// way on e and how long the last ones lasted (see connQueue).
func SetConnQueue(e *Engine, pending int, wait time.Duration) {
	e.adm.conns.pending.Store(int64(pending))
	e.adm.conns.wait.Store(int64(wait))
}
