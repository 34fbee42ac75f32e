package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// TestPoolExhaustion: a pool of two connections, many concurrent requests and a slow
// provider. Nothing may hang: every attempt returns by its deadline (plus the engine's
// bounded clean-up), failures are retryable (409 or 503), and every key ends exactly
// once. Meanwhile pg_stat_activity is sampled from inside the provider, i.e. while a
// call phase runs: a session of the engine may be idle in transaction only while a
// tx phase of another key is open, never because of a call (no transaction is held
// across a call phase). Backs the design rule "no transaction open across a call" and
// invariants 5 and 6.
func TestPoolExhaustion(t *testing.T) {
	t.Parallel()
	env := newEnv(t, pgtest.New(t))
	s := &idleSampler{}
	cfg := &workflow.Config{Lease: 5 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
		Hooks: s.hooks()}
	proxy := env.proxy() // to slow the database down, so that two connections are not enough
	dl := &deadlines{}
	pool := env.pool(poolOpts{maxConns: 2, via: proxy, deadlines: dl})
	en := env.engine(pool, cfg)
	s.monitor, s.app = env.db.NewPool(t), env.appName

	// First, one request at a time: during each call no session may be in a transaction.
	for i := range 5 {
		env.provider.SetDuring(s.sample)
		req := request("acct", fmt.Sprintf("seq-%d", i), []string{"create_charge", twoCallFlow}[i%2], int64(10+i))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		a, err := env.retryUntilFinal(ctx, en, req, 10*time.Second)
		cancel()
		require.NoError(t, err)
		require.False(t, a.Retryable)
	}
	require.Zero(t, s.idleDuringCall.Load(), "a session was idle in transaction during a call with nothing else running")

	// Then many at once, with a slow provider and a slow database, through two
	// connections.
	env.provider.SetLatency(100 * time.Millisecond)
	proxy.SetLatency(2 * time.Millisecond)
	n := tier(24, 200)
	const deadline = 2 * time.Second
	// Both connections are taken for longer than a client's deadline while the burst
	// starts, so that the pool is surely exhausted whatever the machine's speed.
	defer holdConns(t, pool, 2, deadline+500*time.Millisecond)()
	b := &poolBurst{env: env, en: en, deadline: deadline}
	keys := make([][2]string, n)
	for i := range n {
		keys[i] = [2]string{"acct", fmt.Sprintf("burst-%d", i)}
	}
	b.burst(keys)
	burstFinal := b.final.Load()
	env.provider.SetDuring(nil)
	env.provider.SetLatency(0)
	proxy.SetLatency(0)
	b.finishLeft(t, keys)
	r := env.check(t, checkOpts{keys: keys})
	require.EqualValues(t, n, b.final.Load(), "every request got a final answer")
	require.Positive(t, b.retryable.Load(), "the pool was exhausted: some attempts were turned away")
	dl.requireWithin(t, settleBound) // the patient clients' attempts have 10s deadlines
	require.LessOrEqual(t, time.Duration(b.longest.Load()), stuckLimit, "an attempt hung on the pool")
	require.Positive(t, s.samples.Load(), "pg_stat_activity was sampled during calls")
	require.Zero(t, s.violations.Load(), s.firstViolation)
	require.Positive(t, proxy.Delayed())
	t.Logf("pool exhaustion: max_conns=2 requests=%d final_in_burst=%d retryable_answers=%d longest_attempt=%s (deadline %s) samples_during_calls=%d idle_in_tx_beyond_open_tx_phases=%d %s keys=%d duplicates=%d unfinished=%d",
		n, burstFinal, b.retryable.Load(), time.Duration(b.longest.Load()).Round(time.Millisecond), deadline, s.samples.Load(), s.violations.Load(), dl,
		r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}

// idleSampler samples pg_stat_activity from inside the provider (while a call phase
// runs): the engine's sessions idle in transaction must not outnumber its tx phases
// running then (counted by its phase hooks).
type idleSampler struct {
	monitor *pgxpool.Pool
	app     string
	inTx    atomic.Int64 // tx phases of this engine now running

	samples, idleDuringCall, violations atomic.Int64
	mu                                  sync.Mutex
	firstViolation                      string
}

func (s *idleSampler) hooks() workflow.Hooks {
	return workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindTx {
				s.inTx.Add(1)
			}
			return ctx
		},
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if ev.Kind == phases.KindTx {
				s.inTx.Add(-1)
			}
		},
	}
}

func (s *idleSampler) sample() {
	before := s.inTx.Load()
	var idle int64
	err := s.monitor.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, s.app).Scan(&idle)
	after := s.inTx.Load()
	if err != nil {
		return
	}
	s.samples.Add(1)
	s.idleDuringCall.Add(idle)
	if idle > max(before, after) {
		s.violations.Add(1)
		s.mu.Lock()
		if s.firstViolation == "" {
			s.firstViolation = fmt.Sprintf("%d sessions idle in transaction while %d..%d tx phases ran", idle, before, after)
		}
		s.mu.Unlock()
	}
}

// holdConns takes n connections of pool and gives them back after d; the function it
// returns gives them back at once if they are still held (a test that failed first
// must, or the pool cannot close).
func holdConns(t *testing.T, pool *pgxpool.Pool, n int, d time.Duration) func() {
	t.Helper()
	held := make([]interface{ Release() }, 0, n)
	for range n {
		c, err := pool.Acquire(untraced(context.Background()))
		require.NoError(t, err)
		held = append(held, c)
	}
	release := func() {
		for _, c := range held {
			c.Release()
		}
	}
	releaseHeld := time.AfterFunc(d, release)
	return func() {
		if releaseHeld.Stop() {
			release()
		}
	}
}

// poolBurst is TestPoolExhaustion's burst of clients with short deadlines, and what
// they got.
type poolBurst struct {
	env      *env
	en       *workflow.Engine
	deadline time.Duration

	retryable, final, longest atomic.Int64
}

// burst sends one client per key at once, each making a few attempts.
func (b *poolBurst) burst(keys [][2]string) {
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			req := request("acct", keys[i][1], []string{"create_charge", twoCallFlow}[i%2], int64(100+i))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			backoff := 50 * time.Millisecond
			// A few attempts during the burst; what is left is retried afterwards by a
			// few patient clients (sustained overload with short deadlines wastes the
			// pool on attempts that time out: see docs/RELIABILITY.md).
			for try := 0; try < 3 && ctx.Err() == nil; try++ {
				actx, acancel := context.WithTimeout(ctx, b.deadline)
				start := time.Now()
				res, err := b.en.Do(actx, req)
				took := time.Since(start)
				acancel()
				for {
					cur := b.longest.Load()
					if int64(took) <= cur || b.longest.CompareAndSwap(cur, int64(took)) {
						break
					}
				}
				a := fromDo(res, err, "engine")
				b.env.answers.record("acct", req.Key, a)
				if !a.Retryable {
					b.final.Add(1)
					return
				}
				b.retryable.Add(1)
				backoff = min(backoff*2, time.Second) // the client backs off, with jitter
				t := time.NewTimer(backoff/2 + rand.N(backoff/2))
				<-t.C
			}
		})
	}
	wg.Wait()
}

// finishLeft has four patient clients finish the keys the burst left unfinished.
func (b *poolBurst) finishLeft(t *testing.T, keys [][2]string) {
	t.Helper()
	left := make(chan workflow.Request, len(keys))
	for i, k := range keys {
		if s := b.env.state(t, k[0], k[1]); s.Status != "finished" {
			left <- request("acct", k[1], []string{"create_charge", twoCallFlow}[i%2], int64(100+i))
		}
	}
	close(left)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for req := range left {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				a, err := b.env.retryUntilFinal(ctx, b.en, req, 10*time.Second)
				cancel()
				if err == nil && !a.Retryable {
					b.final.Add(1)
				}
			}
		})
	}
	wg.Wait()
}
