package idemhttp_test

import (
	"bytes"
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// TestMiddlewareUnstorableAnswerIsFinal checks that a handler whose answer cannot be
// stored after it ran (a body over the limit, a panic after writing) is never run
// again: the key is dead-lettered and every attempt, the first included, gets the same
// answer.
func TestMiddlewareUnstorableAnswerIsFinal(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e, err := workflow.New(b.db.Pool, &workflow.Config{MaxResponseBytes: 16})
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		handler func(w http.ResponseWriter)
		lastErr string
	}{
		{"ResponseTooLarge", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(bytes.Repeat([]byte("x"), 20))
		}, "too large"},
		{"PanicAfterWrite", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("xxxx"))
			panic("boom")
		}, "panicked"},
		{"PanicAfterWriteHeader", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusAccepted)
			panic("boom")
		}, "panicked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			srv := middlewareServer(t, e, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1) // the effect
				tc.handler(w)
			}))
			acct := "acct_" + tc.name

			first := mustSend(t, srv, "POST", "/v1/things/x", keyed(acct, "k"), `{}`)
			require.GreaterOrEqual(t, first.status, 400, "%s", first.body)
			require.NotEqual(t, http.StatusServiceUnavailable, first.status, "not an invitation to retry")
			requireProblem(t, first, first.status)
			require.NotContains(t, string(first.body), "xxxx", "never truncated")
			require.NotContains(t, string(first.body), "boom")
			require.Empty(t, first.header.Get("Retry-After"))

			st := state(t, b.db, acct, "k")
			require.Equal(t, "dead", st.Status, "the key is dead-lettered, not released")
			require.False(t, st.HasLease)
			require.NotNil(t, st.LastError)
			require.Contains(t, *st.LastError, tc.lastErr)
			require.Contains(t, *st.LastError, "the handler ran")

			for range 2 {
				retry := mustSend(t, srv, "POST", "/v1/things/x", keyed(acct, "k"), `{}`)
				require.Equal(t, first.status, retry.status, "%s", retry.body)
				require.Equal(t, first.body, retry.body, "every attempt gets the first attempt's answer")
				require.Empty(t, retry.header.Get("Retry-After"))
			}
			require.EqualValues(t, 1, runs.Load(), "the handler never runs twice")
			require.Equal(t, st, state(t, b.db, acct, "k"), "retries change nothing")

			_, err := e.Resume(context.Background(), acct, "k")
			require.ErrorIs(t, err, workflow.ErrDeadLettered)
		})
	}
}
