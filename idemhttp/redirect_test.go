package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemclient"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// redirectFlow is a flow that charges (a ledger row) and answers 303 See Other to the
// charge, as an API that creates a resource and sends its client to read it does.
const redirectFlow = "charge_see_other"

// seeOther inserts the ledger row of a charge of the request's amount and returns the
// 303 to it; an amount that is not positive is a stored 400.
func seeOther(ctx context.Context, tx phases.DBTX, scope, key string, body []byte) (*phases.Response, error) {
	var req struct{ Amount int64 }
	if err := json.Unmarshal(body, &req); err != nil || req.Amount <= 0 {
		return &phases.Response{Status: http.StatusBadRequest, Body: []byte(`{"error":"amount"}`)}, nil
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO ledger (scope, idem_key, amount) VALUES ($1, $2, $3) RETURNING id`, scope, key, req.Amount).Scan(&id)
	if err != nil {
		return nil, err
	}
	return &phases.Response{Status: http.StatusSeeOther, Header: http.Header{"Location": {"/charges/" + strconv.FormatInt(id, 10)}}}, nil
}

// seen records every answer the server wrote, to show that none was a 422.
type seen struct {
	mu  sync.Mutex
	got []string
}

func (s *seen) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.got = append(s.got, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, rec.status))
	})
}

func (s *seen) answers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap is for http.ResponseController (the middlewares' deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// redirectServer serves, over the bundle's engine:
//   - POST /charges: the redirect flow under idemhttp.Handler;
//   - POST /tx/charges: the same charge under TxMiddleware;
//   - POST /v1/charges and /v1/tx/charges: 308 Permanent Redirect to the two above,
//     answered outside the keyed layer (a moved route);
//   - GET /charges/{id}: the charge, under Middleware with RequireKey, as a service
//     that wraps every route does.
func redirectServer(t *testing.T, b *bundle) (*httptest.Server, *seen) {
	t.Helper()
	require.NoError(t, b.engine.Register(phases.Flow{Name: redirectFlow, Phases: []phases.Phase{
		phases.Tx("charge", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return seeOther(ctx, tx, run.Scope(), run.Key(), run.Body())
		}),
	}}))
	cfg := &idemhttp.Config{Scope: bearerScope, RequireKey: true}
	flow, err := idemhttp.Handler(b.engine, redirectFlow, cfg)
	require.NoError(t, err)
	txmw, err := idemhttp.TxMiddleware(b.engine, cfg)
	require.NoError(t, err)
	mw, err := idemhttp.Middleware(b.engine, cfg)
	require.NoError(t, err)

	mux := http.NewServeMux()
	mux.Handle("POST /charges", flow)
	mux.Handle("POST /tx/charges", txmw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, _ := bearerScope(r)
		body, _ := io.ReadAll(r.Body)
		resp, err := seeOther(r.Context(), idemhttp.TxFromContext(r.Context()), scope, r.Header.Get(idemhttp.KeyHeader), body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", resp.Header.Get("Location"))
		w.WriteHeader(resp.Status)
	})))
	mux.Handle("POST /v1/charges", http.RedirectHandler("/charges", http.StatusPermanentRedirect))
	mux.Handle("POST /v1/tx/charges", http.RedirectHandler("/tx/charges", http.StatusTemporaryRedirect))
	mux.Handle("GET /charges/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, _ := bearerScope(r)
		var amount int64
		err := b.db.Pool.QueryRow(r.Context(), `SELECT amount FROM ledger WHERE id = $1 AND scope = $2`, r.PathValue("id"), scope).Scan(&amount)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%s,"amount":%d}`, r.PathValue("id"), amount)
	})))
	s := &seen{}
	return newServer(t, s.wrap(mux)), s
}

// ledgerRows counts the charges of scope.
func ledgerRows(t *testing.T, b *bundle, scope string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE scope = $1`, scope).Scan(&n))
	return n
}

// postCharge posts a charge of 7 by acct under key (set as the header, or, with
// byContext, only in the context for an idemclient Transport) with c, following
// redirects as c does; it returns the final answer.
func postCharge(t *testing.T, c *http.Client, url, acct, key string, byContext bool) reply {
	t.Helper()
	ctx := context.Background()
	h := keyed(acct, key)
	if byContext {
		ctx = idemclient.WithKey(ctx, key)
		h.Del(idemhttp.KeyHeader)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":7}`))
	require.NoError(t, err)
	req.Header = h
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: body}
}

// POST -> 303 -> GET under one key: the charge runs once, the GET answers the charge,
// a retry of the POST replays the 303, and nothing is ever answered 422 (which the
// API's documentation told clients to answer with a new key, charging again). Driven
// by a plain net/http client that sets the header (and, as net/http does, carries it
// onto the GET) and by idemclient; through Handler and TxMiddleware; and through a
// 307/308 of a moved route answered outside the keyed layer, which repeats the POST
// under the same key.
func TestRedirectAfterOperation(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	srv, answers := redirectServer(t, b)
	transport, err := idemclient.NewTransport(srv.Client().Transport, nil)
	require.NoError(t, err)
	clients := map[string]*http.Client{"NetHTTP": srv.Client(), "Idemclient": {Transport: transport}}

	n := 0
	for _, client := range []string{"NetHTTP", "Idemclient"} {
		for _, path := range []string{"/charges", "/tx/charges", "/v1/charges", "/v1/tx/charges"} {
			n++
			acct := "acct_redirect_" + strconv.Itoa(n)
			t.Run(client+strings.ReplaceAll(path, "/", "_"), func(t *testing.T) {
				t.Parallel()
				c := clients[client]
				byContext := client == "Idemclient"
				first := postCharge(t, c, srv.URL+path, acct, "op-1", byContext)
				require.Equal(t, http.StatusOK, first.status, "the redirect's GET answers the charge: %s", first.body)
				require.Contains(t, string(first.body), `"amount":7`)

				again := postCharge(t, c, srv.URL+path, acct, "op-1", byContext)
				require.Equal(t, http.StatusOK, again.status, "%s", again.body)
				require.Equal(t, first.body, again.body, "the retry is sent to the same charge")

				noFollow := *c
				noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
				stored := postCharge(t, &noFollow, srv.URL+strings.TrimPrefix(path, "/v1"), acct, "op-1", byContext)
				require.Equal(t, http.StatusSeeOther, stored.status, "the operation's answer is the 303: %s", stored.body)
				require.True(t, stored.replayed())

				require.Equal(t, 1, ledgerRows(t, b, acct), "one charge")
				require.Equal(t, 1, rowsFor(t, b.db, acct, ""), "one key row: the POST's; the GETs wrote none")
				require.Equal(t, workflow.KeysFinished, workflow.KeyStatus(state(t, b.db, acct, "op-1").Status))
			})
		}
	}
	t.Cleanup(func() { requireNo422(t, answers) }) // after the parallel subtests
}

// requireNo422 fails t if the server answered any request 422.
func requireNo422(t *testing.T, s *seen) {
	for _, a := range s.answers() {
		if strings.HasSuffix(a, " 422") {
			t.Errorf("a 422 was answered: %v", s.answers())
			return
		}
	}
}

// A GET never touches the key table, whatever its key: a key never used, an invalid
// one, none at all under RequireKey; Handler answers it 405. A POST's bad key is still
// a clear 400 that changes nothing.
func TestSafeMethodsAreNeverKeyed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	srv, answers := redirectServer(t, b)
	const acct = "acct_safe"
	noFollow := *srv.Client()
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	first := postCharge(t, &noFollow, srv.URL+"/charges", acct, "op-1", false)
	require.Equal(t, http.StatusSeeOther, first.status)
	loc := first.header.Get("Location")
	before := keyRow(t, b.db, acct, "op-1")

	for _, key := range []string{"never-used", "op-1", "", "a\tb"} {
		r := mustSend(t, srv, http.MethodGet, loc, keyed(acct, key), "")
		require.Equal(t, http.StatusOK, r.status, "key %q: %s", key, r.body)
		require.False(t, r.replayed())
		require.Empty(t, r.header.Get(idemhttp.RetentionHeader), "not an answer under a key")
	}
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodOptions} {
		req := httptest.NewRequest(method, "/charges", nil)
		req.Header = keyed(acct, "op-1")
		h, err := idemhttp.Handler(b.engine, redirectFlow, &idemhttp.Config{Scope: bearerScope})
		require.NoError(t, err)
		r := serve(h, req)
		require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s to an operation", method)
		require.Equal(t, "DELETE, PATCH, POST, PUT", r.header.Get("Allow"))
	}
	r := mustSend(t, srv, http.MethodPost, "/charges", keyed(acct, "a\tb"), `{"amount":7}`)
	requireProblem(t, r, http.StatusBadRequest)

	require.Equal(t, 0, rowsFor(t, b.db, "", "never-used"), "a GET with a new key writes no key row")
	require.Equal(t, 1, rowsFor(t, b.db, acct, ""))
	require.Equal(t, before, keyRow(t, b.db, acct, "op-1"), "the operation's key is untouched")
	require.Equal(t, 1, ledgerRows(t, b, acct))
	requireNo422(t, answers)
}

// A 307 or 308 answered under the key itself: here Middleware wraps a whole ServeMux,
// which answers POST /orders 307 to /orders/ (its pattern), and that 307 is stored as
// the key's answer. The POST that follows it to /orders/ under the same key is the same
// operation, not a reuse: it runs once (under the moved key), and every retry, through
// the redirect or straight to /orders/, gets its answer; no 422 anywhere. A different
// body sent to /orders/ under the key is still a reuse (422), and a GET still passes.
func TestRedirectStoredUnderTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for name, mw := range middlewares(t, b.engine, &idemhttp.Config{Scope: bearerScope, RequireKey: true}) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			requireRedirectStored(t, b, mw, "acct_moved_"+name)
		})
	}
}

// requireRedirectStored is TestRedirectStoredUnderTheKey for one middleware, mw, with
// the keys of acct.
func requireRedirectStored(t *testing.T, b *bundle, mw func(http.Handler) http.Handler, acct string) {
	var runs atomic.Int32
	inner := http.NewServeMux()
	inner.HandleFunc("POST /orders/", func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"body":%q}`, n, body)
	})
	answers := &seen{}
	srv := newServer(t, answers.wrap(mw(inner)))
	transport, err := idemclient.NewTransport(srv.Client().Transport, nil)
	require.NoError(t, err)
	noFollow := *srv.Client()
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	stored := postCharge(t, &noFollow, srv.URL+"/orders", acct, "op-1", false)
	require.Equal(t, http.StatusTemporaryRedirect, stored.status, "ServeMux's own redirect, stored: %s", stored.body)
	require.Equal(t, "/orders/", stored.header.Get("Location"))

	first := postCharge(t, srv.Client(), srv.URL+"/orders", acct, "op-1", false)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	require.False(t, first.replayed())
	require.Equal(t, `{"order":1,"body":"{\"amount\":7}"}`, string(first.body))
	for _, c := range []*http.Client{srv.Client(), {Transport: transport}} {
		again := postCharge(t, c, srv.URL+"/orders", acct, "op-1", c.Transport == transport)
		require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
		require.True(t, again.replayed())
		require.Equal(t, first.body, again.body)
	}
	direct := postCharge(t, srv.Client(), srv.URL+"/orders/", acct, "op-1", false)
	require.True(t, direct.replayed(), "straight to the new address, as a client told 308 would")
	require.Equal(t, first.body, direct.body)
	require.True(t, postCharge(t, &noFollow, srv.URL+"/orders", acct, "op-1", false).replayed(), "the 307 is replayed")
	require.EqualValues(t, 1, runs.Load(), "one order")
	require.Equal(t, 2, rowsFor(t, b.db, acct, ""), "the key's 307 and the moved key's order")

	requireNo422(t, answers)
	before := keyRow(t, b.db, acct, "op-1")
	r := mustSend(t, srv, http.MethodPost, "/orders/", keyed(acct, "op-1"), `{"amount":8}`)
	requireProblem(t, r, http.StatusUnprocessableEntity)
	require.Equal(t, before, keyRow(t, b.db, acct, "op-1"))
	require.EqualValues(t, 1, runs.Load())
	answers.mu.Lock()
	answers.got = nil // the 422 just asked for
	answers.mu.Unlock()

	other := mustSend(t, srv, http.MethodPost, "/orders", keyed(acct, "op-2"), `{"amount":9}`)
	require.Equal(t, http.StatusCreated, other.status, "another operation runs as usual: %s", other.body)
	require.EqualValues(t, 2, runs.Load())
	requireNo422(t, answers)

	// Whether a request follows a stored redirect is unknown when the key cannot be
	// read in full (here its history is not the array it must be): the answer is a
	// failure, never a 422, and nothing runs or changes.
	stored = postCharge(t, &noFollow, srv.URL+"/orders", acct, "op-3", false)
	require.Equal(t, http.StatusTemporaryRedirect, stored.status)
	_, err = b.db.Pool.Exec(context.Background(),
		`UPDATE idemflow_keys SET history = '{}' WHERE scope = $1 AND idempotency_key = 'op-3'`, acct)
	require.NoError(t, err)
	before = keyRow(t, b.db, acct, "op-3")
	r = mustSend(t, srv, http.MethodPost, "/orders/", keyed(acct, "op-3"), `{"amount":7}`)
	requireProblem(t, r, http.StatusInternalServerError)
	require.Equal(t, before, keyRow(t, b.db, acct, "op-3"))
	require.EqualValues(t, 2, runs.Load())
	requireNo422(t, answers)
}
