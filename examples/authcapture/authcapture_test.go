package authcapture_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/authcapture"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

func TestOrderSurvivesCrashes(t *testing.T) {
	db := idemflowtest.NewDB(t, authcapture.Schema)
	provider := idemflowtest.NewRemote(t, nil)
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    authcapture.Flow(provider.URL),
		Request: workflow.Request{Scope: "acct", Key: "order-1", Body: []byte(`{"amount":500}`)},
		Check:   func(t testing.TB, c *idemflowtest.Case) { requirePaidOnce(t, c, provider) },
	})
}

// requirePaidOnce: one order row, paid, authorised and captured once each, under the
// derived keys of the two call phases.
func requirePaidOnce(t testing.TB, c *idemflowtest.Case, provider *idemflowtest.Remote) {
	var rows int
	var status, auth, capture string
	require.NoError(t, c.DB.Pool.QueryRow(context.Background(), `SELECT count(*), max(status), max(auth_id), max(capture_id)
		FROM orders WHERE scope = $1 AND idem_key = $2`, c.Request.Scope, c.Request.Key).Scan(&rows, &status, &auth, &capture))
	require.Equal(t, 1, rows, "order rows")
	require.Equal(t, "paid", status)
	a, ok := provider.Effect(c.DerivedKey("authorize"))
	require.True(t, ok, "authorised under the derived key")
	require.Equal(t, a.ID, auth)
	cp, ok := provider.Effect(c.DerivedKey("capture"))
	require.True(t, ok, "captured under the derived key")
	require.Equal(t, cp.ID, capture)
	require.Contains(t, string(c.Answer.Body), capture)
}

func TestDeclinedAuthorisationIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, authcapture.Schema)
	provider := idemflowtest.NewRemote(t, nil)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(authcapture.Flow(provider.URL)))
	req := workflow.Request{Scope: "acct", Key: "k", Flow: "order", Method: "POST", Route: "/orders", Body: []byte(`{"amount":5}`)}

	provider.FailNext(1)
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Zero(t, provider.Armed(), "the failure fired")
	idemflowtest.RequireInProgressAt(t, db.Pool, "acct", "k", "create")

	idemflowtest.ExpireLease(t, db.Pool, "acct", "k")
	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	idemflowtest.RequireFinished(t, db.Pool, "acct", "k")
	require.Equal(t, 2, provider.Made(), "one authorisation, one capture")
}

// TestControlCharactersWriteNothing: the example has no routes of its own; what a
// client controls is the scope and key its server passes in. One with a C0 or C1
// control character is refused before the flow runs: no order row, no provider call.
func TestControlCharactersWriteNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, authcapture.Schema)
	provider := idemflowtest.NewRemote(t, nil)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(authcapture.Flow(provider.URL)))
	for _, req := range []workflow.Request{
		{Scope: "acct\u009b2J", Key: "k"}, {Scope: "acct\x1b", Key: "k"}, {Scope: "acct\xff", Key: "k"},
		{Scope: "acct", Key: "k\x01"}, {Scope: "acct", Key: "k\u0085"},
	} {
		req.Flow, req.Method, req.Route, req.Body = "order", "POST", "/orders", []byte(`{"amount":5}`)
		_, err := e.Do(ctx, req)
		require.Error(t, err, "%q/%q", req.Scope, req.Key)
		require.True(t, errors.Is(err, workflow.ErrInvalidScope) || errors.Is(err, workflow.ErrInvalidKey), "%v", err)
	}
	var orders, keys int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM idemflow_keys)`).Scan(&orders, &keys))
	require.Zero(t, orders, "no order row")
	require.Zero(t, keys, "no key row")
	require.Zero(t, provider.Made(), "no provider call")
}

// TestInvalidOrderIsAProblem: an invalid order is answered 400 problem+json, stored and
// replayed, and writes no order.
func TestInvalidOrderIsAProblem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, authcapture.Schema)
	provider := idemflowtest.NewRemote(t, nil)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(authcapture.Flow(provider.URL)))
	req := workflow.Request{Scope: "acct", Key: "bad", Flow: "order", Method: "POST", Route: "/orders", Body: []byte(`{"amount":0}`)}
	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 400, res.Response.Status)
	require.Equal(t, "application/problem+json", res.Response.Header.Get("Content-Type"))
	require.JSONEq(t, `{"type":"about:blank","title":"invalid request","status":400,"detail":"amount must be positive"}`, string(res.Response.Body))
	again, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, res.Response.Body, again.Response.Body)
	require.Equal(t, "application/problem+json", again.Response.Header.Get("Content-Type"), "the Content-Type is stored with the answer")
	var orders int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Zero(t, orders)
}
