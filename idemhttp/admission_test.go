package idemhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
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

// A draining engine refuses every attempt before its claim: the handler and both
// middlewares answer 503 with Retry-After and the problem document without reading the
// request's body, and the attempt is reported as ever (the hooks see it shed). A body of
// unknown length is read as before (it could be over the limit), and one declared over
// the limit is still answered 413.
func TestHandlerDrainingRefusesWithoutReadingBody(t *testing.T) {
	t.Parallel()
	var shed atomic.Int64
	b := setup(t, setupOpts{cfg: &workflow.Config{Hooks: workflow.Hooks{AttemptEnd: func(_ context.Context, ev workflow.AttemptEvent) {
		if ev.Outcome == workflow.OutcomeShed && errors.Is(ev.Err, workflow.ErrDraining) {
			shed.Add(1)
		}
	}}}})
	cfg := &idemhttp.Config{Scope: bearerScope, MaxBodyBytes: 64}
	flow, err := idemhttp.Handler(b.engine, testflow.Name, cfg)
	require.NoError(t, err)
	mw, err := idemhttp.Middleware(b.engine, cfg)
	require.NoError(t, err)
	txmw, err := idemhttp.TxMiddleware(b.engine, cfg)
	require.NoError(t, err)
	var ran atomic.Int64
	plain := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ran.Add(1); w.WriteHeader(http.StatusCreated) })
	require.False(t, b.engine.Draining())
	require.NoError(t, b.engine.Drain(context.Background()))
	require.True(t, b.engine.Draining())

	var h http.Handler
	send := func(body string, length int64) (*httptest.ResponseRecorder, *atomic.Int64) {
		read := &atomic.Int64{}
		req := httptest.NewRequest(http.MethodPost, "/charges", nil)
		req.Body, req.ContentLength = countingBody{r: strings.NewReader(body), read: read}, length
		req.Header.Set("Authorization", "Bearer acct")
		req.Header.Set(idemhttp.KeyHeader, "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec, read
	}
	refused := func(rec *httptest.ResponseRecorder) {
		t.Helper()
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Equal(t, "1", rec.Header().Get("Retry-After"))
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
		require.NotEmpty(t, rec.Header().Get(idemhttp.RetentionHeader))
		require.JSONEq(t, `{"type":"about:blank","title":"Service Unavailable","status":503,
			"detail":"The service is busy or restarting; nothing was done: retry after 1 s with the same key."}`, rec.Body.String())
	}

	for i, name := range []string{"Handler", "Middleware", "TxMiddleware"} {
		h = map[string]http.Handler{"Handler": flow, "Middleware": mw(plain), "TxMiddleware": txmw(plain)}[name]
		n := int64(2 * i)
		rec, read := send(`{"amount":5}`, int64(len(`{"amount":5}`)))
		refused(rec)
		require.Zero(t, read.Load(), "%s: the refused request's body was read", name)
		require.Equal(t, n+1, shed.Load(), "%s: the refusal was not reported to the hooks", name)

		rec, read = send(`{"amount":5}`, -1) // length unknown: read, as before
		refused(rec)
		require.NotZero(t, read.Load(), name)
		require.Equal(t, n+2, shed.Load(), name)

		rec, _ = send(`{"amount":5}`, 65) // declared over the limit: 413, as before
		require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, name)
		require.Equal(t, n+2, shed.Load(), name)
	}
	require.Zero(t, ran.Load(), "a wrapped handler ran")
	require.Equal(t, 0, countKeys(t, b.db))
}

// notifyBody tells, on its first Read, that the handler began reading the body of the
// request under key.
type notifyBody struct {
	io.ReadCloser
	key     string
	reading chan<- string
	once    sync.Once
}

func (b *notifyBody) Read(p []byte) (int, error) {
	b.once.Do(func() { b.reading <- b.key })
	return b.ReadCloser.Read(p)
}

// An overloaded engine refuses an attempt before its body is read: the body of
// declared length is read only once the engine admits the attempt, holding its place
// while the body comes. With MaxInFlight 1 taken by a request whose body has not come
// yet, the handler and both middlewares answer 503 with Retry-After without reading the
// body (one of unknown length is read first, as before), the hooks see the refusal, and
// nothing is written; the held request, once its body comes, is answered as ever
// (201, one effect). A client that goes away while its body is awaited gives its place
// back: the next request is admitted and runs.
func TestHandlerOverloadRefusesBeforeReadingBody(t *testing.T) {
	t.Parallel()
	var overloaded atomic.Int64
	b := setup(t, setupOpts{cfg: &workflow.Config{MaxInFlight: 1, AdmitWait: 100 * time.Millisecond,
		Hooks: workflow.Hooks{AttemptEnd: func(_ context.Context, ev workflow.AttemptEvent) {
			if ev.Outcome == workflow.OutcomeShed && errors.Is(ev.Err, workflow.ErrOverloaded) {
				overloaded.Add(1)
			}
		}}}})
	cfg := &idemhttp.Config{Scope: bearerScope, MaxBodyBytes: 64}
	flow, err := idemhttp.Handler(b.engine, testflow.Name, cfg)
	require.NoError(t, err)
	mw, err := idemhttp.Middleware(b.engine, cfg)
	require.NoError(t, err)
	txmw, err := idemhttp.TxMiddleware(b.engine, cfg)
	require.NoError(t, err)
	var ran atomic.Int64
	plain := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ran.Add(1); w.WriteHeader(http.StatusCreated) })

	reading := make(chan string, 2)
	goneDone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.KeyHeader)
		r.Body = &notifyBody{ReadCloser: r.Body, key: key, reading: reading}
		flow.ServeHTTP(w, r)
		if key == "gone" {
			close(goneDone)
		}
	}))
	t.Cleanup(srv.Close)
	const body = `{"amount":5}`
	// hold sends a charge under key without its body: the handler is admitted and
	// waits for the body, holding the engine's only place.
	hold := func(key string) net.Conn {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		_, err = fmt.Fprintf(conn, "POST /charges HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer acct\r\n"+
			"Idempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", key, len(body))
		require.NoError(t, err)
		require.Equal(t, key, <-reading)
		return conn
	}
	held := hold("held")
	t.Cleanup(func() { held.Close() })

	send := func(h http.Handler, length int64) (*httptest.ResponseRecorder, int64) {
		read := &atomic.Int64{}
		req := httptest.NewRequest(http.MethodPost, "/charges", nil)
		req.Body, req.ContentLength = countingBody{r: strings.NewReader(body), read: read}, length
		req.Header.Set("Authorization", "Bearer acct")
		req.Header.Set(idemhttp.KeyHeader, "k2")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec, read.Load()
	}
	for i, name := range []string{"Handler", "Middleware", "TxMiddleware"} {
		h := map[string]http.Handler{"Handler": flow, "Middleware": mw(plain), "TxMiddleware": txmw(plain)}[name]
		rec, read := send(h, int64(len(body)))
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, name)
		require.Equal(t, "1", rec.Header().Get("Retry-After"), name)
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"), name)
		require.Zero(t, read, "%s: the refused request's body was read", name)
		require.Equal(t, int64(2*i+1), overloaded.Load(), "%s: the refusal was not reported to the hooks", name)

		rec, read = send(h, -1) // length unknown: read first, as before, then refused
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, name)
		require.NotZero(t, read, name)
		require.Equal(t, int64(2*i+2), overloaded.Load(), name)
	}
	require.Zero(t, ran.Load(), "a wrapped handler ran")
	require.Equal(t, 0, countKeys(t, b.db), "a refused request wrote a key")

	// The held request's body comes: it runs as ever.
	_, err = io.WriteString(held, body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(held), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	requireOneEffect(t, b, "acct", "held")

	// A client gone while its body is awaited gives its place back.
	gone := hold("gone")
	require.NoError(t, gone.Close())
	<-goneDone
	resp, err = srv.Client().Do(keyedPost(context.Background(), t, srv.URL, "after"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the place of a client gone while its body was awaited was not given back")
	require.Equal(t, 2, countKeys(t, b.db), "keys other than held and after")
	requireOneEffect(t, b, "acct", "after")
}
