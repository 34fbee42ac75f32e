package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/workflow"
)

// load is continuous traffic: workers that each send new keys one after the other and
// retry each until it gets a final answer, as a patient client does.
type load struct {
	env  *env
	en   *workflow.Engine
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	keys     [][2]string
	errs     []error
	maxDo    time.Duration // the longest single attempt
	finals   atomic.Int64
	attempts atomic.Int64
}

type loadOpts struct {
	workers int
	prefix  string
	// attemptTimeout bounds each attempt (the client's deadline). Defaults to 10s.
	attemptTimeout time.Duration
	// drainTimeout bounds how long a worker retries its last key after stop. Defaults
	// to 2 minutes.
	drainTimeout time.Duration
}

// startLoad starts o.workers workers on en, alternating the flows (the ledger flow
// too if the env has side channels).
func (e *env) startLoad(en *workflow.Engine, o loadOpts) *load {
	if o.attemptTimeout == 0 {
		o.attemptTimeout = 10 * time.Second
	}
	if o.drainTimeout == 0 {
		o.drainTimeout = 2 * time.Minute
	}
	l := &load{env: e, en: en, stop: make(chan struct{})}
	for w := range o.workers {
		l.wg.Go(func() {
			flows := []string{chargeflow.FlowName, twoCallFlow}
			if e.side != nil {
				flows = append(flows, ledgerFlow)
			}
			flow := flows[w%len(flows)]
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				key := fmt.Sprintf("%s-w%d-%d", o.prefix, w, i)
				req := request("acct", key, flow, int64(1+rand.IntN(10000)))
				l.mu.Lock()
				l.keys = append(l.keys, [2]string{"acct", key})
				l.mu.Unlock()
				// Once stop is called, the key gets drainTimeout more to finish.
				ctx, cancel := context.WithCancel(context.Background())
				stopped := make(chan struct{})
				go func() {
					defer close(stopped)
					select {
					case <-l.stop:
						t := time.NewTimer(o.drainTimeout)
						defer t.Stop()
						select {
						case <-t.C:
							cancel()
						case <-ctx.Done():
						}
					case <-ctx.Done():
					}
				}()
				err := l.retry(ctx, req, o.attemptTimeout)
				cancel()
				<-stopped
				if err != nil {
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
				}
			}
		})
	}
	return l
}

// retry is env.retryUntilFinal, timing each attempt.
func (l *load) retry(ctx context.Context, req workflow.Request, attemptTimeout time.Duration) error {
	pause := 20 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		start := time.Now()
		res, err := l.en.Do(actx, req)
		took := time.Since(start)
		cancel()
		l.attempts.Add(1)
		l.mu.Lock()
		l.maxDo = max(l.maxDo, took)
		l.mu.Unlock()
		a := fromDo(res, err, "engine")
		a.Start = start
		l.env.answers.record(req.Scope, req.Key, a)
		if !a.Retryable {
			l.finals.Add(1)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("key %s: no final answer before the drain deadline; last: %s", req.Key, a.Err)
		}
		t := time.NewTimer(pause) // the client's back-off
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		pause = min(pause*2, 200*time.Millisecond)
	}
}

// finish stops new keys, waits until every worker's last key has a final answer, and
// returns how long that took (the drain time).
func (l *load) finish(t testing.TB) time.Duration {
	t.Helper()
	start := time.Now()
	close(l.stop)
	l.wg.Wait()
	drain := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		t.Errorf("load: %v", err)
	}
	return drain
}

// submitted returns the keys the load sent.
func (l *load) submitted() [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][2]string(nil), l.keys...)
}

// maxAttempt is the longest single attempt.
func (l *load) maxAttempt() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxDo
}

// pause waits a random time in [lo, hi): the schedule of a chaos loop, not
// synchronisation. It returns false if stop closed first.
func pause(stop <-chan struct{}, lo, hi time.Duration) bool {
	d := lo
	if hi > lo {
		d += rand.N(hi - lo)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}

// patients are patient clients: workers that each send new keys one after the other
// and ask again, with a back-off, until they get a final answer or three minutes
// have passed.
type patients struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	keys [][2]string
	errs []error
}

// startPatients starts workers clients of scope acct; ask sends one attempt for key i
// of worker w (named prefix-w<w>-<i>) and reports whether its answer was final.
func startPatients(workers int, prefix string, ask func(w, i int, key string) bool) *patients {
	p := &patients{stop: make(chan struct{})}
	for w := range workers {
		p.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return
				default:
				}
				key := fmt.Sprintf("%s-w%d-%d", prefix, w, i)
				p.mu.Lock()
				p.keys = append(p.keys, [2]string{"acct", key})
				p.mu.Unlock()
				deadline := time.Now().Add(3 * time.Minute)
				for wait := 20 * time.Millisecond; !ask(w, i, key); wait = min(wait*2, 200*time.Millisecond) {
					if time.Now().After(deadline) {
						p.mu.Lock()
						p.errs = append(p.errs, fmt.Errorf("key %s: no final answer in 3 minutes", key))
						p.mu.Unlock()
						break
					}
					pause(nil, wait, 0) // the client's back-off
				}
			}
		})
	}
	return p
}

// finish stops new keys, waits until every client's last key has its answer, and
// returns the keys sent and the clients' errors.
func (p *patients) finish() ([][2]string, []error) {
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keys, p.errs
}

// chaosRounds reports whether a chaos loop goes on: until its time is up and every
// kind of fault it injects has fired at least once (fired), but never past two
// minutes more, after which the experiment's own assertions report what did not fire.
func chaosRounds(until time.Time, fired func() bool) func() bool {
	limit := until.Add(2 * time.Minute)
	return func() bool {
		now := time.Now()
		return now.Before(until) || !fired() && now.Before(limit)
	}
}
