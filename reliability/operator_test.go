package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/internal/pgtest"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/workflow"
)

// cliDir holds the idemflow CLI binary; TestMain removes it.
var cliDir string

// cliBinary builds cmd/idemflow once per test run.
var cliBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "reliability-cli-")
	if err != nil {
		return "", err
	}
	cliDir = dir
	bin := filepath.Join(dir, "idemflow")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/idemflow").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build cmd/idemflow: %w\n%s", err, out)
	}
	return bin, nil
})

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
	var sweepers []*sweeper.Sweeper
	for range 2 {
		s := env.sweeper(env.engine(env.pool(poolOpts{maxConns: 4}), cfg),
			&sweeper.Config{Interval: 20 * time.Millisecond, MaxAttempts: 2, Concurrency: 2})
		require.NoError(t, s.Start(ctx))
		sweepers = append(sweepers, s)
	}

	var mu sync.Mutex
	var keys [][2]string
	redrove := map[[2]string]bool{}
	stop := make(chan struct{})
	var clients sync.WaitGroup
	var clientErrs []error
	flows := []string{chargeflow.FlowName, twoCallFlow, ledgerFlow}
	for w := range 4 {
		clients.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("operator-w%d-%d", w, i)
				req := request("acct", key, flows[(w+i)%len(flows)], int64(1+rand.IntN(10000)))
				mu.Lock()
				keys = append(keys, [2]string{"acct", key})
				mu.Unlock()
				// A dead-lettered key's 500 sends its client away until the operator
				// re-drives it: it asks again, patiently.
				rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
				for {
					a, err := env.retryUntilFinal(rctx, en, req, 10*time.Second)
					if err != nil {
						mu.Lock()
						clientErrs = append(clientErrs, err)
						mu.Unlock()
						break
					}
					if !a.Dead {
						break
					}
					if !pause(nil, 50*time.Millisecond, 100*time.Millisecond) || rctx.Err() != nil {
						break
					}
				}
				cancel()
			}
		})
	}

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
	for i := 0; time.Now().Before(deadline); i++ {
		pause(nil, 10*time.Millisecond, 60*time.Millisecond)
		switch i % 5 {
		case 0: // the database clock moves past every lease, while attempts run
			moves++
			moved += int(env.expireAll(t))
		case 1, 3: // release a key in progress
			key, ok := randomKey("in_progress")
			if !ok {
				continue
			}
			if i%10 == 3 {
				if runCLI("release", key) == nil {
					releasedCLI++
				}
			} else if en.ReleaseKey(ctx, "acct", key) == nil {
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
	close(stop)
	env.provider.FailNext(0)
	done := make(chan struct{})
	go func() { clients.Wait(); close(done) }()
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
