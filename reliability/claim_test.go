package reliability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The claim: a new key's first tx phase opens its transaction, takes the key's claim
// lock (a transaction-scoped advisory lock, without waiting) and looks the key row up,
// before any of the phase runs; the key row is inserted with the phase's COMMIT. These
// experiments stop and cut a real holder of the claim lock there.

// TestClaimHolderPaused: a server process paused (SIGSTOP) right after it claimed a new
// key, holding the claim lock with no key row written, does not hold up its
// duplicates: each of them, concurrently, answers 409 while the holder is still
// stopped, runs nothing of the flow, and gives its connection back. Once the holder is
// killed, its lock dies with its connection and a retry claims the key and finishes it
// once. Backs invariants 9 (losers never wait) and 1 (one effect).
func TestClaimHolderPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	var firstRuns atomic.Int64 // runs of create_charge's function in this process
	pool := env.pool(poolOpts{maxConns: 4})
	en := env.engineWith(pool, nil, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		firstRuns.Add(1)
		return nil
	})
	dups := tier(8, 32)
	var keys [][2]string
	paused, busy := 0, 0
	var slowest time.Duration
	for trial := range scale(1, 4, 10) {
		key := fmt.Sprintf("claim-paused|%d", trial)
		req := request("acct", key, chargeflow.FlowName, int64(300+trial))
		keys = append(keys, [2]string{"acct", key})
		zombie := env.startChild(t, childConfig{Mode: "do", Point: chargeflow.PhaseCreate + "/after-claim", Action: "stop",
			Requests: []workflow.Request{req}})
		zombie.paused(t)
		paused++
		// The server's view: the stopped child's session holds the claim lock, in a
		// transaction, and nothing of the key is written.
		holders := env.claimLockHolders(t, env.childApp())
		require.Len(t, holders, 1, "%s: the paused child holds the claim lock\n%s", key, sessions(t, env))
		require.False(t, env.state(t, "acct", key).Exists, key)
		runsBefore := firstRuns.Load()

		// Concurrent duplicates, each bounded by a generous deadline: an engine that
		// waited on the holder would fail here, not hang.
		for _, took := range duplicatesInProgress(t, env, en, req, dups) {
			busy++
			slowest = max(slowest, took)
		}
		// All of them were answered while the holder was stopped, still holding the
		// lock; none ran any of the flow, wrote anything, or kept a connection.
		require.True(t, processStopped(t, zombie.Pid()), "%s: the holder is still stopped", key)
		require.Equal(t, holders, env.claimLockHolders(t, env.childApp()), key)
		require.Equal(t, runsBefore, firstRuns.Load(), "%s: a duplicate ran the flow's first phase", key)
		require.False(t, env.state(t, "acct", key).Exists, key)
		require.Zero(t, env.effects(t, chargeflow.FlowName, "acct", key), key)
		require.Zero(t, pool.Stat().AcquiredConns(), "%s: a duplicate kept a connection", key)
		var open int
		require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, env.appName).Scan(&open))
		require.Zero(t, open, "%s: a duplicate left a transaction open\n%s", key, sessions(t, env))

		// The holder dies; the server ends its backend, and with it the claim lock.
		zombie.Kill(t)
		killed, lines := zombie.killed(t)
		require.True(t, killed, key)
		env.recordChildAnswers("acct", lines)
		env.waitSessionsGone(t, env.childApp())
		require.False(t, env.state(t, "acct", key).Exists, key)
		res, err := env.do(ctx, en, req)
		require.NoError(t, err, "%s: the retry did not claim the key at once", key)
		require.Contains(t, []int{201, 402}, res.Response.Status, key)
		require.False(t, res.Replayed, key)
		require.Equal(t, runsBefore+1, firstRuns.Load(), key)
		res, err = env.do(ctx, en, req)
		require.NoError(t, err, key)
		require.True(t, res.Replayed, key)
	}
	r := env.check(t, checkOpts{keys: keys})
	require.Equal(t, len(keys), paused, "every holder was paused")
	require.Equal(t, len(keys)*dups, busy)
	t.Logf("claim holder paused: trials=%d paused=%d duplicates_answered_in_progress=%d slowest_duplicate=%s keys=%d duplicates=%d unfinished=%d",
		len(keys), paused, busy, slowest.Round(time.Millisecond), r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}

// duplicatesInProgress runs dups concurrent duplicates of req, each with a 30 s
// deadline, requires that each was answered in progress (with a retry-after), and
// returns how long each took.
func duplicatesInProgress(t *testing.T, env *env, en *workflow.Engine, req workflow.Request, dups int) []time.Duration {
	t.Helper()
	type result struct {
		err  error
		took time.Duration
	}
	results := make(chan result, dups)
	var start, wg sync.WaitGroup
	start.Add(1)
	for range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			began := time.Now()
			_, err := env.do(dctx, en, req)
			results <- result{err, time.Since(began)}
		}()
	}
	start.Done()
	wg.Wait()
	close(results)
	var took []time.Duration
	for r := range results {
		var ip *workflow.InProgressError
		require.True(t, errors.As(r.err, &ip), "%s: a duplicate got %v, not in progress", req.Key, r.err)
		require.Positive(t, ip.RetryAfter, req.Key)
		took = append(took, r.took)
	}
	return took
}

// processStopped reports whether the process pid is stopped by a signal (state T in
// /proc/<pid>/stat).
func processStopped(t testing.TB, pid int) bool {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(raw)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces and parentheses
	require.Positive(t, i, s)
	return strings.HasPrefix(s[i+1:], " T ")
}

// TestClaimBackendTerminated: the backend of an attempt that holds a new key's claim is
// terminated (pg_terminate_backend) right after the claim, before any of the phase ran,
// or once the phase ran, before the COMMIT that inserts the key row. The attempt fails
// as transient (nothing stored), no key row and no effect is left, and a retry claims
// the key at once and finishes it once. Backs invariants 1 and 5.
func TestClaimBackendTerminated(t *testing.T) {
	t.Parallel()
	env := newEnv(t, pgtest.New(t))
	gates := &claimGates{}
	cfg := &workflow.Config{Hooks: workflow.Hooks{
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
			if ev.Phase == chargeflow.PhaseCreate {
				gates.hold(ctx, ev.Key, "before-commit")
			}
		},
	}}
	en := env.engineWith(env.pool(poolOpts{}), cfg, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Attempt() == 1 {
			gates.hold(ctx, run.Key(), "after-claim")
		}
		return nil
	})
	var keys [][2]string
	terminated := 0
	for _, point := range []string{"after-claim", "before-commit"} {
		for trial := range scale(2, 10, 50) {
			key := fmt.Sprintf("claim-terminated|%s|%d", point, trial)
			req := request("acct", key, chargeflow.FlowName, int64(400+trial))
			keys = append(keys, [2]string{"acct", key})
			cutHeldClaim(t, env, en, gates.arm(key, point), req)
			terminated++
			res, err := env.do(context.Background(), en, req)
			require.NoError(t, err, "%s: the retry did not claim the key at once", key)
			require.Contains(t, []int{201, 402}, res.Response.Status, key)
			require.False(t, res.Replayed, key)
			res, err = env.do(context.Background(), en, req)
			require.NoError(t, err, key)
			require.True(t, res.Replayed, key)
		}
	}
	r := env.check(t, checkOpts{keys: keys})
	require.Equal(t, len(keys), terminated, "every trial's backend was terminated")
	t.Logf("claim backend terminated: trials=%d backends_terminated=%d keys=%d duplicates=%d unfinished=%d",
		len(keys), terminated, r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}

// claimGate holds the attempt of the key it names at a point, until the test lets go.
type claimGate struct {
	key, point    string
	held, release chan struct{}
}

// claimGates is the one armed claimGate, if any.
type claimGates struct {
	mu sync.Mutex
	g  *claimGate
}

// arm sets the gate for key at point, replacing any other.
func (gs *claimGates) arm(key, point string) *claimGate {
	cur := &claimGate{key: key, point: point, held: make(chan struct{}), release: make(chan struct{})}
	gs.mu.Lock()
	gs.g = cur
	gs.mu.Unlock()
	return cur
}

// hold, when the armed gate names key and point, disarms it, reports it held and
// waits until the test releases it (or ctx ends).
func (gs *claimGates) hold(ctx context.Context, key, point string) {
	gs.mu.Lock()
	cur := gs.g
	if cur == nil || cur.key != key || cur.point != point {
		gs.mu.Unlock()
		return
	}
	gs.g = nil // once
	gs.mu.Unlock()
	close(cur.held)
	select {
	case <-cur.release:
	case <-ctx.Done():
	}
}

// cutHeldClaim starts an attempt of req, terminates its backend once it is held at
// gate, and requires that it failed as transient with nothing stored: no key row, no
// effect, no claim lock left.
func cutHeldClaim(t *testing.T, env *env, en *workflow.Engine, gate *claimGate, req workflow.Request) {
	t.Helper()
	ctx, key := context.Background(), req.Key
	type result struct {
		res *workflow.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := env.do(actx, en, req)
		done <- result{res, err}
	}()
	select {
	case <-gate.held:
	case r := <-done:
		t.Fatalf("%s: the attempt ended before it reached %s: %+v", key, gate.point, r)
	}
	holders := env.claimLockHolders(t, env.appName)
	require.Len(t, holders, 1, "%s: the held attempt holds the claim lock\n%s", key, sessions(t, env))
	var ok bool
	require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1::int)`, holders[0]).Scan(&ok))
	require.True(t, ok, key)
	waitUntil(t, 30*time.Second, key+": the terminated backend is gone", func() bool {
		var n int
		require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, holders[0]).Scan(&n))
		return n == 0
	})
	close(gate.release)
	r := <-done
	require.ErrorIs(t, r.err, workflow.ErrTransient, "%s: %+v", key, r.res)
	var te *workflow.TransientError
	require.ErrorAs(t, r.err, &te)
	require.Nil(t, te.Response, key)
	require.False(t, env.state(t, "acct", key).Exists, "%s: a key row after the cut\n%s", key, auditTrail(t, env, key))
	require.Zero(t, env.effects(t, chargeflow.FlowName, "acct", key), key)
	require.Empty(t, env.claimLockHolders(t, env.appName), key)
}
