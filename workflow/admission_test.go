package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// gate holds phases of a test's attempts: entered reports the key of an attempt that
// reached the phase, and the attempt goes on when the test sends on its release.
type gate struct {
	phase   string
	entered chan string
	release chan struct{}
	once    sync.Once
}

func newGate(phase string) *gate {
	return &gate{phase: phase, entered: make(chan string, 16), release: make(chan struct{})}
}

// open lets every held attempt go on.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// openAtEnd opens g when the test ends, before the pool is closed (call it after
// setup), so that a failing test does not hang on its held attempts.
func (g *gate) openAtEnd(t *testing.T) { t.Cleanup(g.open) }

// before is a testflow Before that holds every attempt at g.phase until released,
// ignoring its context (a phase that does not honour cancellation).
func (g *gate) before(_ context.Context, _ phases.DBTX, run *phases.Run) error {
	if run.Phase() == g.phase {
		g.entered <- run.Key()
		<-g.release
	}
	return nil
}

func shedWith(t *testing.T, err error, why error) {
	t.Helper()
	var se *workflow.ShedError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, why)
	require.Positive(t, se.RetryAfter)
}

// A client that gives up before the claim commits leaves nothing behind: the first tx
// phase's transaction is rolled back, no key row, no effect.
func TestCancelBeforeClaimWritesNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	b := setup(t, setupOpts{before: func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Reserve {
			cancel() // the client goes away while the first tx phase runs
		}
		return nil
	}})
	_, err := b.engine.Do(ctx, chargeReq("acct", "k1", `{"amount":5}`))
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 0, countKeys(t, b.db))
	require.Equal(t, testflow.Effects{}, effects(t, b.db, "acct", "k1"))
	require.Equal(t, 0, b.provider.Made())
}

// After the claim the attempt is detached from its caller: a client that goes away
// during the call phase does not stop it, and its answer is stored for the retry.
func TestCancelAfterClaimRunsOn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	b := setup(t, setupOpts{before: func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			cancel()
		}
		return nil
	}})
	res, err := b.engine.Do(ctx, chargeReq("acct", "k1", `{"amount":5}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k1")
	require.Equal(t, "finished", state(t, b.db, "acct", "k1").Status)
}

// Over MaxInFlight an attempt waits at most AdmitWait and is then turned away, having
// written nothing.
func TestMaxInFlightSheds(t *testing.T) {
	t.Parallel()
	g := newGate(testflow.Reserve)
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: 20 * time.Millisecond}, before: g.before})
	g.openAtEnd(t)
	done := make(chan error, 1)
	go func() {
		for {
			_, err := b.engine.Do(context.Background(), chargeReq("acct", "held", `{"amount":5}`))
			if !errors.As(err, new(*workflow.ShedError)) { // the pool was slow to connect
				done <- err
				return
			}
		}
	}()
	require.Equal(t, "held", <-g.entered)
	_, err := b.engine.Do(context.Background(), chargeReq("acct", "k2", `{"amount":5}`))
	shedWith(t, err, workflow.ErrOverloaded)
	g.open()
	require.NoError(t, <-done)
	require.Equal(t, 1, countKeys(t, b.db), "the refused attempt wrote a key")
	require.Equal(t, testflow.Effects{}, effects(t, b.db, "acct", "k2"))
}

// Waiters for a place are served newest first once the engine is overloaded (more
// waiters than places, waiting without a break; here from the first waiter on).
func TestAdmitNewestFirst(t *testing.T) {
	t.Parallel()
	g := newGate(testflow.Reserve)
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: -1}, before: g.before})
	g.openAtEnd(t)
	workflow.SetOverloadAfter(b.engine, 0)
	done := make(chan error, 3)
	run := func(key string) {
		_, err := b.engine.Do(context.Background(), chargeReq("acct", key, `{"amount":5}`))
		done <- err
	}
	go run("first")
	require.Equal(t, "first", <-g.entered)
	for i, key := range []string{"older", "newer"} {
		go run(key)
		for workflow.Waiting(b.engine) != i+1 {
			runtimeGosched()
		}
	}
	g.release <- struct{}{} // first ends; its place goes to the newest waiter
	require.Equal(t, "newer", <-g.entered)
	g.release <- struct{}{}
	require.Equal(t, "older", <-g.entered)
	g.release <- struct{}{}
	for range 3 {
		require.NoError(t, <-done)
	}
}

// Before the claim, the wait for a pool connection is bounded: with every connection
// held, the attempt is turned away, having written nothing.
func TestAdmitWaitBoundsConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := b.newEngine(t, setupOpts{pool: pool, cfg: &workflow.Config{AdmitWait: 20 * time.Millisecond}})
	held, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	_, err = e.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	shedWith(t, err, workflow.ErrOverloaded)
	held.Release()
	require.Equal(t, 0, countKeys(t, b.db))
	res, err := b.engine.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
}

func TestAdmissionConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []workflow.Config{{MaxInFlight: -2}, {AdmitWait: -2}} {
		_, err := workflow.New(&pgxpool.Pool{}, &c)
		require.Error(t, err, fmt.Sprintf("%+v", c))
	}
	c := (&workflow.Config{}).WithDefaults()
	require.Equal(t, workflow.AdmitWaitDefault, c.AdmitWait)
	require.Equal(t, 0, c.MaxInFlight)
	require.Equal(t, c, c.WithDefaults())
	require.True(t, errors.Is(&workflow.ShedError{Err: workflow.ErrDraining}, workflow.ErrDraining))
}

func runtimeGosched() { runtime.Gosched() }

// While the engine is only busy (not overloaded), waiters are served oldest first, so
// that none starves under a steady closed loop.
func TestAdmitOldestFirstWhenBusy(t *testing.T) {
	t.Parallel()
	g := newGate(testflow.Reserve)
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: -1}, before: g.before})
	g.openAtEnd(t)
	workflow.SetOverloadAfter(b.engine, time.Hour)
	done := make(chan error, 3)
	run := func(key string) {
		_, err := b.engine.Do(context.Background(), chargeReq("acct", key, `{"amount":5}`))
		done <- err
	}
	go run("first")
	require.Equal(t, "first", <-g.entered)
	for i, key := range []string{"older", "newer"} {
		go run(key)
		for workflow.Waiting(b.engine) != i+1 {
			runtimeGosched()
		}
	}
	g.release <- struct{}{}
	require.Equal(t, "older", <-g.entered)
	g.release <- struct{}{}
	require.Equal(t, "newer", <-g.entered)
	g.release <- struct{}{}
	for range 3 {
		require.NoError(t, <-done)
	}
}

// A new attempt is turned away at once, before it waits, when the queue for a place
// is hopeless: the last waiters waited over a quarter of AdmitWait.
func TestAdmitRefusesHopelessQueueAtOnce(t *testing.T) {
	t.Parallel()
	g := newGate(testflow.Reserve)
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: time.Hour}, before: g.before})
	g.openAtEnd(t)
	workflow.SetOverloadAfter(b.engine, time.Hour)
	done := make(chan error, 2)
	run := func(key string) {
		_, err := b.engine.Do(context.Background(), chargeReq("acct", key, `{"amount":5}`))
		done <- err
	}
	go run("first")
	require.Equal(t, "first", <-g.entered)
	go run("waiting")
	for workflow.Waiting(b.engine) != 1 {
		runtimeGosched()
	}
	workflow.SetWaitAvg(b.engine, 20*time.Minute)
	_, err := b.engine.Do(context.Background(), chargeReq("acct", "late", `{"amount":5}`))
	shedWith(t, err, workflow.ErrOverloaded) // returned while first still holds the place
	require.Equal(t, testflow.Effects{}, effects(t, b.db, "acct", "late"))
	g.open()
	for range 2 {
		require.NoError(t, <-done)
	}
}

// A new attempt is turned away at once, having sent nothing, when the wait for a pool
// connection before the claim is hopeless: others wait, and the last waits lasted over
// a quarter of AdmitWait or over what is left of the caller's deadline. While nobody
// waits, nothing is refused.
func TestAdmitRefusesHopelessConnectionWait(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: &workflow.Config{AdmitWait: time.Hour}})
	e := b.newEngine(t, setupOpts{cfg: &workflow.Config{AdmitWait: -1}})
	workflow.SetConnQueue(b.engine, 1, 20*time.Minute)
	_, err := b.engine.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	shedWith(t, err, workflow.ErrOverloaded)
	workflow.SetConnQueue(e, 1, 20*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err = e.Do(ctx, chargeReq("acct", "k1", `{"amount":5}`))
	shedWith(t, err, workflow.ErrOverloaded) // no AdmitWait, but the caller's deadline
	require.Equal(t, 0, countKeys(t, b.db))

	workflow.SetConnQueue(b.engine, 0, 20*time.Minute)
	res, err := b.engine.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	workflow.SetConnQueue(e, 1, 20*time.Minute)
	res, err = e.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`)) // no bound at all: queued, replayed
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

// RunReading reads the body only once the attempt holds its place: an attempt turned
// away (overloaded, then draining) never calls read and writes nothing; one admitted
// holds its place while read runs (a second attempt meanwhile is turned away), and a
// read that fails ends the attempt as bad input, writes nothing and gives the place
// back; one that succeeds runs the flow on the body read.
func TestRunReadingHoldsPlaceWhileReading(t *testing.T) {
	t.Parallel()
	g := newGate(testflow.Reserve)
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: 100 * time.Millisecond}, before: g.before})
	g.openAtEnd(t)
	req := func(key string) workflow.Request { return chargeReq("acct", key, "") }
	var reads int
	counted := func() ([]byte, error) { reads++; return []byte(`{"amount":5}`), nil }

	// The place is held by an attempt in its first tx phase: refused, read never called.
	done := make(chan error, 1)
	go func() {
		for {
			_, err := b.engine.Do(context.Background(), chargeReq("acct", "held", `{"amount":5}`))
			if !errors.As(err, new(*workflow.ShedError)) { // the pool was slow to connect
				done <- err
				return
			}
		}
	}()
	require.Equal(t, "held", <-g.entered)
	out := b.engine.RunReading(context.Background(), req("refused"), counted)
	require.Equal(t, workflow.OutcomeShed, out.Outcome)
	shedWith(t, out.Err, workflow.ErrOverloaded)
	require.Zero(t, reads, "a refused attempt read its body")
	g.open()
	require.NoError(t, <-done)

	// While read runs the place is held: another attempt is refused meanwhile. The read
	// fails: bad input, nothing written, and the place is given back.
	var inner *workflow.Result
	out = b.engine.RunReading(context.Background(), req("broken"), func() ([]byte, error) {
		inner = b.engine.RunReading(context.Background(), req("meanwhile"), counted)
		return nil, errors.New("connection reset")
	})
	require.Equal(t, workflow.OutcomeFailed, out.Outcome)
	require.ErrorIs(t, out.Err, workflow.ErrInvalidRequest)
	require.Equal(t, workflow.OutcomeShed, inner.Outcome, "an attempt was admitted while another held the only place and read its body")
	require.Zero(t, reads)

	// The place was given back: the next attempt is admitted, reads once and runs.
	out = b.engine.RunReading(context.Background(), req("k1"), counted)
	require.NoError(t, out.Err)
	require.Equal(t, 201, out.Response.Status)
	require.Equal(t, 1, reads)
	require.Equal(t, 2, countKeys(t, b.db), "keys other than held and k1")
	require.Equal(t, testflow.Effects{}, effects(t, b.db, "acct", "broken"))
	requireOneEffect(t, b, "acct", "k1")

	// Draining: refused, read never called.
	require.NoError(t, b.engine.Drain(context.Background()))
	out = b.engine.RunReading(context.Background(), req("drained"), counted)
	shedWith(t, out.Err, workflow.ErrDraining)
	require.Equal(t, 1, reads)
}

// A read that panics (a caller's reader gone wrong) still gives the place back: the
// next attempt is admitted.
func TestRunReadingPanickingReadGivesPlaceBack(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: 100 * time.Millisecond}})
	require.PanicsWithValue(t, "reader broke", func() {
		b.engine.RunReading(context.Background(), chargeReq("acct", "broken", ""), func() ([]byte, error) { panic("reader broke") })
	})
	out := b.engine.RunReading(context.Background(), chargeReq("acct", "k1", ""), func() ([]byte, error) { return []byte(`{"amount":5}`), nil })
	require.NoError(t, out.Err)
	require.Equal(t, 201, out.Response.Status)
	require.Equal(t, 1, countKeys(t, b.db))
}
