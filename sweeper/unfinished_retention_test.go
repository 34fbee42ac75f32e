package sweeper_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// age sets a key's claim and last change to interval ago, by the database clock.
func age(t *testing.T, b *bundle, key, interval string) {
	t.Helper()
	tag, err := b.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys
		SET created_at = statement_timestamp() - $2::interval, updated_at = statement_timestamp() - $2::interval
		WHERE scope = 'acct' AND idempotency_key = $1`, key, interval)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func listed(t *testing.T, b *bundle, status workflow.KeyStatus) []string {
	t.Helper()
	p, err := b.engine.ListKeys(context.Background(), workflow.ListOptions{Status: status})
	require.NoError(t, err)
	var out []string
	for _, k := range p.Keys {
		out = append(out, k.Key)
	}
	return out
}

// TestDeadRetention: a dead-lettered key is listed until DeadRetention has passed since
// it was dead-lettered, then deleted by a pass; -1 keeps it forever; a re-driven key is
// in progress and never deleted by it.
func TestDeadRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for _, k := range []string{"old", "young", "redriven"} {
		b.stuck(t, chargeReq(k), testflow.Pay)
	}
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET status = 'dead', locked_until = NULL`)
	require.NoError(t, err)
	age(t, b, "old", "91 days")
	age(t, b, "redriven", "91 days")
	require.NoError(t, b.engine.Redrive(ctx, "acct", "redriven"))
	age(t, b, "redriven", "91 days")
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() + interval '1 hour' WHERE idempotency_key = 'redriven'`)
	require.NoError(t, err)
	age(t, b, "young", "89 days")
	require.ElementsMatch(t, []string{"old", "young"}, listed(t, b, workflow.KeysDead), "visible until their end")

	forever := b.newSweeper(t, &sweeper.Config{DeadRetention: -1})
	st, err := forever.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{}, st)
	require.Len(t, listed(t, b, workflow.KeysDead), 2, "-1 keeps them")

	st, err = b.newSweeper(t, nil).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{ExpiredDead: 1}, st, "the default is 90 days")
	require.Equal(t, []string{"young"}, listed(t, b, workflow.KeysDead))
	require.Equal(t, "", keyRow(t, b.db, "old"))
	require.NotEqual(t, "", keyRow(t, b.db, "redriven"), "in progress again: not a dead key")

	_, err = b.engine.Sweep(ctx, &sweeper.Config{DeadRetention: 59e9})
	require.Error(t, err, "under a minute")
}

// TestParkedRetention: a key of a client-only flow that its client never finished is
// parked by sweeps and deleted ParkedRetention after its claim; keys of other flows
// in progress are never deleted by it.
func TestParkedRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	mw, err := idemhttp.Middleware(b.engine, &idemhttp.Config{
		Scope: func(*http.Request) (string, error) { return "acct", nil },
		Route: func(*http.Request) string { return "/plain" },
	})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	for _, k := range []string{"parked", "recent"} {
		req := httptest.NewRequest(http.MethodPost, "/plain", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", k)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		_, _ = io.Copy(io.Discard, rec.Result().Body)
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	}
	b.stuck(t, chargeReq("server-side"), testflow.Pay)
	// Its backoff held an hour ahead by the database clock: the sweeps below must not
	// take it, however long a busy machine makes the test (its own backoff is short).
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() + interval '1 hour'
		WHERE scope = 'acct' AND idempotency_key = 'server-side'`)
	require.NoError(t, err)
	makeDue(t, b.db, "parked")
	makeDue(t, b.db, "recent")
	s := b.newSweeper(t, &sweeper.Config{ParkedRetention: 48 * 60 * 60e9})
	st, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Parked)
	require.Zero(t, st.ExpiredParked)
	age(t, b, "parked", "48 hours")
	age(t, b, "recent", "46 hours") // makeDue moved its claim an hour back already
	age(t, b, "server-side", "1000 hours")
	require.ElementsMatch(t, []string{"parked", "recent", "server-side"}, listed(t, b, workflow.KeysInProgress), "visible until their end")

	st, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{ExpiredParked: 1}, st)
	require.Equal(t, "", keyRow(t, b.db, "parked"))
	require.ElementsMatch(t, []string{"recent", "server-side"}, listed(t, b, workflow.KeysInProgress))
}
