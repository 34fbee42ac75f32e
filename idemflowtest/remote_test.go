package idemflowtest_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
)

func TestRemote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DedupesConcurrentRequests", func(t *testing.T) {
		t.Parallel()
		r := idemflowtest.NewRemote(t, nil)
		ids := make([]string, 16)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				var err error
				ids[i], err = pay(ctx, r.URL+"/pay", "same", "ref")
				require.NoError(t, err)
			})
		}
		wg.Wait()
		for _, id := range ids {
			require.Equal(t, "pay_000001", id)
		}
		other, err := pay(ctx, r.URL+"/pay", "other", "ref")
		require.NoError(t, err)
		require.Equal(t, "pay_000002", other)
		require.Equal(t, 2, r.Made())
		require.Equal(t, 16, r.Requests("same"))
		e, ok := r.Effect("same")
		require.True(t, ok)
		require.Equal(t, "/pay", e.Path)
		require.JSONEq(t, `{"ref":"ref"}`, string(e.Body))
	})

	t.Run("FailuresAndDeclines", func(t *testing.T) {
		t.Parallel()
		r := idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{Decline: func(path string, body []byte) bool {
			return strings.Contains(string(body), "no-funds")
		}})
		r.FailNext(2)
		for range 2 {
			_, err := pay(ctx, r.URL+"/pay", "k", "ref")
			require.ErrorContains(t, err, "503")
		}
		require.Zero(t, r.Armed())
		id, err := pay(ctx, r.URL+"/pay", "k", "ref")
		require.NoError(t, err, "a failure did nothing: the same key succeeds")
		require.Equal(t, "pay_000001", id)
		_, err = pay(ctx, r.URL+"/pay", "d", "no-funds")
		require.ErrorContains(t, err, "402")
		_, err = pay(ctx, r.URL+"/pay", "d", "no-funds")
		require.ErrorContains(t, err, "402", "a decline is remembered for the key")
		require.Equal(t, 1, r.Made())
		require.Len(t, r.Effects(), 2)
		total, failed := r.Total()
		require.Equal(t, 5, total)
		require.Equal(t, 2, failed)

		always := idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{FailRate: 1})
		_, err = pay(ctx, always.URL+"/pay", "k", "ref")
		require.ErrorContains(t, err, "503")
		require.Zero(t, always.Made())
	})

	t.Run("NeedsAKey", func(t *testing.T) {
		t.Parallel()
		r := idemflowtest.NewRemote(t, nil)
		resp, err := http.Post(r.URL+"/pay", "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Zero(t, r.Made())
	})
}
