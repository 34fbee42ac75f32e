package reliability

import (
	"context"
	"errors"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// cliBinary builds cmd/idemflow once per test run.
var cliBinary = buildOnce("../cmd/idemflow")

// TestOperatorsRaceSweepers runs patient clients of the three flows on an engine
// whose leases the database clock keeps moving into the past while attempts run, with
// two sweepers started (at most 2 attempts a key, so that keys whose provider calls
// fail are dead-lettered), and an operator who, at random moments, releases keys in
// progress (through the engine's admin API and through the idemflow CLI, a real
// process) and re-drives dead-lettered ones (both ways too). A release takes the lease
// from a live holder, whose next commit must be fenced; a clock move makes every live
// holder a zombie at once. At the end the operator re-drives what is dead, the
// sweepers finish everything, and the checker (with the side channels and the history
// of every commit) runs; each kind of operator action and clock move must have
// happened. Backs invariants 2, 1, 6 and 8.
func TestOperatorsRaceSweepers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli, err := cliBinary()
	require.NoError(t, err)
	env := newEnv(t, pgtest.New(t)).withSide(t)
	cfg := &workflow.Config{Lease: 2 * time.Second, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
	en := env.engine(env.pool(poolOpts{maxConns: 8}), cfg)
	var sweepers []*sweeperOn
	for range 2 {
		s := env.sweeper(env.engine(env.pool(poolOpts{maxConns: 4}), cfg),
			&sweeper.Config{Interval: 20 * time.Millisecond, MaxAttempts: 2, Concurrency: 2})
		require.NoError(t, s.Start(ctx))
		sweepers = append(sweepers, s)
	}

	var mu sync.Mutex
	redrove := map[[2]string]bool{}
	flows := []string{chargeflow.FlowName, twoCallFlow, ledgerFlow}
	// A dead-lettered key's 500 sends its client away until the operator re-drives
	// it: it asks again, patiently, like any answer that is not final.
	clients := startPatients(4, "operator", func(w, i int, key string) bool {
		req := request("acct", key, flows[(w+i)%len(flows)], int64(1+(w*7919+i*104729)%10000))
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		res, err := env.do(actx, en, req)
		a := fromDo(res, err, "engine")
		return !a.Retryable && !a.Dead
	})

	randomKey := func(status string) (string, bool) {
		var key string
		err := env.db.Pool.QueryRow(ctx, `SELECT idempotency_key FROM idemflow_keys WHERE status = $1 ORDER BY random() LIMIT 1`, status).Scan(&key)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", false
		}
		require.NoError(t, err)
		return key, true
	}
	runCLI := func(verb, key string) error {
		return exec.Command(cli, "-database-url", env.db.URL, "keys", verb, "acct", key).Run()
	}
	var moves, moved, releasedAPI, releasedCLI, redrivenAPI, redrivenCLI, failures int
	redrive := func(key string, viaCLI bool) {
		var err error
		if viaCLI {
			err = runCLI("redrive", key)
		} else {
			err = en.Redrive(ctx, "acct", key)
		}
		if err == nil {
			mu.Lock()
			redrove[[2]string{"acct", key}] = true
			mu.Unlock()
			if viaCLI {
				redrivenCLI++
			} else {
				redrivenAPI++
			}
		}
	}
	deadline := time.Now().Add(time.Duration(scale(3, 20, 180)) * time.Second)
	more := chaosRounds(deadline, func() bool {
		return moved > 0 && releasedAPI > 0 && releasedCLI > 0 && redrivenAPI+redrivenCLI > 0
	})
	for i := 0; more(); i++ {
		pause(nil, 10*time.Millisecond, 60*time.Millisecond)
		switch i % 5 {
		case 0: // the database clock moves past every lease, while attempts run
			moves++
			moved += int(env.expireAll(t))
		case 1, 3: // release a key in progress
			if i%10 == 3 {
				// The CLI is a process of its own and takes a tenth of a second to
				// start, longer than a key is in progress on a quiet machine: hold the
				// provider's calls while it runs, so that the keys in progress are
				// held by live attempts inside a call (whose next commit the release
				// must fence), then let them go.
				if releaseDuringCalls(env, func() bool {
					key, ok := randomKey("in_progress")
					return ok && runCLI("release", key) == nil
				}) {
					releasedCLI++
				}
				continue
			}
			key, ok := randomKey("in_progress")
			if !ok {
				continue
			}
			if en.ReleaseKey(ctx, "acct", key) == nil {
				releasedAPI++
			}
		case 2: // provider failures, some of which dead-letter keys
			env.provider.FailNext(2)
			failures += 2
		case 4: // re-drive a dead-lettered key
			if key, ok := randomKey("dead"); ok {
				redrive(key, i%10 == 9)
			}
		}
	}
	// The end: no more failures; re-drive what is dead until the clients have their
	// answers.
	env.provider.FailNext(0)
	done := make(chan struct{})
	var keys [][2]string
	var clientErrs []error
	go func() { keys, clientErrs = clients.finish(); close(done) }()
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
			for {
				key, ok := randomKey("dead")
				if !ok {
					break
				}
				redrive(key, false)
			}
			pause(nil, 20*time.Millisecond, 0)
		}
	}
	for _, s := range sweepers {
		require.NoError(t, s.Stop(ctx))
	}
	r := env.check(t, checkOpts{keys: keys, redrove: redrove})
	require.Empty(t, clientErrs)
	require.Positive(t, moves)
	require.Positive(t, moved, "a clock move found a lease to move")
	require.Positive(t, releasedAPI, "the admin API released a key")
	require.Positive(t, releasedCLI, "the CLI released a key")
	require.Positive(t, redrivenAPI+redrivenCLI, "a dead-lettered key was re-driven")
	t.Logf("operators: clock_moves=%d leases_moved=%d released_api=%d released_cli=%d redriven_api=%d redriven_cli=%d provider_failures_armed=%d keys=%d duplicates=%d unfinished=%d %s",
		moves, moved, releasedAPI, releasedCLI, redrivenAPI, redrivenCLI, failures, r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished, r.History)
}

// releaseDuringCalls runs release while every provider call waits, once at least one
// has started, and reports what release did; it gives up, running nothing, when no
// call starts within 5 s.
func releaseDuringCalls(env *env, release func() bool) bool {
	entered := make(chan struct{}, 1)
	held := make(chan struct{})
	env.provider.SetDuring(func() {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-held
	})
	defer func() {
		env.provider.SetDuring(nil)
		close(held)
	}()
	select {
	case <-entered:
		return release()
	case <-time.After(5 * time.Second):
		return false
	}
}
