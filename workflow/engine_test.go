package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func TestDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SameRequestTwice", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		first, err := b.engine.Do(ctx, chargeReq("acct_1", "k1", `{"amount":500}`))
		require.NoError(t, err)
		require.False(t, first.Replayed)
		require.Equal(t, 201, first.Response.Status)

		second, err := b.engine.Do(ctx, chargeReq("acct_1", "k1", `{"amount":500}`))
		require.NoError(t, err)
		require.True(t, second.Replayed)
		require.Equal(t, first.Response.Status, second.Response.Status)
		require.Equal(t, first.Response.Body, second.Response.Body)
		require.Equal(t, first.Response.Header.Get("Location"), second.Response.Header.Get("Location"))
		require.Equal(t, "application/json", second.Response.Header.Get("Content-Type"))
		require.Empty(t, second.Response.Header.Values("Set-Cookie"), "Set-Cookie must never be stored")

		requireOneEffect(t, b, "acct_1", "k1")
		require.Equal(t, 1, b.provider.Made())
		st := state(t, b.db, "acct_1", "k1")
		require.Equal(t, "finished", st.Status)
		require.False(t, st.HasLease)
	})

	t.Run("ReorderedJSONIsTheSameRequest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		first, err := b.engine.Do(ctx, chargeReq("acct_1", "k1", `{"amount":500,"note":"a"}`))
		require.NoError(t, err)
		second, err := b.engine.Do(ctx, chargeReq("acct_1", "k1", "{ \"note\" : \"a\",\n \"amount\": 5e2 }"))
		require.NoError(t, err)
		require.True(t, second.Replayed)
		require.Equal(t, first.Response.Body, second.Response.Body)
		requireOneEffect(t, b, "acct_1", "k1")
	})

	t.Run("ScopesAreIndependent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		a, err := b.engine.Do(ctx, chargeReq("acct_a", "same", `{"amount":1}`))
		require.NoError(t, err)
		c, err := b.engine.Do(ctx, chargeReq("acct_b", "same", `{"amount":2}`))
		require.NoError(t, err, "another scope's key of the same name is not a mismatch")
		require.False(t, c.Replayed)
		require.NotEqual(t, a.Response.Body, c.Response.Body)
		requireOneEffect(t, b, "acct_a", "same")
		requireOneEffect(t, b, "acct_b", "same")
		require.Equal(t, 2, b.provider.Made(), "derived keys differ across scopes")
	})

	t.Run("TerminalFailureIsStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		first, err := b.engine.Do(ctx, chargeReq("acct_1", "bad", `{"amount":-1}`))
		require.NoError(t, err)
		require.Equal(t, 400, first.Response.Status)
		second, err := b.engine.Do(ctx, chargeReq("acct_1", "bad", `{"amount":-1}`))
		require.NoError(t, err)
		require.True(t, second.Replayed)
		require.Equal(t, first.Response.Body, second.Response.Body)
		require.Equal(t, testflow.Effects{}, effects(t, b.db, "acct_1", "bad"))
		require.Equal(t, 0, b.provider.Made())
	})
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs sync.Map // key -> *atomic.Int32: successful reserve commits
	// Admission waits as long as it takes (AdmitWait -1, no cap): 256 attempts at once
	// on a loaded machine may otherwise be shed as overloaded before their claim, which
	// is TestOverload's subject, not this test's.
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: -1, AdmitWait: -1, Hooks: workflow.Hooks{
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if ev.Phase == testflow.Reserve && err == nil {
				n, _ := runs.LoadOrStore(ev.Key, new(atomic.Int32))
				n.(*atomic.Int32).Add(1)
			}
		},
	}}})
	const keys, senders = 8, 32
	type answer struct {
		res *workflow.Result
		err error
	}
	answers := make([][]answer, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		answers[k] = make([]answer, senders)
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := b.engine.Do(ctx, chargeReq("acct", fmt.Sprintf("key-%d", k), `{"amount":100}`))
				answers[k][s] = answer{res, err}
			}()
		}
	}
	close(start)
	wg.Wait()

	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		n, ok := runs.Load(key)
		require.True(t, ok, "key %s never ran", key)
		require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "key %s ran its first phase more than once", key)
		requireOneEffect(t, b, "acct", key)

		var body []byte
		fresh := 0
		for _, a := range answers[k] {
			if a.err == nil && !a.res.Replayed {
				fresh++
				body = a.res.Response.Body
			}
		}
		require.Equal(t, 1, fresh, "exactly one attempt of %s executes", key)
		for _, a := range answers[k] {
			switch {
			case a.err == nil:
				require.Equal(t, body, a.res.Response.Body)
			default:
				ip, ok := isInProgress(a.err)
				require.True(t, ok, "losers get in-progress errors, got %v", a.err)
				require.GreaterOrEqual(t, ip.RetryAfter, time.Second)
				// and then the same answer
				res, err := b.engine.Do(ctx, chargeReq("acct", key, `{"amount":100}`))
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, body, res.Response.Body)
			}
		}
	}
	require.Equal(t, keys, b.provider.Made())
}

func TestMismatchWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":100}`))
	require.NoError(t, err)
	before := keyRow(t, b.db, "acct", "k")

	cases := map[string]workflow.Request{
		"Body":   chargeReq("acct", "k", `{"amount":101}`),
		"Route":  {Scope: "acct", Key: "k", Flow: testflow.Name, Method: "POST", Route: "/other", Body: []byte(`{"amount":100}`)},
		"Method": {Scope: "acct", Key: "k", Flow: testflow.Name, Method: "PUT", Route: "/charges", Body: []byte(`{"amount":100}`)},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := b.engine.Do(ctx, req)
			require.ErrorIs(t, err, workflow.ErrMismatch)
			require.Equal(t, before, keyRow(t, b.db, "acct", "k"))
		})
	}
	requireOneEffect(t, b, "acct", "k")
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	ok := chargeReq("acct", "k", `{"amount":1}`)
	with := func(f func(*workflow.Request)) workflow.Request { r := ok; f(&r); return r }
	cases := []struct {
		name string
		req  workflow.Request
		want error
	}{
		{"EmptyKey", with(func(r *workflow.Request) { r.Key = "" }), workflow.ErrInvalidKey},
		{"KeyOf256", with(func(r *workflow.Request) { r.Key = strings.Repeat("k", 256) }), workflow.ErrInvalidKey},
		{"ControlCharacter", with(func(r *workflow.Request) { r.Key = "abc\ndef" }), workflow.ErrInvalidKey},
		{"NonASCII", with(func(r *workflow.Request) { r.Key = "clé" }), workflow.ErrInvalidKey},
		{"UnknownFlow", with(func(r *workflow.Request) { r.Flow = "nope" }), workflow.ErrUnknownFlow},
		{"EmptyScope", with(func(r *workflow.Request) { r.Scope = "" }), workflow.ErrInvalidScope},
		{"EmptyRoute", with(func(r *workflow.Request) { r.Route = "" }), workflow.ErrInvalidRequest},
		// The table's text columns refuse what is not UTF-8 or holds NUL; the engine
		// refuses it first, with its own error, since 002 left lengths to the engine.
		{"ScopeNotUTF8", with(func(r *workflow.Request) { r.Scope = "acct\xff" }), workflow.ErrInvalidScope},
		{"ScopeWithNUL", with(func(r *workflow.Request) { r.Scope = "acct\x00" }), workflow.ErrInvalidScope},
		{"ScopeOf256", with(func(r *workflow.Request) { r.Scope = strings.Repeat("s", 256) }), workflow.ErrInvalidScope},
		{"RouteNotUTF8", with(func(r *workflow.Request) { r.Route = "/charges/\xc3" }), workflow.ErrInvalidRequest},
		{"RouteWithNUL", with(func(r *workflow.Request) { r.Route = "/charges\x00" }), workflow.ErrInvalidRequest},
		{"MethodNotUTF8", with(func(r *workflow.Request) { r.Method = "P\xffST" }), workflow.ErrInvalidRequest},
		{"BodyTooLarge", with(func(r *workflow.Request) { r.Body = make([]byte, workflow.MaxBodyBytesDefault+1) }), workflow.ErrBodyTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := b.engine.Do(ctx, c.req)
			require.ErrorIs(t, err, c.want)
			require.Equal(t, 0, countKeys(t, b.db))
		})
	}
	t.Run("KeyOf255IsAccepted", func(t *testing.T) {
		_, err := b.engine.Do(ctx, with(func(r *workflow.Request) { r.Key = strings.Repeat("k", 255) }))
		require.NoError(t, err)
	})
}

func TestUnknownRecoveryPoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			return testflow.ErrInjected // stop after reserve
		}
		return nil
	}})
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":1}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET recovery_point = 'renamed_phase'`)
	require.NoError(t, err)
	before := keyRow(t, b.db, "acct", "k")

	_, err = b.engine.Resume(ctx, "acct", "k")
	require.ErrorIs(t, err, workflow.ErrUnknownRecoveryPoint)
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"))

	_, err = b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":1}`))
	require.ErrorIs(t, err, workflow.ErrUnknownRecoveryPoint)
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"))

	t.Run("UnknownFlow", func(t *testing.T) {
		_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET recovery_point = 'reserve', flow = 'retired'`)
		require.NoError(t, err)
		before := keyRow(t, b.db, "acct", "k")
		_, err = b.engine.Resume(ctx, "acct", "k")
		require.ErrorIs(t, err, workflow.ErrUnknownFlow)
		require.Equal(t, before, keyRow(t, b.db, "acct", "k"))
	})
	t.Run("NotFound", func(t *testing.T) {
		_, err := b.engine.Resume(ctx, "acct", "missing")
		require.ErrorIs(t, err, workflow.ErrNotFound)
	})
}

func TestTransientCallFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	var ran []string
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			mu.Lock()
			ran = append(ran, ev.Phase)
			mu.Unlock()
			return ctx
		},
	}}})
	b.provider.FailNext(1)

	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	var te *workflow.TransientError
	require.ErrorAs(t, err, &te)
	require.Equal(t, testflow.Pay, te.Phase)
	require.GreaterOrEqual(t, te.RetryAfter, time.Second)

	st := state(t, b.db, "acct", "k")
	require.Equal(t, "in_progress", st.Status)
	require.Equal(t, testflow.Reserve, st.RecoveryPoint, "the recovery point is kept")
	require.False(t, st.HasLease, "the key is released")
	require.NotNil(t, st.LastError)
	require.Contains(t, *st.LastError, "503")
	var stored int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE response_status IS NOT NULL`).Scan(&stored))
	require.Zero(t, stored, "nothing is stored")
	require.Equal(t, 0, b.provider.Made())

	mu.Lock()
	ran = nil
	mu.Unlock()
	res, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 201, res.Response.Status)
	mu.Lock()
	require.Equal(t, []string{testflow.Pay, testflow.Settle}, ran, "the retry resumes at the call phase")
	mu.Unlock()
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())
	require.Equal(t, 2, state(t, b.db, "acct", "k").Attempts)
}

func TestPanicIsTransient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var panicked atomic.Bool
	b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Settle && panicked.CompareAndSwap(false, true) {
			if _, err := tx.Exec(ctx, `INSERT INTO settlements (ledger_id, payment_id) VALUES ($1, 'from-panicking-phase')`, -1); err != nil {
				return err
			}
			panic("boom")
		}
		return nil
	}})
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	var pe *phases.PanicError
	require.ErrorAs(t, err, &pe)
	st := state(t, b.db, "acct", "k")
	require.Equal(t, testflow.Pay, st.RecoveryPoint, "the call phase's result was kept with the release")

	res, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")
	var stray int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE payment_id = 'from-panicking-phase'`).Scan(&stray))
	require.Zero(t, stray, "the panicking phase's writes were rolled back")
	require.Equal(t, 1, b.provider.Requests(mustID(t, b, "acct", "k")+":"+testflow.Pay), "the call was not repeated")
}

func mustID(t *testing.T, b *bundle, scope, key string) string {
	t.Helper()
	var id string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT id::text FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&id))
	return id
}

func TestSerializationFailureRetriesThePhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var settleRuns atomic.Int32
	b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() != testflow.Settle {
			return nil
		}
		if settleRuns.Add(1) == 1 {
			// a real write first, so the retry must not see it
			if _, err := tx.Exec(ctx, `INSERT INTO settlements (ledger_id, payment_id) VALUES ($1, 'first-try')`, -1); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return nil
	}})
	res, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.EqualValues(t, 2, settleRuns.Load(), "the phase ran again after the serialization failure")
	requireOneEffect(t, b, "acct", "k")
	var stray int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE payment_id = 'first-try'`).Scan(&stray))
	require.Zero(t, stray)

	t.Run("FirstPhaseWithClaim", func(t *testing.T) {
		var reserveRuns atomic.Int32
		b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Reserve && reserveRuns.Add(1) == 1 {
				_, err := tx.Exec(ctx, `SELECT $1::int, pg_sleep(0) FROM (SELECT 1) s WHERE false`, 1)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40P01'; END $$`)
				return err
			}
			return nil
		}})
		res, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":7}`))
		require.NoError(t, err)
		require.Equal(t, 201, res.Response.Status)
		require.EqualValues(t, 2, reserveRuns.Load())
		requireOneEffect(t, b, "acct", "k")
	})

	t.Run("NeverOnContextErrors", func(t *testing.T) {
		var runs atomic.Int32
		cctx, cancel := context.WithCancel(ctx)
		b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Reserve {
				runs.Add(1)
				cancel()
				return ctx.Err()
			}
			return nil
		}})
		_, err := b.engine.Do(cctx, chargeReq("acct", "k", `{"amount":7}`))
		require.ErrorIs(t, err, context.Canceled)
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 0, countKeys(t, b.db), "the claim rolled back with the phase")
	})
}

// TestZombieCannotCommit: an executor paused inside its last tx phase while its lease
// is taken over (by the database clock) cannot commit when it resumes.
//
// The lease is long: it also bounds the executor's call (no call starts with less than
// a tenth of it left) and its phase's transaction (a context deadline), so a lease of
// 2 s let a machine that stalled the executor 1.8 s between its first commit and its
// call refuse the call, release the key and never reach the pause (the test hung);
// a stall in the paused phase would let the lease's end, not the fence, stop the
// commit. Nothing waits for this lease: expireLease moves it by the database clock.
func TestZombieCannotCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	paused := make(chan struct{})
	resume := make(chan struct{})
	var zombie atomic.Bool
	zombie.Store(true)
	b := setup(t, setupOpts{
		cfg: &workflow.Config{Lease: time.Minute},
		before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Settle && zombie.CompareAndSwap(true, false) {
				close(paused)
				<-resume // the executor stalls here, past its lease
			}
			return nil
		}})

	zombieErr := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":9}`))
		zombieErr <- err
	}()
	select {
	case <-paused:
	case err := <-zombieErr:
		t.Fatalf("the executor ended before it reached the settle phase: %v", err)
	}
	expireLease(t, b.db, "acct", "k")

	other := b.newEngine(t, setupOpts{pool: b.db.NewPool(t)})
	res, err := other.Resume(ctx, "acct", "k")
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	after := keyRow(t, b.db, "acct", "k")

	close(resume)
	err = <-zombieErr
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	require.Equal(t, 1, strings.Count(err.Error(), "lease lost"), "a lost lease is named once: %v", err)
	require.Equal(t, after, keyRow(t, b.db, "acct", "k"), "the zombie changed the key row")
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())

	replay, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":9}`))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, res.Response.Body, replay.Response.Body)
}

func TestInProgressRetryAfterFromLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	paused := make(chan struct{})
	resume := make(chan struct{})
	b := setup(t, setupOpts{
		cfg: &workflow.Config{Lease: 20 * time.Second},
		before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Pay {
				close(paused)
				<-resume
			}
			return nil
		}})
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":9}`))
		done <- err
	}()
	<-paused
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":9}`))
	ip, ok := isInProgress(err)
	require.True(t, ok, "got %v", err)
	require.Greater(t, ip.RetryAfter, 10*time.Second)
	require.LessOrEqual(t, ip.RetryAfter, 20*time.Second)

	_, err = b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":10}`))
	require.ErrorIs(t, err, workflow.ErrMismatch, "a different request is a mismatch even while in progress")
	close(resume)
	require.NoError(t, <-done)
}

func TestResponseTooLargeIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, setupOpts{}).db
	e, err := workflow.New(db.Pool, &workflow.Config{MaxResponseBytes: 10})
	require.NoError(t, err)
	require.NoError(t, e.Register(phases.Flow{Name: "big", Phases: []phases.Phase{
		phases.Tx("answer", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return &phases.Response{Status: 200, Body: []byte(strings.Repeat("x", 11))}, nil
		}),
	}}))
	_, err = e.Do(ctx, workflow.Request{Scope: "s", Key: "k", Flow: "big", Method: "POST", Route: "/big"})
	require.ErrorIs(t, err, workflow.ErrResponseTooLarge)
	require.Equal(t, 0, countKeys(t, db), "nothing stored, nothing truncated")
}

func TestFiveHundredIsNeverStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, setupOpts{}).db
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	var calls atomic.Int32
	require.NoError(t, e.Register(phases.Flow{Name: "flaky", Phases: []phases.Phase{
		phases.Tx("first", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return nil, nil
		}),
		phases.Call("answer", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if calls.Add(1) == 1 {
				return &phases.Response{Status: 503, Body: []byte("busy")}, nil
			}
			return &phases.Response{Status: 200, Body: []byte("ok")}, nil
		}),
	}}))
	req := workflow.Request{Scope: "s", Key: "k", Flow: "flaky", Method: "POST", Route: "/f"}
	_, err = e.Do(ctx, req)
	var te *workflow.TransientError
	require.ErrorAs(t, err, &te)
	require.NotNil(t, te.Response)
	require.Equal(t, 503, te.Response.Status)
	st := state(t, db, "s", "k")
	require.Equal(t, "in_progress", st.Status)

	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, "ok", string(res.Response.Body))
}

func TestPhaseDataCarriesAcrossResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, setupOpts{}).db
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	type note struct {
		A int
		B []string
	}
	slot := phases.NewSlot[note]("note")
	fail := true
	require.NoError(t, e.Register(phases.Flow{Name: "data", Phases: []phases.Phase{
		phases.Tx("write", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return nil, slot.Set(run, note{A: 42, B: []string{"x", "y"}})
		}),
		phases.Tx("read", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if fail {
				fail = false
				return nil, errors.New("not yet")
			}
			n, err := slot.Get(run)
			if err != nil {
				return nil, err
			}
			return phases.JSON(200, n)
		}),
	}}))
	req := workflow.Request{Scope: "s", Key: "k", Flow: "data", Method: "POST", Route: "/d"}
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	var got note
	require.NoError(t, json.Unmarshal(res.Response.Body, &got))
	require.Equal(t, note{A: 42, B: []string{"x", "y"}}, got)
}

// TestZombieFencedByLockVersion pauses the zombie while the new owner is still
// mid-flow, so only the lock version (not the key's status) can stop its commit.
func TestZombieFencedByLockVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	zombiePaused, zombieGo := make(chan struct{}), make(chan struct{})
	ownerPaused, ownerGo := make(chan struct{}), make(chan struct{})
	var zombieOnce, ownerOnce atomic.Bool
	b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Settle && zombieOnce.CompareAndSwap(false, true) {
			close(zombiePaused)
			<-zombieGo
		}
		return nil
	}})
	owner := b.newEngine(t, setupOpts{pool: b.db.NewPool(t), before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay && ownerOnce.CompareAndSwap(false, true) {
			close(ownerPaused)
			<-ownerGo
		}
		return nil
	}})

	zombieErr := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":9}`))
		zombieErr <- err
	}()
	<-zombiePaused
	// The zombie's recovery point is "pay"; the owner resumes and re-runs the call
	// (deduped by the derived key), pausing there.
	expireLease(t, b.db, "acct", "k")
	ownerRes := make(chan *workflow.Result, 1)
	go func() {
		res, err := owner.Resume(ctx, "acct", "k")
		if err != nil {
			t.Errorf("owner: %v", err)
		}
		ownerRes <- res
	}()
	<-ownerPaused
	before := keyRow(t, b.db, "acct", "k")
	require.Equal(t, "in_progress", state(t, b.db, "acct", "k").Status)

	close(zombieGo)
	require.ErrorIs(t, <-zombieErr, workflow.ErrLeaseLost)
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "the zombie changed the key row")
	require.Equal(t, testflow.Effects{Ledger: 1}, effects(t, b.db, "acct", "k"), "the zombie's writes rolled back")

	close(ownerGo)
	res := <-ownerRes
	require.NotNil(t, res)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())
}

// TestCallFirstCommitsTheClaimBeforeCalling: a flow that starts with a call phase must
// make its key row durable before anything leaves the process, so the derived key it
// sends survives a crash and a duplicate sees the key in progress.
func TestCallFirstCommitsTheClaimBeforeCalling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, setupOpts{}).db
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	var seenDuringCall string
	var duplicateErr error
	var derived []string
	require.NoError(t, e.Register(phases.Flow{Name: "callfirst", Phases: []phases.Phase{
		phases.Call("remote", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			seenDuringCall = keyRow(t, db, run.Scope(), run.Key())
			_, duplicateErr = e.Do(ctx, workflow.Request{Scope: "s", Key: "k", Flow: "callfirst", Method: "POST", Route: "/c"})
			derived = append(derived, run.DerivedKey())
			if len(derived) == 1 {
				return nil, errors.New("remote timed out")
			}
			return nil, nil
		}),
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return &phases.Response{Status: 200, Body: []byte("done")}, nil
		}),
	}}))
	req := workflow.Request{Scope: "s", Key: "k", Flow: "callfirst", Method: "POST", Route: "/c"}
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.NotEmpty(t, seenDuringCall, "the key row was not committed before the call")
	_, inProgress := isInProgress(duplicateErr)
	require.True(t, inProgress, "a duplicate during the call is in progress, got %v", duplicateErr)

	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "done", string(res.Response.Body))
	require.Len(t, derived, 2)
	require.Equal(t, derived[0], derived[1], "the retry sends the same derived key")
}

// TestCallPhaseResponseTooLarge: a call phase's response over the limit is refused,
// never truncated, and the key is released rather than left leased.
func TestCallPhaseResponseTooLarge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, setupOpts{}).db
	e, err := workflow.New(db.Pool, &workflow.Config{MaxResponseBytes: 4})
	require.NoError(t, err)
	require.NoError(t, e.Register(phases.Flow{Name: "bigcall", Phases: []phases.Phase{
		phases.Tx("first", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("answer", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			return &phases.Response{Status: 200, Body: []byte("too big")}, nil
		}),
	}}))
	req := workflow.Request{Scope: "s", Key: "k", Flow: "bigcall", Method: "POST", Route: "/b"}
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrResponseTooLarge)
	require.ErrorIs(t, err, workflow.ErrTransient)
	st := state(t, db, "s", "k")
	require.Equal(t, "in_progress", st.Status)
	require.False(t, st.HasLease, "the key is released for the next attempt")
	require.Equal(t, "first", st.RecoveryPoint)
}

// TestFailedCommitForgetsThePhasesData: when a tx phase's commit does not happen (here
// its phase data is over the limit), what the phase put in the phase data goes with its
// transaction: the release keeps the data of the phases that committed.
func TestFailedCommitForgetsThePhasesData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e, err := workflow.New(b.db.Pool, &workflow.Config{MaxPhaseDataBytes: 64})
	require.NoError(t, err)
	first, big := phases.NewSlot[int]("first"), phases.NewSlot[string]("big")
	require.NoError(t, e.Register(phases.Flow{Name: "two_tx", Phases: []phases.Phase{
		phases.Tx("one", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return nil, first.Set(run, 1)
		}),
		phases.Tx("two", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return nil, big.Set(run, strings.Repeat("x", 100)) // over the 64-byte limit at commit
		}),
		phases.Tx("three", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return phases.JSON(201, map[string]bool{"ok": true})
		}),
	}}))
	_, err = e.Do(ctx, workflow.Request{Scope: "acct", Key: "k", Flow: "two_tx", Method: "POST", Route: "/x", Body: []byte(`{}`)})
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.ErrorIs(t, err, workflow.ErrPhaseDataTooLarge)

	var rp, data string
	require.NoError(t, b.db.Pool.QueryRow(ctx,
		`SELECT recovery_point, phase_data::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'k'`).Scan(&rp, &data))
	require.Equal(t, "one", rp)
	require.JSONEq(t, `{"first":1}`, data, "the release kept only what committed")
}

// TestClaimHeldHook: ClaimHeld fires once for a new key, inside the first tx phase's
// transaction before its function runs (the key row is not written yet), and not for a
// replay or a takeover.
func TestClaimHeldHook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var held []workflow.PhaseEvent
	var rowsAtHold []int
	var firstRan bool
	e := b.newEngine(t, setupOpts{
		cfg: &workflow.Config{Hooks: workflow.Hooks{ClaimHeld: func(ctx context.Context, ev workflow.PhaseEvent) {
			held = append(held, ev)
			rowsAtHold = append(rowsAtHold, countKeys(t, b.db))
			require.False(t, firstRan, "the phase ran before the claim was held")
		}}},
		before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Reserve {
				firstRan = true
			}
			if run.Phase() == testflow.Pay && run.Attempt() == 1 {
				return testflow.ErrInjected // released at reserve: the retry takes it over
			}
			return nil
		},
	})
	_, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Len(t, held, 1)
	require.Equal(t, testflow.Reserve, held[0].Phase)
	require.Equal(t, []int{0}, rowsAtHold, "nothing of the key was committed at the hook")

	_, err = e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.NoError(t, err, "the released key is taken over")
	replay, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Len(t, held, 1, "neither a takeover nor a replay holds a claim")
}
