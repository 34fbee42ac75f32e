package sweeper_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestConfigRefused: Sweep and Start refuse invalid settings, and Start then starts
// nothing (Stop has nothing to stop, and a valid Start afterwards runs).
func TestConfigRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for name, cfg := range map[string]sweeper.Config{
		"NegativeInterval":  {Interval: -time.Second},
		"HugeBatch":         {BatchSize: 1 << 20},
		"NegativeWorkers":   {Concurrency: -1},
		"NegativeAttempts":  {MaxAttempts: -1},
		"ShortRetention":    {Retention: time.Second},
		"NegativeCleanup":   {CleanupBatch: -5},
		"NegativeRetention": {Retention: -time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := b.engine.Sweep(ctx, &cfg)
			require.Error(t, err)
			require.Error(t, b.engine.Start(ctx, &cfg))
			require.NoError(t, b.engine.Stop(ctx))
		})
	}
	require.NoError(t, b.engine.Start(ctx, &sweeper.Config{Interval: time.Hour}))
	require.NoError(t, b.engine.Stop(ctx))
	d := (*sweeper.Config)(nil).WithDefaults()
	require.Equal(t, sweeper.IntervalDefault, d.Interval)
	require.Equal(t, sweeper.GraceDefault, d.Grace)
	require.Equal(t, sweeper.BatchSizeDefault, d.BatchSize)
	require.Equal(t, sweeper.ConcurrencyDefault, d.Concurrency)
	require.Equal(t, sweeper.MaxAttemptsDefault, d.MaxAttempts)
	require.Equal(t, 24*time.Hour, d.Retention)
	require.Equal(t, sweeper.CleanupBatchDefault, d.CleanupBatch)
	require.Equal(t, time.Duration(-1), (&sweeper.Config{Grace: -1}).WithDefaults().Grace, "-1 (no grace) is kept as written")
}

func TestRunOnceFinishesStuckKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name     string
		req      workflow.Request
		failAt   string // the phase that fails: the key is left at the one before
		payPhase string
		want     string // recovery point the key is stuck at
	}{
		{"Started", payFirstReq("k"), payFirstCharge, payFirstCharge, "started"},
		{"Reserve", chargeReq("k"), testflow.Pay, testflow.Pay, testflow.Reserve},
		{"Pay", chargeReq("k"), testflow.Settle, testflow.Pay, testflow.Pay},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var ev events
			b := setup(t, setupOpts{engine: &workflow.Config{Hooks: workflow.Hooks{Key: ev.hook}}})
			b.stuck(t, c.req, c.failAt)
			st := state(t, b.db, "k")
			require.Equal(t, c.want, st.RecoveryPoint)
			require.False(t, st.Leased)
			paidBefore := b.provider.Made()

			s := b.newSweeper(t, nil)
			stats, err := s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.Stats{}, stats, "not due yet: inside the backoff and the grace period")

			makeDue(t, b.db, "k")
			stats, err = s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
			require.Equal(t, 1, ev.count(workflow.OutcomeSwept))

			after := state(t, b.db, "k")
			require.Equal(t, "finished", after.Status)
			require.Equal(t, st.LockVersion+1, after.LockVersion, "the sweeper's takeover bumped the lock version once")
			requireOneEffect(t, b, "k", c.payPhase)
			require.Equal(t, 1, b.provider.Made())
			if c.want == testflow.Pay {
				require.Equal(t, paidBefore, b.provider.Made(), "the payment made before the failure is the one")
			}

			replay, err := b.engine.Do(ctx, c.req)
			require.NoError(t, err)
			require.True(t, replay.Replayed)
			require.Equal(t, 201, replay.Response.Status)

			stats, err = s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.Stats{}, stats)
		})
	}
}

func TestRunOnceLeavesAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FreshKeyInGracePeriod", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.stuck(t, chargeReq("k"), testflow.Pay)
		_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() - interval '1 millisecond'`)
		require.NoError(t, err)
		before := keyRow(t, b.db, "k")

		stats, err := b.newSweeper(t, nil).RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{}, stats)
		require.Equal(t, before, keyRow(t, b.db, "k"))

		// With no grace, the same key is swept.
		stats, err = b.newSweeper(t, &sweeper.Config{Grace: -1}).RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
	})

	t.Run("LiveLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.stuck(t, chargeReq("k"), testflow.Pay)
		makeDue(t, b.db, "k")
		_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET locked_until = statement_timestamp() + interval '1 hour'`)
		require.NoError(t, err)
		before := keyRow(t, b.db, "k")

		stats, err := b.newSweeper(t, nil).RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{}, stats)
		require.Equal(t, before, keyRow(t, b.db, "k"))
	})

	t.Run("NotYetDue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.stuck(t, chargeReq("k"), testflow.Pay)
		makeDue(t, b.db, "k")
		_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() + interval '1 minute'`)
		require.NoError(t, err)
		before := keyRow(t, b.db, "k")

		stats, err := b.newSweeper(t, nil).RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{}, stats)
		require.Equal(t, before, keyRow(t, b.db, "k"))
	})

	t.Run("UnregisteredFlow", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.stuck(t, chargeReq("k"), testflow.Pay)
		makeDue(t, b.db, "k")
		before := keyRow(t, b.db, "k")

		other, err := workflow.New(b.db.Pool, nil) // knows no flow: another service's sweeper
		require.NoError(t, err)
		stats, err := other.Sweep(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{}, stats)
		require.Equal(t, before, keyRow(t, b.db, "k"), "left for a process that has the flow")
	})

}

// TestRunOnceSkipsKeyFinishedBetweenReadAndUpdate: a request that finishes between
// the sweeper's read and its update holds the key row's lock while it commits its
// finish (here: a transaction that finishes the key under its own fence and is held
// open). The sweeper's statement sees the key in progress, expired and due in its
// snapshot, but skips the locked row instead of waiting; after the finish commits, the
// key is no longer a candidate. An identical key that nobody holds is swept in the
// same pass.
func TestRunOnceSkipsKeyFinishedBetweenReadAndUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for _, k := range []string{"racing", "other"} {
		b.stuck(t, chargeReq(k), testflow.Settle)
		makeDue(t, b.db, k)
	}
	seen := state(t, b.db, "racing")

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	row, err := keytable.New().Lookup(ctx, b.db.Pool, "acct", "racing")
	require.NoError(t, err)
	fence := keytable.Fence{Scope: "acct", Key: "racing", ID: row.ID, LockVersion: seen.LockVersion, CreatedAt: row.CreatedAt}
	st := keytable.New()
	finish := &pgx.Batch{}
	q := st.QueueKeyWrite(finish, keytable.KeyWrite{Fence: fence, Response: &keytable.StoredResponse{Status: 201, Headers: []byte(`{}`), Body: []byte(`{"late":true}`)}})
	br := tx.SendBatch(ctx, finish)
	_, err = q.Read(br)
	require.NoError(t, err)
	require.NoError(t, br.Close())

	s := b.newSweeper(t, nil)
	stats, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats, "only the key nobody holds is taken")
	require.Equal(t, "finished", state(t, b.db, "other").Status)

	require.NoError(t, tx.Commit(ctx))
	finished := keyRow(t, b.db, "racing")
	stats, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{}, stats)
	require.Equal(t, finished, keyRow(t, b.db, "racing"), "the finished key is untouched")
	after := state(t, b.db, "racing")
	require.Equal(t, seen.LockVersion, after.LockVersion, "never taken over")
	res, err := b.engine.Do(ctx, chargeReq("racing"))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.JSONEq(t, `{"late":true}`, string(res.Response.Body), "the request's own answer stands")
}

// TestBackoffDeadLetterRedrive: each release backs a key off BackoffBase·2^(attempts−1),
// the sweeper dead-letters it after MaxAttempts, and a re-drive brings it back. The
// backoff is a minute: a key is made due by the database clock (makeDue), never by
// waiting, and with a backoff of a second a machine that stalled two seconds between a
// release and the look at the key found it due already (shown by a temporary 2.1 s
// sleep there).
func TestBackoffDeadLetterRedrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var ev events
	b := setup(t, setupOpts{engine: &workflow.Config{BackoffBase: time.Minute, BackoffMax: time.Hour, Hooks: workflow.Hooks{Key: ev.hook}}})
	b.provider.FailNext(1 << 20)
	_, err := b.engine.Do(ctx, chargeReq("k"))
	require.ErrorIs(t, err, workflow.ErrTransient)
	st := state(t, b.db, "k")
	require.Equal(t, 1, st.Attempts)
	require.False(t, st.Due)
	require.InDelta(t, time.Minute.Milliseconds(), st.BackoffMillis, 100, "first backoff is BackoffBase")

	const maxAttempts = 4
	s := b.newSweeper(t, &sweeper.Config{MaxAttempts: maxAttempts})
	for attempt := 2; attempt < maxAttempts; attempt++ {
		makeDue(t, b.db, "k")
		stats, err := s.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{Taken: 1, Released: 1}, stats, "attempt %d", attempt)
		st := state(t, b.db, "k")
		require.Equal(t, "in_progress", st.Status)
		require.Equal(t, attempt, st.Attempts)
		require.False(t, st.Leased)
		require.False(t, st.Due)
		require.Equal(t, testflow.Reserve, st.RecoveryPoint)
		require.Contains(t, st.LastError, "503")
		want := time.Minute.Milliseconds() << (attempt - 1)
		require.InDelta(t, want, st.BackoffMillis, 100, "attempt %d backs off BackoffBase*2^(attempts-1)", attempt)
	}

	makeDue(t, b.db, "k")
	stats, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, DeadLettered: 1}, stats)
	require.Equal(t, 1, ev.count(workflow.OutcomeDeadLettered))
	st = state(t, b.db, "k")
	require.Equal(t, "dead", st.Status)
	require.Equal(t, maxAttempts, st.Attempts)
	require.False(t, st.Leased)
	require.Contains(t, st.LastError, "provider answered 503", "dead-lettered with its last error")
	require.Equal(t, testflow.Effects{Ledger: 1}, effects(t, b.db, "k"), "reserved once, never paid")

	_, err = b.engine.Do(ctx, chargeReq("k"))
	require.ErrorIs(t, err, workflow.ErrDeadLettered)
	require.ErrorContains(t, err, "503")

	// A dead-lettered key is never swept, however due.
	makeDue(t, b.db, "k")
	dead := keyRow(t, b.db, "k")
	stats, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{}, stats)
	require.Equal(t, dead, keyRow(t, b.db, "k"))

	// Re-drive: back in progress, released, attempts reset, due now.
	require.ErrorIs(t, b.engine.Redrive(ctx, "acct", "nope"), workflow.ErrNotFound)
	require.NoError(t, b.engine.Redrive(ctx, "acct", "k"))
	require.Equal(t, 1, ev.count(workflow.OutcomeRedriven))
	st = state(t, b.db, "k")
	require.Equal(t, "in_progress", st.Status)
	require.Equal(t, 0, st.Attempts)
	require.False(t, st.Leased)
	require.True(t, st.Due)
	require.ErrorIs(t, b.engine.Redrive(ctx, "acct", "k"), workflow.ErrWrongStatus)

	b.provider.FailNext(0)
	stats, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
	requireOneEffect(t, b, "k", testflow.Pay)
	require.Equal(t, 1, b.provider.Made())
	require.Equal(t, 1, state(t, b.db, "k").Attempts)
	require.ErrorIs(t, b.engine.Redrive(ctx, "acct", "k"), workflow.ErrWrongStatus)
}

// A key whose recovery point names a phase this build's flow does not have (another
// build has it, during a rolling deploy) is not taken: not run, not released as a
// failed attempt, never dead-lettered, however many sweeps pass. The row is left as it
// was for a build that knows the phase (or an operator).
func TestUnknownRecoveryPoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.stuck(t, chargeReq("k"), testflow.Pay)
	makeDue(t, b.db, "k")
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET recovery_point = 'gone'`)
	require.NoError(t, err)
	before := keyRow(t, b.db, "k")

	s := b.newSweeper(t, &sweeper.Config{MaxAttempts: 1})
	for range 2 {
		stats, err := s.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{}, stats)
	}
	require.Equal(t, before, keyRow(t, b.db, "k"), "the row changed")
	st := state(t, b.db, "k")
	require.Equal(t, "in_progress", st.Status)
	require.True(t, st.Due, "still due, for a build that knows the phase")
	require.Equal(t, testflow.Effects{Ledger: 1}, effects(t, b.db, "k"), "nothing ran")
	require.Equal(t, 0, b.provider.Made())
}

// Keys of the HTTP middleware can only be finished by their client, which still has
// the request: the sweeper releases them, never runs the wrapped handler.
func TestClientOnlyKeysAreReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	mw, err := idemhttp.Middleware(b.engine, &idemhttp.Config{
		Scope: func(*http.Request) (string, error) { return "acct", nil },
		Route: func(*http.Request) string { return "/plain" },
	})
	require.NoError(t, err)
	var calls atomic.Int32
	var healthy atomic.Bool
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if !healthy.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "done")
	}))
	send := func() *http.Response {
		req := httptest.NewRequest(http.MethodPost, "/plain", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}
	require.Equal(t, http.StatusServiceUnavailable, send().StatusCode)
	require.EqualValues(t, 1, calls.Load())
	makeDue(t, b.db, "k")
	before := state(t, b.db, "k")

	// Even with a single attempt allowed, it is parked, never dead-lettered.
	s := b.newSweeper(t, &sweeper.Config{MaxAttempts: 1})
	for range 2 {
		stats, err := s.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.Stats{Taken: 1, Parked: 1}, stats)
		require.EqualValues(t, 1, calls.Load(), "the handler is not run without its request")
		st := state(t, b.db, "k")
		require.Equal(t, "in_progress", st.Status)
		require.False(t, st.Leased)
		require.False(t, st.Due)
		require.InDelta(t, (24 * time.Hour).Milliseconds(), st.BackoffMillis, 1000, "left alone for the retention")
		require.Equal(t, before.Attempts, st.Attempts, "the sweeper's look is not an attempt")
		require.Contains(t, st.LastError, "client's retry")
		makeDue(t, b.db, "k")
	}

	healthy.Store(true)
	resp := send()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the client's retry runs it afresh")
	require.EqualValues(t, 2, calls.Load())
	require.Equal(t, "finished", state(t, b.db, "k").Status)
}

// TestStartStopIdempotent: Stop before Start, Start while running and Stop twice are
// harmless; a Start whose context ended can be followed by another.
func TestStartStopIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	s := b.newSweeper(t, &sweeper.Config{Interval: time.Millisecond})
	require.NoError(t, s.Stop(ctx), "stop before start")
	for range 20 {
		require.NoError(t, s.Start(ctx))
		require.NoError(t, s.Start(ctx), "start while running does nothing")
		require.Error(t, b.engine.Start(ctx, &sweeper.Config{Grace: -2}), "invalid settings are refused while running too")
		require.NoError(t, s.Stop(ctx))
		require.NoError(t, s.Stop(ctx))
	}
	// Start with a context that ends: the loop stops by itself; Start again runs.
	cctx, cancel := context.WithCancel(ctx)
	require.NoError(t, s.Start(cctx))
	cancel()
	require.NoError(t, s.Stop(ctx))
	require.NoError(t, s.Start(ctx))
	require.NoError(t, s.Stop(ctx))
}

// TestStartRunsTheBackgroundLoop: the loop Start runs finishes a stuck key.
func TestStartRunsTheBackgroundLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.stuck(t, chargeReq("k"), testflow.Pay)
	makeDue(t, b.db, "k")
	passes := make(chan sweeper.Stats, 100)
	s := b.newSweeper(t, &sweeper.Config{Interval: time.Millisecond, Hooks: sweeper.Hooks{
		Pass: func(_ context.Context, st sweeper.Stats, err error) {
			if err == nil && st.Finished > 0 {
				select {
				case passes <- st:
				default:
				}
			}
		},
	}})
	require.NoError(t, s.Start(ctx))
	require.Equal(t, 1, (<-passes).Finished)
	require.NoError(t, s.Stop(ctx))
	requireOneEffect(t, b, "k", testflow.Pay)
}

// TestStopBoundedByContext: a Stop whose context ends cancels the run in flight, which
// releases its key.
func TestStopBoundedByContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	entered := make(chan struct{})
	var armed atomic.Bool
	b := setup(t, setupOpts{engine: &workflow.Config{Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, e workflow.PhaseEvent) context.Context {
			if armed.Load() && e.Phase == testflow.Pay {
				close(entered)
				<-ctx.Done() // a phase that only ends when cancelled
			}
			return ctx
		},
	}}})
	b.stuck(t, chargeReq("k"), testflow.Pay)
	makeDue(t, b.db, "k")
	armed.Store(true)
	s := b.newSweeper(t, nil)
	require.NoError(t, s.Start(ctx))
	<-entered
	sctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, s.Stop(sctx), context.Canceled)
	st := state(t, b.db, "k")
	require.Equal(t, "in_progress", st.Status)
	require.False(t, st.Leased, "the cancelled run released its key")
	require.Equal(t, testflow.Reserve, st.RecoveryPoint)
}
