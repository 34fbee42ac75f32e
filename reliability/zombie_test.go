package reliability

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// zombieCase pauses a server (mode do) or a sweeper (mode sweep) process with SIGSTOP
// at a point, lets its lease run out (by the database clock), has another executor
// take the key over, then lets the paused process go on.
type zombieCase struct {
	flow, mode, point string
	// cutIdle has the server end the transaction the paused zombie left open (the
	// test terminates its session idle in transaction, as
	// idle_in_transaction_session_timeout or an operator would), so that the new owner
	// finishes while the zombie is still paused. Without it, a zombie paused inside a
	// transaction holds its row locks: the new owner takes the key over, waits on them,
	// and finishes only after the zombie resumes and its commit is fenced off. The cut
	// comes once the zombie is paused, not from a timeout set beforehand: a short
	// idle_in_transaction_session_timeout on its connections also ended transactions
	// of a zombie that a busy machine slowed down before it reached its point.
	cutIdle bool
}

var zombieCases = []zombieCase{
	{chargeflow.FlowName, "do", "provider_charge/before-call", false},
	{chargeflow.FlowName, "do", "create_charge/before-commit", true}, // holds the claim lock; the key row is not written yet
	{chargeflow.FlowName, "do", "finalize/before-commit", true},
	{chargeflow.FlowName, "do", "finalize/before-commit", false},
	{twoCallFlow, "do", "capture/after-call", false},
	{twoCallFlow, "do", "settle/before-commit", false},
	{chargeflow.FlowName, "sweep", "provider_charge/after-call", false},
	{chargeflow.FlowName, "sweep", "finalize/before-commit", false},
	{twoCallFlow, "sweep", "capture/before-call", false},
	{twoCallFlow, "sweep", "reserve/before-commit", true},
}

// foldedZombieCases are TestZombies' cases for the charges flow on an engine with
// Config.ClaimWithFirstStatement (flowShape.FoldedClaim). At create_charge/after-claim
// the zombie is paused right after the round trip that carried BEGIN, the folded claim
// and the phase's first statement: it holds the claim lock, the statement ran, nothing
// is committed. At create_charge/before-commit the phase's function has also returned;
// the key row's insert and COMMIT are not sent. Either way its session is cut (cutIdle)
// so that a retry can claim the key, and the resumed zombie, on a dead connection,
// runs none of its later statements and commits nothing.
var foldedZombieCases = []zombieCase{
	{chargeflow.FlowName, "do", "create_charge/after-claim", true},
	{chargeflow.FlowName, "do", "create_charge/before-commit", true},
}

// TestZombies: a paused process whose lease was taken over changes nothing when it
// resumes: its commits are fenced off by the lock version. Backs invariant 2 (one
// executor) and 1 (one effect).
func TestZombies(t *testing.T) {
	t.Parallel()
	pipelined, folded := flowShape{Pipelined: true}, flowShape{FoldedClaim: true}
	for _, c := range []struct {
		flow  string
		shape flowShape
	}{{chargeflow.FlowName, flowShape{}}, {twoCallFlow, flowShape{}}, {chargeflow.FlowName, pipelined}, {twoCallFlow, pipelined},
		{chargeflow.FlowName, folded}} {
		flow, name, zombieCases := c.flow, c.shape.prefix()+c.flow, zombieCases
		switch {
		case c.shape.Pipelined:
			zombieCases = pipelinedZombieCases // pipelined_test.go
		case c.shape.FoldedClaim:
			zombieCases = foldedZombieCases
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			z := newZombieRig(t, c.shape)
			var keys [][2]string
			amount := int64(200)
			for _, zc := range zombieCases {
				if zc.flow != flow {
					continue
				}
				for trial := range scale(1, 3, 8) {
					amount++
					if amount%7 == 0 {
						amount++ // keep to paid charges: the zombie must reach every point
					}
					key := fmt.Sprintf("zombie|%s|%s|%v|%d", zc.mode, zc.point, zc.cutIdle, trial)
					keys = append(keys, [2]string{"acct", key})
					z.trial(t, zc, request("acct", key, flow, amount))
				}
			}
			r := z.env.check(t, checkOpts{keys: keys})
			require.Equal(t, len(keys), z.fired)
			t.Logf("zombies %s: trials=%d paused=%d fenced_off=%d keys=%d duplicates=%d unfinished=%d",
				name, len(keys), z.fired, z.fenced, r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
		})
	}
}

// zombieRig is one TestZombies subtest's engine and sweeper, with the signal its key
// hook sends when another executor takes a key over (or sweeps it), and the counts
// of zombies paused and fenced off.
type zombieRig struct {
	env           *env
	en            *workflow.Engine
	sw            *sweeperOn
	pipelined     bool
	mu            sync.Mutex
	takenOver     map[string]chan struct{}
	fired, fenced int
}

func newZombieRig(t *testing.T, shape flowShape) *zombieRig {
	t.Helper()
	z := &zombieRig{env: newEnv(t, pgtest.New(t)), pipelined: shape.Pipelined, takenOver: map[string]chan struct{}{}}
	z.env.shape = shape
	z.en = z.env.engine(z.env.pool(poolOpts{}), &workflow.Config{Hooks: workflow.Hooks{
		Key: func(ctx context.Context, ev workflow.KeyEvent) {
			if ev.Kind == workflow.OutcomeTakenOver || ev.Kind == workflow.OutcomeSwept {
				z.signal(ev.Key)
			}
		},
	}})
	z.sw = z.env.sweeper(z.en, nil)
	return z
}

// watch returns the channel closed when key is taken over.
func (z *zombieRig) watch(key string) chan struct{} {
	ch := make(chan struct{})
	z.mu.Lock()
	z.takenOver[key] = ch
	z.mu.Unlock()
	return ch
}

func (z *zombieRig) signal(key string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if ch := z.takenOver[key]; ch != nil {
		close(ch)
		delete(z.takenOver, key)
	}
}

// zombieResult is what the new owner of a key got.
type zombieResult struct {
	a   answer
	err error
}

// trial pauses a zombie at zc's point on req's key, has another executor take the
// key over, resumes the zombie and checks that it changed nothing.
func (z *zombieRig) trial(t *testing.T, zc zombieCase, req workflow.Request) {
	t.Helper()
	ctx, env, key := context.Background(), z.env, req.Key
	cfg := childConfig{Mode: "do", Point: zc.point, Action: "stop", Requests: []workflow.Request{req}}
	if zc.mode == "sweep" {
		env.provider.FailNext(1) // released at its first durable recovery point
		_, err := env.do(ctx, z.en, req)
		require.ErrorIs(t, err, workflow.ErrTransient, key)
		env.expireLease(t, "acct", key)
		cfg = childConfig{Mode: "sweep", Point: zc.point, Action: "stop"}
	}
	zombie := env.startChild(t, cfg)
	zombie.paused(t)
	if zc.cutIdle {
		require.Positive(t, env.endPausedTransaction(t, env.childApp()), "%s: the paused zombie has a transaction open", key)
	}
	z.fired++
	zst := env.state(t, "acct", key)
	madeBefore := env.provider.Made()

	// The zombie's lease runs out by the database clock; another executor
	// takes the key over.
	ch := z.watch(key)
	env.expireLease(t, "acct", key)
	done := make(chan zombieResult, 1)
	go func() { done <- z.takeOver(ctx, t, zc.mode == "sweep" && zst.Exists, req) }()
	zombieWaits := !z.pipelined && !zc.cutIdle && (zc.point == "finalize/before-commit" || zc.point == "settle/before-commit" || zc.point == "reserve/before-commit")
	if zombieWaits {
		z.resumeWhileOwnerWaits(t, key, zombie, ch, done)
	} else {
		z.resumeAfterOwner(t, key, zombie, zc.mode == "do" || !zst.Exists, done)
	}
	z.fenced++
	require.LessOrEqual(t, env.provider.Made()-madeBefore, len(flowCalls[req.Flow]), key)
	replay, err := env.do(ctx, z.en, req)
	require.NoError(t, err, key)
	require.True(t, replay.Replayed, key)
}

// takeOver is the new owner: the sweeper (sweep, until it finishes a key) or a
// client retrying req until it gets a final answer.
func (z *zombieRig) takeOver(ctx context.Context, t *testing.T, sweep bool, req workflow.Request) zombieResult {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if sweep {
		for rctx.Err() == nil {
			st, err := z.sw.RunOnce(rctx)
			if err != nil || st.Finished > 0 {
				return zombieResult{err: err}
			}
			z.env.expireLease(t, "acct", req.Key)
		}
		return zombieResult{err: rctx.Err()}
	}
	a, err := z.env.retryUntilFinal(rctx, z.en, req, 10*time.Second)
	return zombieResult{a, err}
}

// resumeWhileOwnerWaits: the new owner took the key over and waits on the zombie's
// locks: let the zombie go on now. Its commit must be fenced off.
func (z *zombieRig) resumeWhileOwnerWaits(t *testing.T, key string, zombie *child, ch chan struct{}, done chan zombieResult) {
	t.Helper()
	select {
	case <-ch:
	case res := <-done:
		t.Fatalf("%s: finished while the zombie held its locks: %+v\n%s", key, res, auditTrail(t, z.env, key))
	}
	lines := zombie.resume(t)
	z.env.recordChildAnswers("acct", lines)
	res := <-done
	require.NoError(t, res.err, key)
	requireZombieLost(t, key, lines)
}

// resumeAfterOwner: the new owner finished (with a final answer, when wantAnswer);
// the zombie, resumed, changes neither the key row, nor the key table, nor the
// provider's payments.
func (z *zombieRig) resumeAfterOwner(t *testing.T, key string, zombie *child, wantAnswer bool, done chan zombieResult) {
	t.Helper()
	env := z.env
	res := <-done
	if res.err != nil {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", zombie.Pid()))
		t.Fatalf("%s: %v\nzombie: %s\n%s\n%s", key, res.err, stat, auditTrail(t, env, key), sessions(t, env))
	}
	if wantAnswer {
		require.Contains(t, []int{201, 402}, res.a.Status, "%s: %+v\n%s", key, res.a, auditTrail(t, env, key))
	}
	before := env.rowSnapshot(t, "acct", key)
	audit := auditCount(t, env)
	made := env.provider.Made()
	lines := zombie.resume(t)
	env.recordChildAnswers("acct", lines)
	requireZombieLost(t, key, lines)
	require.Equal(t, before, env.rowSnapshot(t, "acct", key), "%s: the zombie changed the key row", key)
	require.Equal(t, audit, auditCount(t, env), "%s: the zombie wrote to the key table", key)
	require.Equal(t, made, env.provider.Made(), "%s: the zombie made a payment", key)
}

// requireZombieLost checks what a resumed zombie reported: a retryable answer (the
// lease was lost, or its connection was cut), or a sweep that finished nothing; and
// that it ran none of the flows' statements once resumed (a zombie paused in a call
// phase reaches its next tx phase, whose fence check refuses it first).
func requireZombieLost(t *testing.T, key string, lines []childLine) {
	t.Helper()
	done := false
	for _, l := range lines {
		switch l.Event {
		case "done":
			done = true
			require.Zero(t, l.Ran, "%s: the resumed zombie ran statements of the flow", key)
		case "answer":
			require.True(t, l.Answer.Retryable || l.Answer.Replayed, "%s: the zombie got %+v", key, l.Answer)
		case "stats":
			require.Zero(t, l.Stats.Finished, "%s: the zombie sweeper finished a key: %+v", key, l.Stats)
			require.Positive(t, l.Stats.LeaseLost+l.Stats.Released, "%s: %+v", key, l.Stats)
		}
	}
	require.True(t, done, "%s: the zombie reported no end", key)
}

func auditCount(t *testing.T, env *env) int64 {
	t.Helper()
	var n int64
	require.NoError(t, env.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM rel_audit`).Scan(&n))
	return n
}

// auditTrail is a key's audit rows, for failure messages.
func auditTrail(t *testing.T, env *env, key string) string {
	t.Helper()
	rows, err := env.db.Pool.Query(context.Background(), `SELECT format('%s %s lv %s->%s rp %s->%s %s->%s at %s', seq, op,
		old_lv, new_lv, old_rp, new_rp, old_status, new_status, at) FROM rel_audit WHERE idem_key = $1 ORDER BY seq`, key)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// sessions lists the experiment's database sessions, for failure messages.
func sessions(t *testing.T, env *env) string {
	t.Helper()
	rows, err := env.db.Pool.Query(context.Background(), `SELECT format('pid %s %s state=%s wait=%s/%s xact_age=%s blocked_by=%s query=%s',
		pid, application_name, state, wait_event_type, wait_event, clock_timestamp() - xact_start, pg_blocking_pids(pid), left(query, 100))
		FROM pg_stat_activity WHERE application_name LIKE $1 || '%' ORDER BY pid`, env.appName)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// endIdleTransactions terminates the sessions named app that are idle in a
// transaction, and returns how many it terminated.
func (e *env) endIdleTransactions(t testing.TB, app string) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, app).Scan(&n))
	return n
}

// endPausedTransaction is endIdleTransactions for a child paused with a transaction
// open. A child paused while the server still ran the rest of its round trip (the
// statement after a folded claim, whose result it had not read) is in that transaction
// but not idle yet: it is polled until the server finished (bounded; it returns 0 if
// no transaction of app is open).
func (e *env) endPausedTransaction(t testing.TB, app string) int {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond) // the next look at the server's view; no hook exists for it
	defer tick.Stop()
	for {
		var active bool
		require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'active' AND xact_start IS NOT NULL)`, app).Scan(&active))
		if !active {
			return e.endIdleTransactions(t, app)
		}
		select {
		case <-deadline.C:
			return e.endIdleTransactions(t, app)
		case <-tick.C:
		}
	}
}
