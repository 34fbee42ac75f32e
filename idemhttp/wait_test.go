package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// waitServer serves the test flow with Config.Wait set to wait, its owner's call
// phase held by h, and reports each request that starts to wait on waiting.
func waitServer(t *testing.T, wait time.Duration, h *testflow.Holder) (*httptest.Server, chan struct{}) {
	t.Helper()
	waiting := make(chan struct{}, 10)
	b := setup(t, setupOpts{before: h.Before, cfg: &workflow.Config{Hooks: workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
		if ev.Kind == workflow.OutcomeWaiting {
			waiting <- struct{}{}
		}
	}}}})
	handler, err := idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{Scope: bearerScope, Wait: wait})
	require.NoError(t, err)
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv, waiting
}

// TestHandlerWaitsForTheOwner: with Config.Wait, an overlapping request gets the first
// one's answer, replayed, where without it it gets 409: a client that treats 409 as
// final still gets its answer.
func TestHandlerWaitsForTheOwner(t *testing.T) {
	t.Parallel()
	h := testflow.NewHolder("k1")
	srv, waiting := waitServer(t, time.Minute, h)
	first := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), srv, http.MethodPost, "/charges", keyed("acct", "k1"), `{"amount":900}`)
		first <- r
	}()
	<-h.Entered
	second := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), srv, http.MethodPost, "/charges", keyed("acct", "k1"), `{"amount":900}`)
		second <- r
	}()
	<-waiting
	h.Let()
	a, b := <-first, <-second
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	require.False(t, a.replayed())
	require.Equal(t, http.StatusCreated, b.status, "%s", b.body)
	require.True(t, b.replayed())
	require.Equal(t, a.body, b.body)
}

// TestHandlerWaitBoundPasses: an owner that does not finish within Config.Wait leaves
// the waiting request with 409 and Retry-After, as without a wait.
func TestHandlerWaitBoundPasses(t *testing.T) {
	t.Parallel()
	h := testflow.NewHolder("k1")
	srv, waiting := waitServer(t, 20*time.Millisecond, h)
	first := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), srv, http.MethodPost, "/charges", keyed("acct", "k1"), `{"amount":900}`)
		first <- r
	}()
	<-h.Entered
	r := mustSend(t, srv, http.MethodPost, "/charges", keyed("acct", "k1"), `{"amount":900}`)
	require.Equal(t, http.StatusConflict, r.status)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Len(t, waiting, 1, "the request waited before its 409")
	h.Let()
	require.Equal(t, http.StatusCreated, (<-first).status)
}

func TestConfigWaitBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, bad := range []time.Duration{-time.Second, idemhttp.WaitMax + time.Second} {
		_, err := idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{Scope: bearerScope, Wait: bad})
		require.ErrorContains(t, err, "Config.Wait")
	}
}

// TestMiddlewareWaitsForTheOwner: the middleware's requests wait as the handler's do:
// the overlapping request gets the first one's answer, and the wrapped handler runs
// once.
func TestMiddlewareWaitsForTheOwner(t *testing.T) {
	t.Parallel()
	waiting := make(chan struct{}, 10)
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{Key: func(_ context.Context, ev workflow.KeyEvent) {
		if ev.Kind == workflow.OutcomeWaiting {
			waiting <- struct{}{}
		}
	}}}})
	mw, err := idemhttp.Middleware(b.engine, &idemhttp.Config{Scope: bearerScope, Wait: time.Minute})
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"order_1"}`))
	})))
	t.Cleanup(srv.Close)
	first := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), srv, http.MethodPost, "/orders", keyed("acct", "m1"), `{"n":1}`)
		first <- r
	}()
	<-entered
	second := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), srv, http.MethodPost, "/orders", keyed("acct", "m1"), `{"n":1}`)
		second <- r
	}()
	<-waiting
	close(release)
	a, r := <-first, <-second
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.True(t, r.replayed())
	require.Equal(t, a.body, r.body)
	require.EqualValues(t, 1, runs.Load(), "the handler ran once")
}
