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
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// cliBinary is cmd/idemflow's binary.
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
			&workflow.SweeperConfig{Interval: 20 * time.Millisecond, MaxAttempts: 2, Concurrency: 2})
		require.NoError(t, s.Start(ctx))
		sweepers = append(sweepers, s)
	}

	op := &operator{t: t, env: env, en: en, cli: cli, redrove: map[[2]string]bool{}}
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

	deadline := time.Now().Add(time.Duration(scale(3, 20, 180)) * time.Second)
	more := chaosRounds(deadline, func() bool {
		return op.moved > 0 && op.releasedAPI > 0 && op.releasedCLI > 0 && op.redrivenAPI+op.redrivenCLI > 0
	})
	for i := 0; more(); i++ {
		pause(nil, 10*time.Millisecond, 60*time.Millisecond)
		op.act(i)
	}
	// The end: no more failures; re-drive what is dead until the clients have their
	// answers.
	env.provider.FailNext(0)
	keys, clientErrs := op.redriveUntil(clients.finish)
	for _, s := range sweepers {
		require.NoError(t, s.Stop(ctx))
	}
	r := env.check(t, checkOpts{keys: keys, redrove: op.redrove})
	require.Empty(t, clientErrs)
	require.Positive(t, op.moves)
	require.Positive(t, op.moved, "a clock move found a lease to move")
	require.Positive(t, op.releasedAPI, "the admin API released a key")
	require.Positive(t, op.releasedCLI, "the CLI released a key")
	require.Positive(t, op.redrivenAPI+op.redrivenCLI, "a dead-lettered key was re-driven")
	t.Logf("operators: clock_moves=%d leases_moved=%d released_api=%d released_cli=%d redriven_api=%d redriven_cli=%d provider_failures_armed=%d keys=%d duplicates=%d unfinished=%d %s",
		op.moves, op.moved, op.releasedAPI, op.releasedCLI, op.redrivenAPI, op.redrivenCLI, op.failures, r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished, r.History)
}

// operator is TestOperatorsRaceSweepers' operator: it moves the database clock,
// releases keys in progress and re-drives dead-lettered ones, through the engine's
// admin API and through the idemflow CLI, and counts what it did.
type operator struct {
	t   *testing.T
	env *env
	en  *workflow.Engine
	cli string

	mu      sync.Mutex
	redrove map[[2]string]bool

	moves, moved, releasedAPI, releasedCLI, redrivenAPI, redrivenCLI, failures int
}

// act is the operator's i-th action.
func (op *operator) act(i int) {
	ctx, env := context.Background(), op.env
	switch i % 5 {
	case 0: // the database clock moves past every lease, while attempts run
		op.moves++
		op.moved += int(env.expireAll(op.t))
	case 1, 3: // release a key in progress
		if i%10 == 3 {
			// The CLI is a process of its own and takes a tenth of a second to
			// start, longer than a key is in progress on a quiet machine: hold the
			// provider's calls while it runs, so that the keys in progress are
			// held by live attempts inside a call (whose next commit the release
			// must fence), then let them go.
			if releaseDuringCalls(env, func() bool {
				key, ok := op.randomKey("in_progress")
				return ok && op.runCLI("release", key) == nil
			}) {
				op.releasedCLI++
			}
			return
		}
		key, ok := op.randomKey("in_progress")
		if !ok {
			return
		}
		if op.en.ReleaseKey(ctx, "acct", key) == nil {
			op.releasedAPI++
		}
	case 2: // provider failures, some of which dead-letter keys
		env.provider.FailNext(2)
		op.failures += 2
	case 4: // re-drive a dead-lettered key
		if key, ok := op.randomKey("dead"); ok {
			op.redrive(key, i%10 == 9)
		}
	}
}

// redriveUntil runs finish (the clients') and re-drives every dead key until it
// returns.
func (op *operator) redriveUntil(finish func() ([][2]string, []error)) ([][2]string, []error) {
	done := make(chan struct{})
	var keys [][2]string
	var errs []error
	go func() { keys, errs = finish(); close(done) }()
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
			for {
				key, ok := op.randomKey("dead")
				if !ok {
					break
				}
				op.redrive(key, false)
			}
			pause(nil, 20*time.Millisecond, 0)
		}
	}
	return keys, errs
}

func (op *operator) randomKey(status string) (string, bool) {
	var key string
	err := op.env.db.Pool.QueryRow(context.Background(), `SELECT idempotency_key FROM idemflow_keys WHERE status = $1 ORDER BY random() LIMIT 1`, status).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	require.NoError(op.t, err)
	return key, true
}

func (op *operator) runCLI(verb, key string) error {
	return exec.Command(op.cli, "-database-url", op.env.db.URL, "keys", verb, "acct", key).Run()
}

func (op *operator) redrive(key string, viaCLI bool) {
	var err error
	if viaCLI {
		err = op.runCLI("redrive", key)
	} else {
		err = op.en.Redrive(context.Background(), "acct", key)
	}
	if err == nil {
		op.mu.Lock()
		op.redrove[[2]string{"acct", key}] = true
		op.mu.Unlock()
		if viaCLI {
			op.redrivenCLI++
		} else {
			op.redrivenAPI++
		}
	}
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
