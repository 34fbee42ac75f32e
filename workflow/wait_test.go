package workflow_test

import (
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// keyStatements counts, per idempotency key, the statements a pool sends that name
// the key among their arguments (every statement of the engine on one key does), and
// all statements and round trips besides.
type keyStatements struct {
	mu     sync.Mutex
	byKey  map[string]int
	all    atomic.Int64
	trips  atomic.Int64
	filter string // only statements with this scope among their arguments
}

func (s *keyStatements) count(args []any) {
	s.all.Add(1)
	if !slices.Contains(args, any(s.filter)) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range args {
		if k, ok := a.(string); ok && k != s.filter {
			s.byKey[k]++
			return
		}
	}
}

func (s *keyStatements) of(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[key]
}

func (s *keyStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.trips.Add(1)
	s.count(d.Args)
	return ctx
}
func (s *keyStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *keyStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.trips.Add(1)
	return ctx
}
func (s *keyStatements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.count(d.Args)
}
func (s *keyStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// waitKit is an engine whose statements are counted, and what its waiters and
// watches tell.
type waitKit struct {
	e       *workflow.Engine
	stmts   *keyStatements
	waiting chan string // a key, each time an attempt starts to wait on it
	steps   sync.Map    // watch step → *atomic.Int64
}

// waitEngine returns an engine of b's schema on a pool of its own, counting its
// statements on scope "acct".
func waitEngine(t *testing.T, b *bundle, cfg *workflow.Config, before func(context.Context, phases.DBTX, *phases.Run) error, floor time.Duration) *waitKit {
	t.Helper()
	pc, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	k := &waitKit{stmts: &keyStatements{byKey: map[string]int{}, filter: "acct"}, waiting: make(chan string, 100)}
	pc.ConnConfig.Tracer = k.stmts
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c := workflow.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Hooks = workflow.JoinHooks(c.Hooks, workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
		if ev.Kind == workflow.OutcomeWaiting {
			k.waiting <- ev.Key
		}
	}})
	k.e = testflow.Engine(t, pool, &c, b.provider, before)
	// The engine's one read of the catalog as it starts is not a waiter's statement.
	require.NoError(t, workflow.StartUp(context.Background(), k.e))
	k.stmts.all.Store(0)
	k.stmts.trips.Store(0)
	if floor > 0 {
		workflow.SetPollFloor(k.e, floor)
	}
	workflow.ObserveWaits(k.e, func(step string) {
		v, _ := k.steps.LoadOrStore(step, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	})
	return k
}

func (k *waitKit) step(name string) int64 {
	v, ok := k.steps.Load(name)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

type outcome struct {
	res *workflow.Result
	err error
}

// start runs n attempts on key with wait, each in a goroutine, and waits until each
// of them waits.
func (k *waitKit) start(t *testing.T, key string, wait time.Duration, n int) chan outcome {
	t.Helper()
	out := make(chan outcome, n)
	for range n {
		go func() {
			r := chargeReq("acct", key, `{"amount":700}`)
			r.Wait = wait
			res, err := k.e.Do(context.Background(), r)
			out <- outcome{res, err}
		}()
	}
	for range n {
		select {
		case got := <-k.waiting:
			require.Equal(t, key, got)
		case o := <-out:
			t.Fatalf("an attempt answered without waiting: %+v %v", o.res, o.err)
		}
	}
	return out
}

// holdKey starts an attempt on key through e, paused in its call phase by h.
func holdKey(t *testing.T, e *workflow.Engine, h *testflow.Holder, key string) chan outcome {
	t.Helper()
	out := make(chan outcome, 1)
	go func() {
		res, err := e.Do(context.Background(), chargeReq("acct", key, `{"amount":700}`))
		out <- outcome{res, err}
	}()
	select {
	case <-h.Entered:
	case o := <-out:
		t.Fatalf("the owner ended before its call phase: %v", o.err)
	}
	return out
}

// requireReplays checks that n waiters got the owner's answer, replayed.
func requireReplays(t *testing.T, owner outcome, waiters chan outcome, n int) {
	t.Helper()
	require.NoError(t, owner.err)
	for range n {
		w := <-waiters
		require.NoError(t, w.err)
		require.True(t, w.res.Replayed)
		require.Equal(t, owner.res.Response.Status, w.res.Response.Status)
		require.Equal(t, owner.res.Response.Body, w.res.Response.Body)
	}
}

// TestWaitSameProcessOwner: attempts that find their key run by an attempt of the
// same engine wait for it without sending a statement, are woken by its end, share one
// look-up, and replay its answer.
func TestWaitSameProcessOwner(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("same")
	k := waitEngine(t, b, nil, h.Before, 0)
	owner := holdKey(t, k.e, h, "same")
	before := k.stmts.of("same")

	const n = 5
	waiters := k.start(t, "same", time.Minute, n)
	require.Equal(t, before, k.stmts.of("same"), "statements sent by waiters whose owner runs in their engine")
	require.Zero(t, k.step("poll"), "look-ups while the owner runs here")

	h.Let()
	requireReplays(t, <-owner, waiters, n)
	require.EqualValues(t, 1, k.step("watch"), "watches for one key")
	require.EqualValues(t, 1, k.step("poll"), "look-ups: one, after the owner ended, shared by the waiters")
	testflow.RequireOneEffect(t, b.db.Pool, b.provider, "acct", "same")
	t.Logf("statements per waiter, owner in the same engine: %.2f (%d waiters, %d look-up)", float64(k.step("poll"))/n, n, k.step("poll"))
}

// TestWaitOtherProcessOwner: the owner runs in another engine on another pool (the
// database the only shared state). The waiters' engine polls for them all with one
// watch, and they replay the owner's answer.
func TestWaitOtherProcessOwner(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("remote")
	ownerEngine := b.newEngine(t, setupOpts{before: h.Before})
	k := waitEngine(t, b, nil, nil, 10*time.Millisecond)
	owner := holdKey(t, ownerEngine, h, "remote")

	const n = 8
	waiters := k.start(t, "remote", time.Minute, n)
	h.Let()
	requireReplays(t, <-owner, waiters, n)
	require.EqualValues(t, 1, k.step("watch"), "one watch for the key however many wait")
	polls := k.step("poll")
	require.Positive(t, polls)
	require.EqualValues(t, n+polls, k.stmts.of("remote"), "statements: each waiter's own look-up, and the watch's polls")
	testflow.RequireOneEffect(t, b.db.Pool, b.provider, "acct", "remote")
	t.Logf("statements per waiter, owner in another engine: %.2f (%d waiters, %d polls)", float64(n+polls)/n, n, polls)
}

// TestWaitOwnerReleases: the owner fails transiently while others wait; one waiter
// takes the key over and resumes it, the rest replay its answer; one effect.
func TestWaitOwnerReleases(t *testing.T) {
	t.Parallel()
	for _, here := range []bool{true, false} {
		name := map[bool]string{true: "SameEngine", false: "OtherEngine"}[here]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			entered, release := make(chan struct{}), make(chan struct{})
			var once atomic.Bool
			fail := func(_ context.Context, tx phases.DBTX, run *phases.Run) error {
				if tx == nil && once.CompareAndSwap(false, true) {
					close(entered)
					<-release
					return testflow.ErrInjected
				}
				return nil
			}
			k := waitEngine(t, b, nil, fail, 10*time.Millisecond)
			ownerEngine := k.e
			if !here {
				ownerEngine = b.newEngine(t, setupOpts{before: fail})
			}
			owner := make(chan error, 1)
			go func() {
				_, err := ownerEngine.Do(context.Background(), chargeReq("acct", "rel", `{"amount":700}`))
				owner <- err
			}()
			<-entered
			const n = 3
			waiters := k.start(t, "rel", time.Minute, n)
			close(release)
			require.ErrorIs(t, <-owner, workflow.ErrTransient)
			var ran, replayed int
			var body []byte
			for range n {
				w := <-waiters
				require.NoError(t, w.err)
				require.Equal(t, 201, w.res.Response.Status)
				if w.res.Replayed {
					replayed++
				} else {
					ran++
				}
				if body != nil {
					require.Equal(t, body, w.res.Response.Body)
				}
				body = w.res.Response.Body
			}
			require.Equal(t, 1, ran, "one waiter resumed the key")
			require.Equal(t, n-1, replayed)
			testflow.RequireOneEffect(t, b.db.Pool, b.provider, "acct", "rel")
		})
	}
}

// TestWaitBoundPasses: an owner that does not finish within the bound leaves its
// waiter with the answer it gets without a wait, in progress with a Retry-After.
func TestWaitBoundPasses(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("slow")
	k := waitEngine(t, b, nil, h.Before, 0)
	owner := holdKey(t, k.e, h, "slow")
	r := chargeReq("acct", "slow", `{"amount":700}`)
	r.Wait = 50 * time.Millisecond
	_, err := k.e.Do(context.Background(), r)
	var ip *workflow.InProgressError
	require.ErrorAs(t, err, &ip)
	require.GreaterOrEqual(t, ip.RetryAfter, time.Second)
	require.Len(t, k.waiting, 1, "the attempt waited before it answered")
	h.Let()
	require.NoError(t, (<-owner).err)
}

// TestWaitCap: beyond Config.MaxWaiters an attempt answers in progress at once, while
// the waiters within the cap go on waiting.
func TestWaitCap(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("capped")
	k := waitEngine(t, b, &workflow.Config{MaxWaiters: 1}, h.Before, 0)
	owner := holdKey(t, k.e, h, "capped")
	first := k.start(t, "capped", time.Minute, 1)

	r := chargeReq("acct", "capped", `{"amount":700}`)
	r.Wait = time.Minute
	_, err := k.e.Do(context.Background(), r)
	require.ErrorIs(t, err, workflow.ErrInProgress, "the attempt beyond the cap")
	require.Empty(t, k.waiting, "the attempt beyond the cap did not wait")
	select {
	case o := <-first:
		t.Fatalf("the waiter within the cap answered before its owner: %v", o.err)
	default:
	}
	h.Let()
	requireReplays(t, <-owner, first, 1)

	none := waitEngine(t, b, &workflow.Config{MaxWaiters: -1}, nil, 0)
	require.Equal(t, -1, none.e.Config().MaxWaiters)
	_, err = workflow.New(b.db.Pool, &workflow.Config{MaxWaiters: -2})
	require.ErrorContains(t, err, "MaxWaiters")
	r.Wait = -time.Second
	_, err = k.e.Do(context.Background(), r)
	require.ErrorIs(t, err, workflow.ErrInvalidRequest)
}

// TestWaitStatementsPerWaiter measures what waiting costs a waiter whose owner runs
// in another engine and does not finish within a 5 s bound (the worst case: every poll
// of the bound is sent), for one waiter alone and for eight on one key. It takes the
// five seconds of the bound.
func TestWaitStatementsPerWaiter(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a 5s bound")
	}
	t.Parallel()
	b := setup(t, setupOpts{})
	hs := map[string]*testflow.Holder{"solo": testflow.NewHolder("solo"), "crowd": testflow.NewHolder("crowd")}
	ownerEngine := b.newEngine(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		return hs[run.Key()].Before(ctx, tx, run)
	}})
	k := waitEngine(t, b, nil, nil, 0)
	counts := map[string]int{"solo": 1, "crowd": 8}
	outs := map[string]chan outcome{}
	owners := map[string]chan outcome{}
	for key, n := range counts {
		owners[key] = holdKey(t, ownerEngine, hs[key], key)
		outs[key] = k.start(t, key, 5*time.Second, n)
	}

	// A key still being claimed: its owner is in its first transaction, so the waiter
	// also sends a claim (in one round trip) before it waits, and its polls find no
	// row. A waiter engine of its own counts every statement, BEGIN and ROLLBACK too.
	claimed, holdClaim := make(chan struct{}), make(chan struct{})
	var letClaim sync.Once
	t.Cleanup(func() { letClaim.Do(func() { close(holdClaim) }) }) // before the schema is dropped
	claimer := b.newEngine(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{ClaimHeld: func(context.Context, workflow.PhaseEvent) {
		close(claimed)
		<-holdClaim
	}}}})
	claimerDone := make(chan error, 1)
	go func() {
		_, err := claimer.Do(context.Background(), chargeReq("acct", "claiming", `{"amount":700}`))
		claimerDone <- err
	}()
	<-claimed
	kc := waitEngine(t, b, nil, nil, 0)
	claiming := kc.start(t, "claiming", 5*time.Second, 1)

	for key, n := range counts {
		for range n {
			require.ErrorIs(t, (<-outs[key]).err, workflow.ErrInProgress)
		}
		per := float64(k.stmts.of(key)) / float64(n)
		t.Logf("5s bound, owner elsewhere, %d waiter(s) on %q: %d statements, %.2f per waiter", n, key, k.stmts.of(key), per)
		require.LessOrEqual(t, per, 8.0, "statements per waiter for a 5s bound")
		hs[key].Let()
		require.NoError(t, (<-owners[key]).err)
	}
	require.ErrorIs(t, (<-claiming).err, workflow.ErrInProgress)
	t.Logf("5s bound, key being claimed elsewhere, 1 waiter: %d statements in %d round trips", kc.stmts.all.Load(), kc.stmts.trips.Load())
	require.LessOrEqual(t, kc.stmts.all.Load(), int64(8), "statements of a waiter on a key being claimed, 5s bound")
	letClaim.Do(func() { close(holdClaim) })
	require.NoError(t, <-claimerDone)
}

// The child program of TestWaitOwnerKilled: it runs one charge and, in its call
// phase, prints a line and blocks until it is killed.
const (
	envWaitDB       = "IDEMFLOW_WAIT_DB_URL"
	envWaitProvider = "IDEMFLOW_WAIT_PROVIDER_URL"
)

func init() {
	childproc.Register("waitowner", func() {
		ctx := context.Background()
		err := testflow.RunChild(ctx, os.Getenv(envWaitDB), os.Getenv(envWaitProvider), func(_ context.Context, tx phases.DBTX, _ *phases.Run) error {
			if tx == nil {
				childproc.Emit(map[string]string{"event": "in-call"})
				select {} // until killed
			}
			return nil
		}, chargeReq("acct", "killed", `{"amount":700}`))
		childproc.Fail("the owner was not killed; Do returned", err)
	})
}

// TestWaitOwnerKilled: the owner is a real process, SIGKILLed mid-flow while an
// attempt in this process waits on its key. Once its lease ends (moved by the database
// clock), the waiter's poll finds it expired, and the waiter takes the key over and
// finishes it: one effect.
func TestWaitOwnerKilled(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	child := childproc.Start(t, "^$", childproc.Program("waitowner"), envWaitDB+"="+b.db.URL, envWaitProvider+"="+b.provider.URL)
	var line map[string]string
	child.Next(t, 2*time.Minute, &line)
	require.Equal(t, "in-call", line["event"])

	k := waitEngine(t, b, nil, nil, 10*time.Millisecond)
	waiter := k.start(t, "killed", time.Minute, 1)
	child.Kill(t) // SIGKILL
	killed, _ := child.Killed(t)
	require.True(t, killed)
	expireLease(t, b.db, "acct", "killed")

	w := <-waiter
	require.NoError(t, w.err)
	require.False(t, w.res.Replayed, "the waiter resumed the key")
	require.Equal(t, 201, w.res.Response.Status)
	testflow.RequireOneEffect(t, b.db.Pool, b.provider, "acct", "killed")
}
