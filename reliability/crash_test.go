package reliability

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/internal/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// crashPoints are the boundaries of each flow where a child SIGKILLs itself: before
// and after the claim's commit, before and after each commit, before and after each
// call. "<last tx phase>/after-commit" is after the response was stored and before it
// was handed to the client.
var crashPoints = map[string][]string{
	chargeflow.FlowName: {
		"create_charge/before-commit", // the claim rides in this commit: before it
		"claimed",                     // right after it
		"create_charge/after-commit",
		"provider_charge/before-call", "provider_charge/after-call",
		"finalize/before-commit", "finalize/after-commit",
	},
	twoCallFlow: {
		"claimed", // a call-first flow commits its claim alone, before the call
		"authorize/before-call", "authorize/after-call",
		"reserve/before-commit", "reserve/after-commit",
		"capture/before-call", "capture/after-call",
		"settle/before-commit", "settle/after-commit",
	},
}

// sweepCrashPoints are the points a sweeper can reach on a key released at its first
// durable recovery point (the charges flow's create_charge, the two-call flow's
// started).
var sweepCrashPoints = map[string][]string{
	chargeflow.FlowName: {"swept", "provider_charge/before-call", "provider_charge/after-call", "finalize/before-commit", "finalize/after-commit"},
	twoCallFlow:         {"swept", "authorize/before-call", "authorize/after-call", "reserve/before-commit", "reserve/after-commit", "capture/before-call", "capture/after-call", "settle/before-commit", "settle/after-commit"},
}

// TestCrashMatrix kills a real process (SIGKILL) at every boundary of both flows,
// several times each, and finishes every key three ways: by the client's retry, by a
// sweeper, and by a sweeper after another sweeper process was killed at the point.
// Backs invariants 1 (one effect), 3 (same answer), 5 and 6 (resume and liveness).
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	trials := tier(1, 4)
	for _, flow := range []string{chargeflow.FlowName, twoCallFlow} {
		t.Run(flow, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := newEnv(t, pgtest.New(t))
			en := env.engine(env.pool(poolOpts{}), nil)
			sw := env.sweeper(en, nil)
			var keys [][2]string
			var crashes, byRetry, bySweeper, bySweeperAfterCrash atomic.Int64
			amount := int64(100)
			points := slices.Clone(crashPoints[flow])
			for _, p := range sweepCrashPoints[flow] {
				if !slices.Contains(points, p) {
					points = append(points, p)
				}
			}
			for _, point := range points {
				for _, rec := range []string{"retry", "sweeper", "sweeper-crash"} {
					if rec == "sweeper-crash" && !slices.Contains(sweepCrashPoints[flow], point) ||
						rec != "sweeper-crash" && !slices.Contains(crashPoints[flow], point) {
						continue
					}
					for trial := range trials {
						amount++
						key := fmt.Sprintf("%s|%s|%d", point, rec, trial)
						req := request("acct", key, flow, amount)
						keys = append(keys, [2]string{"acct", key})
						cfg := childConfig{Mode: "do", Point: point, Action: "kill", Requests: []workflow.Request{req}}
						if rec == "sweeper-crash" {
							// Leave the key released at its first durable recovery point,
							// then kill a sweeper process at the point.
							env.provider.FailNext(1)
							_, err := env.do(ctx, en, req)
							require.ErrorIs(t, err, workflow.ErrTransient, key)
							require.Zero(t, env.provider.Armed())
							env.expireLease(t, "acct", key)
							cfg = childConfig{Mode: "sweep", Point: point, Action: "kill"}
						}
						c := env.startChild(t, cfg)
						killed, lines := c.killed(t)
						require.True(t, killed, "%s: the child was not killed at %s: %+v", key, point, lines)
						crashes.Add(1)
						env.recordChildAnswers("acct", lines)

						st := env.state(t, "acct", key)
						switch rec {
						case "retry":
							if st.Exists && st.Status == "in_progress" {
								_, err := env.do(ctx, en, req)
								require.ErrorIs(t, err, workflow.ErrInProgress, "%s: the dead process's lease is still live", key)
							}
							env.expireLease(t, "acct", key)
							rctx, cancel := context.WithTimeout(ctx, time.Minute)
							a, err := env.retryUntilFinal(rctx, en, req, 20*time.Second)
							cancel()
							require.NoError(t, err)
							require.Contains(t, []int{201, 402}, a.Status, "%s: %+v", key, a)
							byRetry.Add(1)
						case "sweeper", "sweeper-crash":
							env.expireLease(t, "acct", key)
							stats, err := sw.RunOnce(ctx)
							require.NoError(t, err)
							if st.Exists && st.Status == "in_progress" {
								require.Equal(t, 1, stats.Finished, "%s: %+v", key, stats)
								if rec == "sweeper" {
									bySweeper.Add(1)
								} else {
									bySweeperAfterCrash.Add(1)
								}
							} else {
								// Nothing to sweep: the crash came before the claim's commit
								// (no row) or after the finish. The client's retry decides.
								require.Zero(t, stats.Taken, "%s: %+v", key, stats)
								if !st.Exists {
									rctx, cancel := context.WithTimeout(ctx, time.Minute)
									_, err := env.retryUntilFinal(rctx, en, req, 20*time.Second)
									cancel()
									require.NoError(t, err)
								}
							}
						}
						// Every later attempt replays the stored answer.
						res, err := env.do(ctx, en, req)
						require.NoError(t, err, key)
						require.True(t, res.Replayed, key)
					}
				}
			}
			r := env.check(t, checkOpts{keys: keys})
			require.EqualValues(t, len(keys), crashes.Load(), "every trial's crash fired")
			require.Positive(t, crashes.Load())
			t.Logf("crash matrix %s: trials=%d crashes=%d finished_by_retry=%d finished_by_sweeper=%d finished_by_sweeper_after_sweeper_crash=%d keys=%d duplicates=%d unfinished=%d",
				flow, len(keys), crashes.Load(), byRetry.Load(), bySweeper.Load(), bySweeperAfterCrash.Load(), r.Keys,
				r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
		})
	}
}
