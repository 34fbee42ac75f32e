package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// sealedBody reads a key's stored request body and phase data.
func sealedBody(t *testing.T, b *bundle, scope, key string) (body []byte, data string) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT request_body, phase_data::text FROM idemflow_keys
		WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&body, &data))
	return body, data
}

// TestSealedRequestBody: with a Sealer a key's stored request body is ciphertext and
// its phase data format 2; after a failure mid-flow (the provider down at the call)
// an engine without a Sealer answers ErrNewerFormat to a retry and to Resume, and its
// sweeps take nothing; one with another key answers ErrOpenSealed; none of them
// changes the row. The sealing engine's retry resumes with the opened body (the call
// phase reads the amount from it), and its sweeper does the same for a second key;
// each key has one effect and one payment of the right amount.
func TestSealedRequestBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var down atomic.Bool
	before := func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay && down.Load() {
			return errors.New("provider down")
		}
		return nil
	}
	b := setup(t, setupOpts{before: before}) // b.engine has no Sealer
	sealer := newGCMSealer(t)
	sealing := b.newEngine(t, setupOpts{before: before, cfg: &workflow.Config{Sealer: sealer}})
	const body = `{"amount":4242}`

	down.Store(true)
	for _, key := range []string{"retry", "sweep"} {
		_, err := sealing.Do(ctx, chargeReq("s", key, body))
		require.ErrorIs(t, err, workflow.ErrTransient)
		stored, data := sealedBody(t, b, "s", key)
		require.NotContains(t, string(stored), "4242", "the stored request body is sealed")
		require.NotContains(t, string(stored), "amount")
		opened, err := sealer.Open(ctx, "s", key, stored)
		require.NoError(t, err)
		require.Equal(t, body, string(opened), "and opens to the body")
		require.Contains(t, data, `"idemflow:format": 2`, "marked as phase data format 2")
		require.Equal(t, testflow.Reserve, state(t, b.db, "s", key).RecoveryPoint)
	}
	down.Store(false)
	sweepable(t, b.db)

	before1 := keyRow(t, b.db, "s", "retry")
	_, err := b.engine.Do(ctx, chargeReq("s", "retry", body))
	require.ErrorIs(t, err, workflow.ErrNewerFormat, "no Sealer: retry later")
	_, err = b.engine.Resume(ctx, "s", "retry")
	require.ErrorIs(t, err, workflow.ErrNewerFormat)
	require.Empty(t, sweepOnce(t, b.engine, 1), "a sweep without a Sealer takes no sealed key")
	other := b.newEngine(t, setupOpts{before: before, cfg: &workflow.Config{Sealer: newGCMSealer(t)}})
	_, err = other.Do(ctx, chargeReq("s", "retry", body))
	require.ErrorIs(t, err, workflow.ErrOpenSealed, "another key cannot open it")
	require.NotErrorIs(t, err, workflow.ErrMismatch)
	require.Equal(t, before1, keyRow(t, b.db, "s", "retry"), "no refusal changed the row")
	require.Zero(t, b.provider.Made(), "nothing was paid")

	res, err := sealing.Do(ctx, chargeReq("s", "retry", body))
	require.NoError(t, err, "the sealing engine's retry resumes")
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "s", "retry")

	taken, err := sealing.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 10, Grace: -1})
	require.NoError(t, err)
	require.Len(t, taken, 1)
	run, err := sealing.Maintenance().Run(ctx, taken[0], nil)
	require.NoError(t, err)
	require.Equal(t, workflow.OutcomeFinished, run.Outcome, "the sealing engine's sweeper resumes: %v", run.Err)
	requireOneEffect(t, b, "s", "sweep")

	require.Equal(t, 2, b.provider.Made())
	for _, key := range []string{"retry", "sweep"} {
		stored, data := sealedBody(t, b, "s", key)
		require.Empty(t, stored, "a finished key keeps no request body")
		require.Equal(t, "{}", data)
		row, ok := idemflowtest.LookupKey(t, b.db.Pool, "s", key)
		require.True(t, ok)
		paid, ok := b.provider.Effect(row.ID + ":" + testflow.Pay)
		require.True(t, ok)
		require.JSONEq(t, body, string(paid.Body), "the call ran with the opened body")
	}
}

// TestSealedBodyWrongSealerSweep: a sweeper whose Sealer cannot open a key's body runs
// none of its phases and releases it with ErrOpenSealed as its last error, as a failed
// attempt (dead-lettered after MaxAttempts, visible, re-drivable), never with the
// sealed bytes as a body.
func TestSealedBodyWrongSealerSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var down, ran atomic.Bool
	before := func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay && down.Load() {
			return errors.New("provider down")
		}
		ran.Store(true)
		return nil
	}
	b := setup(t, setupOpts{before: before, cfg: &workflow.Config{Sealer: newGCMSealer(t)}})
	down.Store(true)
	_, err := b.engine.Do(ctx, chargeReq("s", "k", `{"amount":5}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	down.Store(false)
	ran.Store(false)
	sweepable(t, b.db)
	other := b.newEngine(t, setupOpts{before: before, cfg: &workflow.Config{Sealer: newGCMSealer(t)}})
	require.Equal(t, []workflow.Outcome{workflow.OutcomeReleased}, sweepOnce(t, other, 5))
	require.False(t, ran.Load(), "no phase ran")
	row, ok := idemflowtest.LookupKey(t, b.db.Pool, "s", "k")
	require.True(t, ok)
	require.Contains(t, row.LastError, workflow.ErrOpenSealed.Error())
	require.Equal(t, testflow.Reserve, row.RecoveryPoint)
	require.Zero(t, b.provider.Made())
}

// TestSealedCrashMatrix kills a real child process (SIGKILL) at every boundary of the
// flow with a Sealer on every engine, and recovers each key by a retry, a sweeper, and
// a sweeper after a killed sweeper: the resumptions open the sealed body (the call
// phase reads the amount from it), with one effect and one payment per key.
func TestSealedCrashMatrix(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, testflow.Schema)
	provider := idemflowtest.NewRemote(t, nil)
	const body = `{"amount":313}`
	cases := 0
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    testflow.Flow(testflow.Options{ProviderURL: provider.URL}),
		Request: chargeReq("acct", "sealed", body),
		Config:  &workflow.Config{Sealer: testflow.NewSealer(0x5e)}, // the same key in the children
		Check: func(t testing.TB, c *idemflowtest.Case) {
			cases++
			e, err := testflow.CountEffects(context.Background(), c.DB.Pool, c.Request.Scope, c.Request.Key)
			require.NoError(t, err)
			require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, e)
			require.Equal(t, http.StatusCreated, c.Answer.Status)
			var ans testflow.Answer
			require.NoError(t, json.Unmarshal(c.Answer.Body, &ans))
			require.EqualValues(t, 313, ans.Amount)
			paid, ok := provider.Effect(c.DerivedKey(testflow.Pay))
			require.True(t, ok)
			require.Equal(t, paid.ID, ans.PaymentID, "the answer names the one provider payment")
			require.JSONEq(t, body, string(paid.Body), "the call ran with the opened body")
		},
	})
	require.Equal(t, len(idemflowtest.Boundaries(testflow.Flow(testflow.Options{})))*3, cases)
	require.Equal(t, cases, provider.Made(), "one provider payment per key")
}

// TestSealedCancelAndInspect: an engine without a Sealer shows a sealed request body
// and a sealed answer as their sizes, never their bytes, and still acts on the key
// (operator actions open nothing); CancelKey on a sealing engine stores its answer
// sealed like any other, replayed by the sealing engine and refused (ErrNewerFormat)
// by one without a Sealer.
func TestSealedCancelAndInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var down atomic.Bool
	before := func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay && down.Load() {
			return errors.New("provider down")
		}
		return nil
	}
	b := setup(t, setupOpts{before: before}) // b.engine has no Sealer
	sealing := b.newEngine(t, setupOpts{before: before, cfg: &workflow.Config{Sealer: newGCMSealer(t)}})
	down.Store(true)
	_, err := sealing.Do(ctx, chargeReq("s", "k", `{"amount":77}`))
	require.ErrorIs(t, err, workflow.ErrTransient)

	stored, _ := sealedBody(t, b, "s", "k")
	info, err := b.engine.InspectKey(ctx, "s", "k")
	require.NoError(t, err)
	require.True(t, info.RequestSealed)
	require.Equal(t, len(stored), info.RequestSealedBytes)
	require.Nil(t, info.Request, "the sealed bytes are not shown as a body")
	require.NoError(t, b.engine.ReleaseKey(ctx, "s", "k"), "an operator action needs no Sealer")
	bulk, err := b.engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRelease, Scope: "s"})
	require.NoError(t, err)
	require.Equal(t, workflow.BulkResult{Matched: 1, Acted: 1}, bulk, "nor does a bulk one")

	const answer = `{"cancelled":"by operator"}`
	require.NoError(t, sealing.CancelKey(ctx, "s", "k", workflow.CancelOptions{Status: 409, Force: true,
		Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(answer)}))
	var body []byte
	var headers string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT response_body, response_headers::text FROM idemflow_keys
		WHERE scope = 's' AND idempotency_key = 'k'`).Scan(&body, &headers))
	require.NotContains(t, string(body), "operator", "the cancel's answer is sealed")
	require.Contains(t, headers, `"idemflow:format": 2`)
	res, err := sealing.Do(ctx, chargeReq("s", "k", `{"amount":77}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 409, res.Response.Status)
	require.Equal(t, answer, string(res.Response.Body))
	_, err = b.engine.Do(ctx, chargeReq("s", "k", `{"amount":77}`))
	require.ErrorIs(t, err, workflow.ErrNewerFormat)

	info, err = b.engine.InspectKey(ctx, "s", "k")
	require.NoError(t, err)
	require.False(t, info.RequestSealed, "a finished key keeps no body")
	require.True(t, info.ResponseSealed)
	require.Equal(t, len(body), info.ResponseSealedBytes)
	require.Nil(t, info.ResponseBody)
	require.Equal(t, map[string][]string{"Content-Type": {"application/json"}}, info.ResponseHeader, "headers are not sealed")
	require.Zero(t, b.provider.Made())
}

// redactor is a Sealer that redacts: the member "card" of a JSON object is replaced,
// and Open returns what was stored.
type redactor struct{}

func (redactor) Seal(_ context.Context, _, _ string, plain []byte) ([]byte, error) {
	var m map[string]any
	if json.Unmarshal(plain, &m) != nil || m["card"] == nil {
		return plain, nil
	}
	m["card"] = "redacted"
	return json.Marshal(m)
}

func (redactor) Open(_ context.Context, _, _ string, sealed []byte) ([]byte, error) {
	return sealed, nil
}

// TestSealerRedacts: with a Sealer that redacts, the key table never holds the card;
// the claiming attempt runs with the body as sent, a resumption (here a sweep) runs
// the phases left with the redacted body, and replays send the redacted answer while
// the first attempt's client got the answer as the phase gave it.
func TestSealerRedacts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{cfg: &workflow.Config{Sealer: redactor{}}})
	var mu sync.Mutex
	var seen []string
	failB := true
	phase := func(name string) phases.Phase {
		return phases.Tx(name, func(_ context.Context, _ phases.DBTX, run *phases.Run) (*phases.Response, error) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, name+" "+string(run.Body()))
			switch {
			case name == "a":
				return nil, nil
			case failB:
				return nil, errors.New("b fails")
			}
			return &phases.Response{Status: 201, Body: run.Body()}, nil
		})
	}
	require.NoError(t, b.engine.Register(phases.Flow{Name: "redact", Phases: []phases.Phase{phase("a"), phase("b")}}))
	req := workflow.Request{Scope: "s", Key: "k", Flow: "redact", Method: "POST", Route: "/p", Body: []byte(`{"card":"4111111111111111"}`)}
	_, err := b.engine.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	stored, _ := sealedBody(t, b, "s", "k")
	require.JSONEq(t, `{"card":"redacted"}`, string(stored))

	mu.Lock()
	failB = false
	mu.Unlock()
	sweepable(t, b.db)
	require.Equal(t, []workflow.Outcome{workflow.OutcomeFinished}, sweepOnce(t, b.engine, 5))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{`a {"card":"4111111111111111"}`, `b {"card":"4111111111111111"}`, `b {"card":"redacted"}`}, seen)
	res, err := b.engine.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.JSONEq(t, `{"card":"redacted"}`, string(res.Response.Body))
}
