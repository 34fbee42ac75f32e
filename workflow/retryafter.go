package workflow

import (
	"sync"
	"sync/atomic"
	"time"
)

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
