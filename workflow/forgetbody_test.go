package workflow_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// TestForgetBody: a flow that forgets the body stores an empty request body from the
// claim on, while its keys of another flow keep theirs; the claiming attempt's phases
// see the body, a retry's resume sees the body it carries, a retry with another body
// is a mismatch, and a sweeper's resume sees an empty body and finishes the key.
func TestForgetBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var mu sync.Mutex
	seen := map[string][]string{} // key/phase -> bodies seen, in order
	failB := true
	phase := func(name string) phases.Phase {
		return phases.Tx(name, func(_ context.Context, _ phases.DBTX, run *phases.Run) (*phases.Response, error) {
			mu.Lock()
			defer mu.Unlock()
			seen[run.Key()+"/"+name] = append(seen[run.Key()+"/"+name], string(run.Body()))
			if name == "b" && failB {
				return nil, fmt.Errorf("b fails")
			}
			if name == "b" {
				return &phases.Response{Status: 201, Body: []byte(`{"ok":true}`)}, nil
			}
			return nil, nil
		})
	}
	for _, f := range []phases.Flow{
		{Name: "forget", ForgetBody: true, Phases: []phases.Phase{phase("a"), phase("b")}},
		{Name: "keep", Phases: []phases.Phase{phase("a"), phase("b")}},
	} {
		require.NoError(t, b.engine.Register(f))
	}
	body := `{"card_token":"tok_1","amount":7}`
	req := func(flow, key, body string) workflow.Request {
		return workflow.Request{Scope: "s", Key: key, Flow: flow, Method: "POST", Route: "/p", Body: []byte(body)}
	}
	stored := func(key string) string {
		var v []byte
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT request_body FROM idemflow_keys WHERE scope = 's' AND idempotency_key = $1`, key).Scan(&v))
		return string(v)
	}

	_, err := b.engine.Do(ctx, req("keep", "k0", body))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Equal(t, body, stored("k0"), "without the option the body is stored")

	_, err = b.engine.Do(ctx, req("forget", "k1", body))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Empty(t, stored("k1"), "only the fingerprint is kept")
	require.Equal(t, []string{body}, seen["k1/a"], "the claiming attempt runs with the body")
	require.Equal(t, []string{body}, seen["k1/b"])

	_, err = b.engine.Do(ctx, req("forget", "k1", `{"card_token":"tok_2","amount":7}`))
	require.ErrorIs(t, err, workflow.ErrMismatch, "the fingerprint still tells another body")

	_, err = b.engine.Do(ctx, req("forget", "k1", body))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.Equal(t, []string{body, body}, seen["k1/b"], "a retry resumes with the body it carries")
	require.Empty(t, stored("k1"), "and stores it no more than the claim")

	failB = false
	sweepable(t, b.db)
	require.Contains(t, sweepOnce(t, b.engine, 5), workflow.OutcomeFinished)
	require.Equal(t, []string{body, body, ""}, seen["k1/b"], "a sweeper resumes with an empty body")
	res, err := b.engine.Do(ctx, req("forget", "k1", body))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, `{"ok":true}`, string(res.Response.Body))
}
