package reliability

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemflow/idemflow/testkit/faultproxy"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// networkFault is one case of TestNetworkFaults.
type networkFault struct {
	name  string
	chaos func(p *faultproxy.Proxy, stop <-chan struct{}) // runs until stop
	fired func(p *faultproxy.Proxy) int64
}

// TestNetworkFaults puts the fault proxy between the engine and Postgres and runs load
// through added latency, blackholes, connections reset in the middle of a query and
// half-open connections. The client bounds each attempt with a deadline and the server
// bounds statements with statement_timeout: nothing may hang (every wait on the
// database the engine made had a deadline, at most the client's or the engine's own
// clean-up bound away), and every key must end exactly once. Backs invariants 1, 3, 5
// and 6.
func TestNetworkFaults(t *testing.T) {
	t.Parallel()
	faults := []networkFault{
		{
			name: "latency",
			chaos: func(p *faultproxy.Proxy, stop <-chan struct{}) {
				p.SetLatency(3 * time.Millisecond)
				<-stop
				p.SetLatency(0)
			},
			fired: (*faultproxy.Proxy).Delayed,
		},
		{
			name: "blackhole",
			chaos: func(p *faultproxy.Proxy, stop <-chan struct{}) {
				for pause(stop, 200*time.Millisecond, 600*time.Millisecond) {
					p.Blackhole() // longer than the clients' deadline
					pause(nil, 2500*time.Millisecond, 3500*time.Millisecond)
					p.Heal()
				}
			},
			fired: (*faultproxy.Proxy).HeldUp,
		},
		{
			name: "reset_mid_query",
			chaos: func(p *faultproxy.Proxy, stop <-chan struct{}) {
				for pause(stop, 20*time.Millisecond, 150*time.Millisecond) {
					p.ResetMidQuery(1)
				}
			},
			fired: (*faultproxy.Proxy).Resets,
		},
		{
			name: "half_open",
			chaos: func(p *faultproxy.Proxy, stop <-chan struct{}) {
				for pause(stop, 100*time.Millisecond, 500*time.Millisecond) {
					p.HalfOpen()
				}
			},
			fired: (*faultproxy.Proxy).HalfOpened,
		},
	}
	// The key table partitioned (partition_test.go), and the flows with pipelined tx
	// phases (pipelined_test.go).
	for _, layout := range []string{"", "partitioned_", "pipelined_"} {
		for _, f := range faults {
			t.Run(layout+f.name, func(t *testing.T) {
				t.Parallel()
				env := newEnvOf(t, layout == "partitioned_").withSide(t)
				if layout == "pipelined_" {
					env.withPipelined(t)
				}
				testNetworkFault(t, env, f)
			})
		}
	}
}

// testNetworkFault is one case of TestNetworkFaults, on env.
func testNetworkFault(t *testing.T, env *env, f networkFault) {
	proxy := env.proxy()
	cfg := &workflow.Config{Lease: 2 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}
	dl := &deadlines{}
	en := env.engine(env.pool(poolOpts{via: proxy, connectTimeout: time.Second, deadlines: dl, params: map[string]string{
		"statement_timeout":                   "2s",
		"idle_in_transaction_session_timeout": "3s",
	}}), cfg)
	const deadline = 2 * time.Second
	l := env.startLoad(en, loadOpts{workers: tier(4, 6), prefix: f.name, attemptTimeout: deadline})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); f.chaos(proxy, stop) }()
	pause(nil, time.Duration(scale(2, 20, 150))*time.Second, 0)
	close(stop)
	<-done
	proxy.Heal()
	drain := l.finish(t)
	// A key whose last attempt failed keeps its lease until it ends; the
	// clients finished theirs, so every key is final: check.
	keys := l.submitted()
	r := env.check(t, checkOpts{keys: keys})
	require.Positive(t, f.fired(proxy), "the fault fired")
	dl.requireWithin(t, max(deadline, settleBound))
	require.LessOrEqual(t, l.maxAttempt(), stuckLimit, "an attempt hung")
	t.Logf("network %s: fired=%d keys=%d attempts=%d drain=%s longest_attempt=%s (client deadline %s) %s duplicates=%d unfinished=%d",
		f.name, f.fired(proxy), len(keys), l.attempts.Load(), drain.Round(time.Millisecond),
		l.maxAttempt().Round(time.Millisecond), deadline, dl, r.DuplicateEffects+r.DuplicatePayments+r.DuplicateRows, r.Unfinished)
}

// TestStatementTimeout makes a tx phase run a statement longer than the server's
// statement_timeout on its first attempt: the timeout fires, the attempt fails as
// transient (nothing stored), and the retry or the sweeper finishes the key once.
// Backs invariant 5. The 200 ms timeout is set for the slow phase's transaction only
// (SET LOCAL): set on the whole pool, it would also fire on any of the engine's own
// statements that a busy machine slowed to 200 ms (a commit waiting for its fsync),
// failing the first attempt's expected error or the count of timeouts.
//
// The lease is long for the same reason: it also bounds the phase's transaction (a
// context deadline), so a lease of 2 s let a machine that stalled the transaction's
// first round trips for 1.8 s cancel the sleep by the lease before the statement
// timeout fired (a CI run at load failed so). No key waits for its lease here: the
// first attempt releases its key, the retry and the sweeper take it over at once.
func TestStatementTimeout(t *testing.T) {
	t.Parallel()
	env := newEnv(t, pgtest.New(t))
	var timeouts atomic.Int64
	cfg := &workflow.Config{Lease: time.Minute, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
		Hooks: workflow.Hooks{PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			var pg *pgconn.PgError
			if errors.As(err, &pg) && pg.Code == "57014" { // query_canceled: statement_timeout
				timeouts.Add(1)
			}
		}}}
	en := env.engine(env.pool(poolOpts{}), cfg)
	sw := env.sweeper(en, &workflow.SweeperConfig{Interval: 100 * time.Millisecond})
	require.NoError(t, sw.Start(context.Background()))
	n := scale(6, 40, 100)
	var keys [][2]string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		key := fmt.Sprintf("slow-%d", i)
		req := request("acct", key, twoCallFlow, int64(10+i))
		req.Body = []byte(fmt.Sprintf(`{"amount":%d,"slow_ms":1000,"statement_timeout_ms":200}`, 10+i))
		keys = append(keys, [2]string{"acct", key})
		res, err := en.Do(ctx, req)
		env.answers.record("acct", key, fromDo(res, err, "engine"))
		require.ErrorIs(t, err, workflow.ErrTransient, "the statement timeout fired and nothing was stored")
		var pg *pgconn.PgError
		require.True(t, errors.As(err, &pg) && pg.Code == "57014", "key %s: the first attempt failed by the statement timeout, not by %v", key, err)
		a, err := env.retryUntilFinal(ctx, en, req, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 201, a.Status)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	require.NoError(t, sw.Stop(sctx))
	scancel()
	r := env.check(t, checkOpts{keys: keys})
	require.EqualValues(t, n, timeouts.Load(), "every first attempt hit the statement timeout")
	t.Logf("statement timeout: fired=%d keys=%d duplicates=%d unfinished=%d", timeouts.Load(), r.Keys,
		r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}
