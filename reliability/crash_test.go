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
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// crashPoints are the boundaries of each flow where a child SIGKILLs itself: right
// after a new key's claim, before and after the commit that writes the key row, before
// and after each commit, before and after each call. "<last tx phase>/after-commit" is
// after the response was stored and before it was handed to the client.
var crashPoints = map[string][]string{
	chargeflow.FlowName: {
		// The claim lock is held and the key row not written; nothing of the phase ran
		// (Hooks.ClaimHeld, see childproc.Points). With the claim folded into the first
		// statement's round trip (flowShape.FoldedClaim), that statement ran, uncommitted.
		"create_charge/after-claim",
		"create_charge/before-commit", // the phase ran; the key row's insert rides in its commit: before it
		"claimed",                     // right after that commit
		"create_charge/after-commit",
		"provider_charge/before-call", "provider_charge/after-call",
		"finalize/before-commit", "finalize/after-commit",
	},
	twoCallFlow: {
		"claimed", // a call-first flow claims and inserts its key row in one statement, committed alone before the call
		"authorize/before-call", "authorize/after-call",
		"reserve/before-commit", "reserve/after-commit",
		"capture/before-call", "capture/after-call",
		"settle/before-commit", "settle/after-commit",
	},
	ledgerFlow: {
		"debit/after-claim", "debit/before-commit", "claimed", "debit/after-commit",
		"notify/before-call", "notify/after-call",
		"post/before-commit", "post/after-commit",
	},
}

// sweepCrashPoints are the points a sweeper can reach on a key released at its first
// durable recovery point (the charges flow's create_charge, the two-call flow's
// started).
var sweepCrashPoints = map[string][]string{
	chargeflow.FlowName: {"swept", "provider_charge/before-call", "provider_charge/after-call", "finalize/before-commit", "finalize/after-commit"},
	twoCallFlow:         {"swept", "authorize/before-call", "authorize/after-call", "reserve/before-commit", "reserve/after-commit", "capture/before-call", "capture/after-call", "settle/before-commit", "settle/after-commit"},
	ledgerFlow:          {"swept", "notify/before-call", "notify/after-call", "post/before-commit", "post/after-commit"},
}

// TestCrashMatrix kills a real process (SIGKILL) at every boundary of the three flows,
// several times each, and finishes every key three ways: by the client's retry, by a
// sweeper, and by a sweeper after another sweeper process was killed at the point.
// Backs invariants 1 (one effect), 3 (same answer), 5 and 6 (resume and liveness).
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	trials := scale(1, 4, 10)
	pipelined, readAtClaim := flowShape{Pipelined: true}, flowShape{Pipelined: true, ReadAtClaim: true} // pipelined_test.go
	folded := flowShape{FoldedClaim: true}
	for _, c := range []struct {
		flow  string
		shape flowShape
	}{{chargeflow.FlowName, flowShape{}}, {twoCallFlow, flowShape{}}, {ledgerFlow, flowShape{}},
		{chargeflow.FlowName, pipelined}, {twoCallFlow, pipelined}, {chargeflow.FlowName, readAtClaim},
		{chargeflow.FlowName, folded}, {ledgerFlow, folded}} {
		flow, name := c.flow, c.shape.prefix()+c.flow
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t, pgtest.New(t))
			if flow == ledgerFlow {
				env.withSide(t) // effects a rollback cannot undo, seen from outside
			}
			env.shape = c.shape
			crashPoints := map[string][]string{flow: flowCrashPoints(flow, c.shape)}
			en := env.engine(env.pool(poolOpts{}), nil)
			m := &crashRig{env: env, en: en, sw: env.sweeper(en, nil), flow: flow}
			var keys [][2]string
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
						keys = append(keys, [2]string{"acct", key})
						m.trial(t, point, rec, request("acct", key, flow, amount))
					}
				}
			}
			r := env.check(t, checkOpts{keys: keys})
			require.EqualValues(t, len(keys), m.crashes.Load(), "every trial's crash fired")
			require.Positive(t, m.crashes.Load())
			t.Logf("crash matrix %s: trials=%d crashes=%d no_key_row_claimed_at_once=%d finished_by_retry=%d finished_by_sweeper=%d finished_by_sweeper_after_sweeper_crash=%d keys=%d duplicates=%d unfinished=%d",
				name, len(keys), m.crashes.Load(), m.claimedAtOnce.Load(), m.byRetry.Load(), m.bySweeper.Load(), m.bySweeperAfterCrash.Load(), r.Keys,
				r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
		})
	}
}

// crashRig is one TestCrashMatrix subtest's engine and sweeper for one flow, and its
// counts of crashes and of how each key was finished.
type crashRig struct {
	env                                                             *env
	en                                                              *workflow.Engine
	sw                                                              *sweeperOn
	flow                                                            string
	crashes, byRetry, bySweeper, bySweeperAfterCrash, claimedAtOnce atomic.Int64
}

// trial kills a child at point on req's key, finishes the key the way rec says, and
// checks that every later attempt replays the stored answer.
func (m *crashRig) trial(t *testing.T, point, rec string, req workflow.Request) {
	t.Helper()
	ctx, env, key := context.Background(), m.env, req.Key
	cfg := childConfig{Mode: "do", Point: point, Action: "kill", Requests: []workflow.Request{req}}
	if rec == "sweeper-crash" {
		// Leave the key released at its first durable recovery point,
		// then kill a sweeper process at the point.
		env.provider.FailNext(1)
		_, err := env.do(ctx, m.en, req)
		require.ErrorIs(t, err, workflow.ErrTransient, key)
		require.Zero(t, env.provider.Armed())
		env.expireLease(t, "acct", key)
		cfg = childConfig{Mode: "sweep", Point: point, Action: "kill"}
	}
	c := env.startChild(t, cfg)
	killed, lines := c.killed(t)
	require.True(t, killed, "%s: the child was not killed at %s: %+v", key, point, lines)
	require.True(t, slices.ContainsFunc(lines, func(l childLine) bool { return l.Event == "fired" && l.Point == point }),
		"%s: the child did not report reaching %s: %+v", key, point, lines)
	m.crashes.Add(1)
	env.recordChildAnswers("acct", lines)

	st := env.state(t, "acct", key)
	if !st.Exists {
		m.finishWithoutRow(t, rec, req)
		return
	}
	switch rec {
	case "retry":
		m.finishByRetry(t, st, req)
	case "sweeper", "sweeper-crash":
		m.finishBySweeper(t, rec, st, key)
	}
	// Every later attempt replays the stored answer.
	res, err := env.do(ctx, m.en, req)
	require.NoError(t, err, key)
	require.True(t, res.Replayed, key)
}

// finishWithoutRow: killed before the key row's insert committed, nothing of the key
// is left, and its claim lock died with the child's connection, so once the server
// has ended the dead child's backend one attempt claims the key at once and finishes
// it.
func (m *crashRig) finishWithoutRow(t *testing.T, rec string, req workflow.Request) {
	t.Helper()
	ctx, env, key := context.Background(), m.env, req.Key
	require.Zero(t, env.effects(t, m.flow, "acct", key), "%s: an effect without a key row", key)
	env.waitSessionsGone(t, env.childApp())
	require.Empty(t, env.claimLockHolders(t, env.childApp()), key)
	if rec == "sweeper" {
		stats, err := m.sw.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, stats.Taken, "%s: no row, nothing to sweep: %+v", key, stats)
	}
	a, err := env.do(ctx, m.en, req)
	require.NoError(t, err, "%s: the retry did not claim the key at once", key)
	require.Contains(t, []int{201, 402}, a.Response.Status, "%s: %+v", key, a)
	require.False(t, a.Replayed, key)
	m.claimedAtOnce.Add(1)
	res, err := env.do(ctx, m.en, req)
	require.NoError(t, err, key)
	require.True(t, res.Replayed, key)
}

// finishByRetry: the dead process's lease holds the key until it runs out; then the
// client's retry finishes it.
func (m *crashRig) finishByRetry(t *testing.T, st keyState, req workflow.Request) {
	t.Helper()
	ctx, env, key := context.Background(), m.env, req.Key
	if st.Exists && st.Status == "in_progress" {
		_, err := env.do(ctx, m.en, req)
		require.ErrorIs(t, err, workflow.ErrInProgress, "%s: the dead process's lease is still live", key)
	}
	env.expireLease(t, "acct", key)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	a, err := env.retryUntilFinal(rctx, m.en, req, 20*time.Second)
	cancel()
	require.NoError(t, err)
	require.Contains(t, []int{201, 402}, a.Status, "%s: %+v", key, a)
	m.byRetry.Add(1)
}

// finishBySweeper: once the lease ran out, one sweep finishes an unfinished key, and
// takes nothing when the crash came after the finish.
func (m *crashRig) finishBySweeper(t *testing.T, rec string, st keyState, key string) {
	t.Helper()
	m.env.expireLease(t, "acct", key)
	stats, err := m.sw.RunOnce(context.Background())
	require.NoError(t, err)
	if st.Exists && st.Status == "in_progress" {
		require.Equal(t, 1, stats.Finished, "%s: %+v", key, stats)
		if rec == "sweeper" {
			m.bySweeper.Add(1)
		} else {
			m.bySweeperAfterCrash.Add(1)
		}
	} else {
		// Nothing to sweep: the crash came after the finish.
		require.Zero(t, stats.Taken, "%s: %+v", key, stats)
	}
}
