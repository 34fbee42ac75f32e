package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// keyedPost is a charge request under key for account acct.
func keyedPost(ctx context.Context, t *testing.T, url, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/charges", strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct")
	req.Header.Set(idemhttp.KeyHeader, key)
	return req
}

// served wraps h so that done is closed once it has answered a request.
func served(h http.Handler, done chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		h.ServeHTTP(w, r)
	})
}

// A client that goes away while the key's first transaction runs leaves nothing
// behind: the handler honours its cancellation until the claim.
func TestHandlerClientGoneBeforeClaim(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	b := setup(t, setupOpts{before: func(ctx context.Context, _ phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Reserve {
			close(entered)
			select { // the phase goes on once its context ends, or once the test says so
			case <-ctx.Done():
			case <-release:
			}
		}
		return nil
	}})
	h, err := idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	done := make(chan struct{})
	reqCtx := make(chan context.Context, 1)
	inner := served(h, done)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqCtx <- r.Context()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-entered; cancel() }()
	_, err = srv.Client().Do(keyedPost(ctx, t, srv.URL, "k1"))
	require.ErrorIs(t, err, context.Canceled)
	// The phase is let go only once the server has seen the client leave (the request's
	// context ended): before that, nothing tells the engine the client is gone.
	<-(<-reqCtx).Done()
	close(release)
	<-done
	require.Equal(t, 0, countKeys(t, b.db), "the attempt of a client that went away before the claim wrote its key")
	require.Equal(t, 0, b.provider.Made())
}

// An attempt turned away before its claim (overload) is answered 503 with
// Retry-After at once, and writes nothing.
func TestHandlerShedAnswers503(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: 20 * time.Millisecond},
		before: func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Reserve && run.Key() == "held" {
				entered <- struct{}{}
				<-release
			}
			return nil
		}})
	h, err := idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	held := make(chan int, 1)
	go func() {
		for {
			resp, err := srv.Client().Do(keyedPost(context.Background(), t, srv.URL, "held"))
			if err != nil {
				held <- 0
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable { // a slow first connection is shed too
				held <- resp.StatusCode
				return
			}
		}
	}()
	<-entered
	resp, err := srv.Client().Do(keyedPost(context.Background(), t, srv.URL, "k2"))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	close(release)
	require.Equal(t, http.StatusCreated, <-held)
	require.Equal(t, 1, countKeys(t, b.db))
}
