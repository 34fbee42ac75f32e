package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestClientOnlyFlow checks that a client-only flow runs only the phases its
// attempts bring, and that nothing runs it without them.
func TestClientOnlyFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	shape := phases.Flow{Name: "client", ClientOnly: true, Phases: []phases.Phase{phases.Call("work", nil)}}
	require.NoError(t, e.Register(shape))
	got, ok := e.Flow("client")
	require.True(t, ok)
	require.True(t, got.ClientOnly)
	_, ok = e.Flow("nope")
	require.False(t, ok)

	withFunc := phases.Flow{Name: "client2", ClientOnly: true, Phases: []phases.Phase{
		phases.Call("work", func(context.Context, *phases.Run) (*phases.Response, error) { return nil, nil }),
	}}
	require.ErrorIs(t, e.Register(withFunc), phases.ErrInvalidFlow, "the functions come with the attempts")

	var runs int
	fail := true
	work := phases.Call("work", func(_ context.Context, run *phases.Run) (*phases.Response, error) {
		runs++
		if fail {
			return nil, phases.RetryLater(nil, 0)
		}
		return phases.JSON(201, map[string]string{"key": run.Key()})
	})
	req := workflow.Request{Scope: "acct", Key: "k", Flow: "client", Method: "POST", Route: "/c", Body: []byte(`{}`)}

	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrNeedsClient, "an attempt without its phases")
	bad := req
	bad.ClientPhases = []phases.Phase{phases.Tx("work", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil })}
	_, err = e.Do(ctx, bad)
	require.ErrorIs(t, err, workflow.ErrInvalidRequest, "phases of another kind")
	bad.ClientPhases = []phases.Phase{work, phases.Call("more", nil)}
	_, err = e.Do(ctx, bad)
	require.ErrorIs(t, err, workflow.ErrInvalidRequest, "more phases than the flow has")
	require.Zero(t, countKeys(t, db))

	req.ClientPhases = []phases.Phase{work}
	_, err = e.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Equal(t, 1, runs)

	before := keyRow(t, db, "acct", "k")
	_, err = e.Resume(ctx, "acct", "k")
	require.ErrorIs(t, err, workflow.ErrNeedsClient, "Resume has no client")
	require.Equal(t, before, keyRow(t, db, "acct", "k"), "and changes nothing")
	require.Equal(t, 1, runs)

	fail = false
	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 2, runs, "the client's retry runs its own phase")

	res, err = e.Resume(ctx, "acct", "k")
	require.NoError(t, err, "a finished key replays, client or not")
	require.True(t, res.Replayed)

	t.Run("NotClientOnly", func(t *testing.T) {
		t.Parallel()
		e, err := workflow.New(db.Pool, nil)
		require.NoError(t, err)
		require.NoError(t, e.Register(testflow.Flow(testflow.Options{ProviderURL: "http://127.0.0.1:1"})))
		r := chargeReq("acct2", "k", `{"amount":1}`)
		r.ClientPhases = []phases.Phase{work}
		_, err = e.Do(ctx, r)
		require.ErrorIs(t, err, workflow.ErrInvalidRequest, "a registered flow runs its own phases")
		require.Equal(t, "", keyRow(t, db, "acct2", "k"))
	})
}
