package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// answerFlow registers a one-phase flow that answers resp and counts its runs.
func answerFlow(t *testing.T, e *workflow.Engine, name string, resp func() *phases.Response) *atomic.Int32 {
	t.Helper()
	runs := &atomic.Int32{}
	require.NoError(t, e.Register(phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Tx("answer", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) {
			runs.Add(1)
			return resp(), nil
		}),
	}}))
	return runs
}

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func gunzip(t *testing.T, b []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err, "the body is gzip")
	s, err := io.ReadAll(zr)
	require.NoError(t, err)
	return string(s)
}

// A body is replayed with the headers that say what it is: its encoding, the request
// headers it varies on, and the same Content-Type as the first answer.
func TestHandlerReplaysRepresentationHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	zipped := gzipped(t, `{"ok":true}`)
	answerFlow(t, b.engine, "gzip", func() *phases.Response {
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Encoding", "gzip")
		h.Set("Vary", "Accept-Encoding")
		return &phases.Response{Status: http.StatusOK, Header: h, Body: zipped}
	})
	answerFlow(t, b.engine, "gzip-untyped", func() *phases.Response {
		return &phases.Response{Status: http.StatusOK, Header: http.Header{"Content-Encoding": {"gzip"}}, Body: zipped}
	})
	answerFlow(t, b.engine, "untyped", func() *phases.Response {
		return &phases.Response{Status: http.StatusOK, Body: []byte("<html><body>hi</body></html>")}
	})
	answerFlow(t, b.engine, "typed", func() *phases.Response {
		return &phases.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"a":1}`)}
	})
	// An engine whose allow-list leaves out the headers that describe the body.
	narrow, err := workflow.New(b.db.Pool, &workflow.Config{StoredHeaders: []string{"Location"}})
	require.NoError(t, err)
	answerFlow(t, narrow, "narrow", func() *phases.Response {
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Encoding", "gzip")
		h.Set("Vary", "Accept-Encoding")
		return &phases.Response{Status: http.StatusOK, Header: h, Body: zipped}
	})

	t.Run("Gzip", func(t *testing.T) {
		t.Parallel()
		first, replay := firstAndReplay(t, serveAnswerFlow(t, b.engine, "gzip"), "acct_gzip")
		require.Equal(t, "gzip", first.header.Get("Content-Encoding"))
		require.Equal(t, "gzip", replay.header.Get("Content-Encoding"), "never raw gzip bytes labelled application/json")
		require.Equal(t, "Accept-Encoding", replay.header.Get("Vary"))
		require.Equal(t, `{"ok":true}`, gunzip(t, replay.body))
	})
	t.Run("GzipWithoutContentType", func(t *testing.T) {
		t.Parallel()
		_, replay := firstAndReplay(t, serveAnswerFlow(t, b.engine, "gzip-untyped"), "acct_gzip_untyped")
		require.Equal(t, "gzip", replay.header.Get("Content-Encoding"))
	})
	t.Run("Sniffed", func(t *testing.T) {
		t.Parallel()
		first, _ := firstAndReplay(t, serveAnswerFlow(t, b.engine, "untyped"), "acct_sniffed")
		require.Equal(t, "text/html; charset=utf-8", first.header.Get("Content-Type"))
	})
	t.Run("Typed", func(t *testing.T) {
		t.Parallel()
		first, _ := firstAndReplay(t, serveAnswerFlow(t, b.engine, "typed"), "acct_typed")
		require.Equal(t, "application/json", first.header.Get("Content-Type"))
	})
	t.Run("NarrowAllowList", func(t *testing.T) {
		t.Parallel()
		_, replay := firstAndReplay(t, serveAnswerFlow(t, narrow, "narrow"), "acct_narrow")
		require.Equal(t, "gzip", replay.header.Get("Content-Encoding"), "kept with the body whatever StoredHeaders says")
		require.Equal(t, "Accept-Encoding", replay.header.Get("Vary"))
		require.Equal(t, `{"ok":true}`, gunzip(t, replay.body))
	})
}

// serveAnswerFlow serves e's flow through the handler.
func serveAnswerFlow(t *testing.T, e *workflow.Engine, flow string) *httptest.Server {
	t.Helper()
	h, err := idemhttp.Handler(e, flow, &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	return newServer(t, h)
}

// acceptGzip is acct's request headers with key k, asking for gzip: asking for it
// ourselves keeps the client from decoding the body behind our back.
func acceptGzip(acct string) http.Header {
	h := keyed(acct, "k")
	h.Set("Accept-Encoding", "gzip")
	return h
}

// firstAndReplay sends acct's request twice: a first answer, then its replay, with a
// byte-identical body and the same Content-Type.
func firstAndReplay(t *testing.T, srv *httptest.Server, acct string) (reply, reply) {
	t.Helper()
	first := mustSend(t, srv, "POST", "/x", acceptGzip(acct), `{}`)
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	require.False(t, first.replayed())
	replay := mustSend(t, srv, "POST", "/x", acceptGzip(acct), `{}`)
	require.Equal(t, http.StatusOK, replay.status)
	require.True(t, replay.replayed())
	require.Equal(t, first.body, replay.body, "byte-identical body")
	require.Equal(t, first.header.Values("Content-Type"), replay.header.Values("Content-Type"), "the same Content-Type")
	return first, replay
}

// A phase that answers 1xx has not answered: the attempt is a server error, nothing is
// stored and the key is released.
func TestHandlerInformationalIsNotFinal(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, status := range []int{http.StatusContinue, http.StatusSwitchingProtocols, http.StatusEarlyHints} {
		name := "status-" + strconv.Itoa(status)
		runs := &atomic.Int32{}
		require.NoError(t, b.engine.Register(phases.Flow{Name: name, Phases: []phases.Phase{
			phases.Tx("start", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
			phases.Call("answer", func(context.Context, *phases.Run) (*phases.Response, error) {
				runs.Add(1)
				return &phases.Response{Status: status, Header: http.Header{"Link": {"</a.css>; rel=preload"}}}, nil
			}),
		}}))
		h, err := idemhttp.Handler(b.engine, name, &idemhttp.Config{Scope: bearerScope})
		require.NoError(t, err)
		t.Run(strings.ReplaceAll(http.StatusText(status), " ", ""), func(t *testing.T) {
			t.Parallel()
			acct := "acct_" + name
			for attempt := 1; attempt <= 2; attempt++ {
				req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
				req.Header = keyed(acct, "k")
				requireProblem(t, serve(h, req), http.StatusInternalServerError)
				st := state(t, b.db, acct, "k")
				require.Equal(t, "in_progress", st.Status, "a 1xx is never stored")
				require.False(t, st.HasLease, "the key is released")
				require.EqualValues(t, attempt, runs.Load(), "the retry runs the flow again: nothing was replayed")
			}
		})
	}
}

// A tx phase answering 1xx commits nothing: its key is never stored.
func TestHandlerInformationalFromTxPhase(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	runs := answerFlow(t, b.engine, "hints", func() *phases.Response { return &phases.Response{Status: http.StatusEarlyHints} })
	h, err := idemhttp.Handler(b.engine, "hints", &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	for attempt := 1; attempt <= 2; attempt++ {
		req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
		req.Header = keyed("acct", "k")
		requireProblem(t, serve(h, req), http.StatusInternalServerError)
		require.Zero(t, countKeys(t, b.db), "a 1xx is never stored")
		require.EqualValues(t, attempt, runs.Load())
	}
}

// HEAD, like every safe method, never runs anything under a key and never stores a
// body: Handler refuses it with 405, Middleware passes it to its handler as a request
// without a key. So does a GET: a flow routed to GET runs for no method.
func TestHeadNeverStores(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	runs := answerFlow(t, b.engine, "read", func() *phases.Response {
		return &phases.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("a body")}
	})
	flow, err := idemhttp.Handler(b.engine, "read", &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	mw, err := idemhttp.Middleware(b.engine, &idemhttp.Config{Scope: bearerScope, RequireKey: true})
	require.NoError(t, err)
	plain := &thing{}
	mux := http.NewServeMux()
	mux.Handle("GET /flow", flow) // a GET pattern serves HEAD too
	mux.Handle("GET /v1/things/{id}", mw(plain))
	mux.Handle("/any", flow) // no method in the pattern
	srv := newServer(t, mux)

	t.Run("Handler", func(t *testing.T) {
		t.Parallel()
		r := mustSend(t, srv, http.MethodHead, "/flow", keyed("acct_head", "k"), "")
		require.Equal(t, http.StatusMethodNotAllowed, r.status)
		require.Equal(t, []string{""}, r.header.Values("Allow"), "a 405 names the methods that run the flow: none routed to GET")
		require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
		require.Zero(t, rowsFor(t, b.db, "acct_head", ""), "HEAD writes no key row")
		require.Zero(t, runs.Load(), "HEAD runs no flow")

		get := mustSend(t, srv, http.MethodGet, "/flow", keyed("acct_head", "k"), "")
		requireProblem(t, get, http.StatusMethodNotAllowed)
		require.Zero(t, rowsFor(t, b.db, "acct_head", ""), "GET writes no key row")
		require.Zero(t, runs.Load(), "GET runs no flow")

		r = mustSend(t, srv, http.MethodHead, "/any", keyed("acct_head_any", "k"), "")
		require.Equal(t, http.StatusMethodNotAllowed, r.status)
		require.Equal(t, "DELETE, PATCH, POST, PUT", r.header.Get("Allow"))
		require.Zero(t, rowsFor(t, b.db, "acct_head_any", ""), "HEAD writes no key row")
		r = mustSend(t, srv, http.MethodPost, "/any", keyed("acct_head_any", "k"), "")
		require.Equal(t, http.StatusOK, r.status, "an unsafe method runs the flow")
		require.EqualValues(t, 1, runs.Load())
		r = mustSend(t, srv, http.MethodGet, "/any", keyed("acct_head_any", "k"), "")
		requireProblem(t, r, http.StatusMethodNotAllowed)
		require.Equal(t, 1, rowsFor(t, b.db, "acct_head_any", ""), "the POST's key row only")
	})
	t.Run("Middleware", func(t *testing.T) {
		t.Parallel()
		for i := 1; i <= 2; i++ {
			r := mustSend(t, srv, http.MethodHead, "/v1/things/x", keyed("acct_head_mw", "k"), "")
			require.Equal(t, http.StatusCreated, r.status)
			require.False(t, r.replayed())
			require.Empty(t, r.body)
			require.EqualValues(t, i, plain.runs.Load(), "HEAD goes to the handler every time")
		}
		require.Zero(t, rowsFor(t, b.db, "acct_head_mw", ""), "HEAD writes no key row")
	})
}

// levels is a slog handler that records the level of every line.
type levels struct {
	mu  sync.Mutex
	got []slog.Level
}

func (l *levels) Enabled(context.Context, slog.Level) bool { return true }
func (l *levels) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *levels) WithGroup(string) slog.Handler            { return l }
func (l *levels) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r.Level)
	return nil
}

func (l *levels) errors() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, lv := range l.got {
		if lv >= slog.LevelError {
			n++
		}
	}
	return n
}

// Scopes and keys that are not valid UTF-8 are the client's doing: 401 or 400 with
// problem+json, no row and no ERROR line, however often they are sent.
func TestInvalidUTF8ScopeAndKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	log := &levels{}
	e, err := workflow.New(b.db.Pool, &workflow.Config{Logger: slog.New(log)})
	require.NoError(t, err)
	answerFlow(t, e, "echo", func() *phases.Response { return &phases.Response{Status: http.StatusOK, Body: []byte("ok")} })
	// The raw value of a client header, as a careless Scope function would return it.
	rawScope := func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }
	cfg := &idemhttp.Config{Scope: rawScope}
	flow, err := idemhttp.Handler(e, "echo", cfg)
	require.NoError(t, err)
	mw, err := idemhttp.Middleware(e, cfg)
	require.NoError(t, err)
	plain := &thing{}

	cases := []struct {
		name, scope, key string
		status           int
	}{
		{"ScopeNotUTF8", "acct\xff", "k", http.StatusUnauthorized},
		{"ScopeTruncatedRune", "acct\xc3", "k", http.StatusUnauthorized},
		{"ScopeNUL", "acct\x00", "k", http.StatusUnauthorized},
		{"ScopeTooLong", strings.Repeat("a", 256), "k", http.StatusUnauthorized},
		{"KeyHighByte", "acct", "k\xff", http.StatusBadRequest},
		{"QuotedKeyHighByte", "acct", "\"k\xe9\"", http.StatusBadRequest},
		{"KeyUTF8", "acct", "cl\xc3\xa9", http.StatusBadRequest},
	}
	for _, h := range []struct {
		name string
		h    http.Handler
	}{{"Handler", flow}, {"Middleware", mw(plain)}} {
		for _, c := range cases {
			for range 3 { // at will
				req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
				req.Header = http.Header{"X-Account": {c.scope}, idemhttp.KeyHeader: {c.key}}
				requireProblem(t, serve(h.h, req), c.status)
			}
			require.Zero(t, countKeys(t, b.db), "%s %s: no row", h.name, c.name)
		}
	}
	require.Zero(t, plain.runs.Load())
	require.Zero(t, log.errors(), "no ERROR line a client can trigger")
}

// A dead-lettered key will not finish without an operator: its answer says so with a
// status clients do not retry, and no Retry-After.
func TestHandlerDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var down atomic.Bool
	down.Store(true)
	require.NoError(t, b.engine.Register(phases.Flow{Name: "doomed", Phases: []phases.Phase{
		phases.Tx("start", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("pay", func(context.Context, *phases.Run) (*phases.Response, error) {
			if down.Load() {
				return nil, errors.New("provider down")
			}
			return &phases.Response{Status: http.StatusCreated, Body: []byte(`{"paid":true}`)}, nil
		}),
	}}))
	h, err := idemhttp.Handler(b.engine, "doomed", &idemhttp.Config{Scope: bearerScope, ProblemTypeBase: serviceTypeBase})
	require.NoError(t, err)
	srv := newServer(t, h)

	r := mustSend(t, srv, "POST", "/pay", keyed("acct", "k"), `{}`)
	requireProblem(t, r, http.StatusServiceUnavailable)
	sweepable(t, b.db)
	stats, err := b.engine.Sweep(ctx, &workflow.SweeperConfig{MaxAttempts: 1})
	require.NoError(t, err)
	require.Equal(t, 1, stats.DeadLettered)
	require.Equal(t, "dead", state(t, b.db, "acct", "k").Status)

	before := keyRow(t, b.db, "acct", "k")
	for range 2 {
		r = mustSend(t, srv, "POST", "/pay", keyed("acct", "k"), `{}`)
		p := requireProblem(t, r, http.StatusGone)
		require.Empty(t, r.header.Values("Retry-After"), "nothing to wait for")
		require.Equal(t, serviceTypeBase+"key-dead-lettered", p["type"])
		require.Contains(t, p["detail"], "new key", "the detail warns against a new key")
		require.NotContains(t, string(r.body), "provider down", "the cause is not sent")
	}
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "answering a dead key changes nothing")

	// Once an operator re-drives it, the same key finishes.
	down.Store(false)
	require.NoError(t, b.engine.Redrive(ctx, "acct", "k"))
	r = mustSend(t, srv, "POST", "/pay", keyed("acct", "k"), `{}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}

// By default every problem's type is about:blank and its title the status's text
// (RFC 9457): nothing points at a page the service does not own. A service that sets
// Config.ProblemTypeBase gets its kind under that base. The 409 and 422 details say
// what the client should do. No answer names this library (requireProblem).
func TestProblemTypes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	require.NoError(t, b.engine.Register(phases.Flow{Name: "slow", Phases: []phases.Phase{
		phases.Tx("start", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("wait", func(ctx context.Context, _ *phases.Run) (*phases.Response, error) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return &phases.Response{Status: http.StatusOK, Body: []byte("done")}, nil
		}),
	}}))
	serveWith := func(base string) *httptest.Server {
		h, err := idemhttp.Handler(b.engine, "slow", &idemhttp.Config{Scope: bearerScope, ProblemTypeBase: base})
		require.NoError(t, err)
		return newServer(t, h)
	}
	def, custom, blank := serveWith(""), serveWith(serviceTypeBase), serveWith("about:blank")
	requireType := func(r reply, status int, want string) map[string]any {
		t.Helper()
		p := requireProblem(t, r, status)
		require.Equal(t, want, p["type"])
		require.Equal(t, http.StatusText(status), p["title"], "the title of about:blank is the status's text")
		return p
	}

	// 400 and 401.
	r := mustSend(t, def, "POST", "/s", keyed("acct", ""), `{}`)
	requireType(r, http.StatusBadRequest, "about:blank")
	r = mustSend(t, custom, "POST", "/s", keyed("acct", ""), `{}`)
	requireType(r, http.StatusBadRequest, serviceTypeBase+"invalid-key")
	r = mustSend(t, custom, "POST", "/s", keyed("", "k"), `{}`)
	requireType(r, http.StatusUnauthorized, serviceTypeBase+"no-scope")
	r = mustSend(t, blank, "POST", "/s", keyed("", "k"), `{}`)
	requireType(r, http.StatusUnauthorized, "about:blank")

	// 409 while the first attempt runs: retry later with the same key.
	first := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), def, "POST", "/s", keyed("acct", "k"), `{}`)
		first <- r
	}()
	<-entered
	r = mustSend(t, def, "POST", "/s", keyed("acct", "k"), `{}`)
	p := requireType(r, http.StatusConflict, "about:blank")
	secs := requireRetryAfter(t, r)
	require.Contains(t, p["detail"], "retry after "+r.header.Get("Retry-After")+" s with the same key", "Retry-After is %d", secs)
	r = mustSend(t, custom, "POST", "/s", keyed("acct", "k"), `{}`)
	requireType(r, http.StatusConflict, serviceTypeBase+"key-in-progress")
	close(release)
	require.Equal(t, http.StatusOK, (<-first).status)

	// 422: another request under the key, whose first request ran: the detail must
	// not invite a blind new key (that would charge again), but send the client to
	// the first request's answer.
	r = mustSend(t, def, "POST", "/s", keyed("acct", "k"), `{"other":true}`)
	p = requireType(r, http.StatusUnprocessableEntity, "about:blank")
	require.Contains(t, p["detail"], "do not send this request again under a new key before checking its outcome")
	require.Contains(t, p["detail"], "Resend the first request unchanged, with this key, to get its answer")
	r = mustSend(t, custom, "POST", "/s", keyed("acct", "k"), `{"other":true}`)
	requireType(r, http.StatusUnprocessableEntity, serviceTypeBase+"key-reused")
}

// A problem type base that is neither about:blank nor an absolute URI is refused when
// the handler is built, by Handler and both middlewares.
func TestProblemTypeBaseInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, base := range []string{"problems/", "/problems/", "api.example.com/problems/", "https://", "about:", "%zz"} {
		cfg := &idemhttp.Config{Scope: bearerScope, ProblemTypeBase: base}
		_, err := idemhttp.Handler(b.engine, "any", cfg)
		require.ErrorContains(t, err, "ProblemTypeBase", "%q", base)
		_, err = idemhttp.Middleware(b.engine, cfg)
		require.ErrorContains(t, err, "ProblemTypeBase", "%q", base)
		_, err = idemhttp.TxMiddleware(b.engine, cfg)
		require.ErrorContains(t, err, "ProblemTypeBase", "%q", base)
	}
	for _, base := range []string{"", "about:blank", serviceTypeBase, "https://api.example.com/docs/errors#", "urn:example:problem:"} {
		_, err := idemhttp.Middleware(b.engine, &idemhttp.Config{Scope: bearerScope, ProblemTypeBase: base})
		require.NoError(t, err, "%q", base)
	}
}

// Answers under a key say how long the key is kept; answers without one do not.
func TestRetentionHeader(t *testing.T) {
	t.Parallel()
	require.Equal(t, workflow.RetentionDefault, idemhttp.RetentionDefault, "the HTTP layer advertises the sweeper's default")
	b := setup(t, setupOpts{})
	answerFlow(t, b.engine, "kept", func() *phases.Response { return &phases.Response{Status: http.StatusCreated, Body: []byte("ok")} })
	serveWith := func(retention time.Duration) *httptest.Server {
		h, err := idemhttp.Handler(b.engine, "kept", &idemhttp.Config{Scope: bearerScope, Retention: retention})
		require.NoError(t, err)
		return newServer(t, h)
	}
	def, short, off := serveWith(0), serveWith(2*time.Hour), serveWith(-1)

	first := mustSend(t, def, "POST", "/k", keyed("acct", "k"), `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "86400", first.header.Get(idemhttp.RetentionHeader))
	replay := mustSend(t, def, "POST", "/k", keyed("acct", "k"), `{}`)
	require.True(t, replay.replayed())
	require.Equal(t, "86400", replay.header.Get(idemhttp.RetentionHeader))
	mismatch := mustSend(t, def, "POST", "/k", keyed("acct", "k"), `{"x":1}`)
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.status)
	require.Equal(t, "86400", mismatch.header.Get(idemhttp.RetentionHeader))

	require.Equal(t, "7200", mustSend(t, short, "POST", "/k", keyed("acct", "k"), `{}`).header.Get(idemhttp.RetentionHeader))
	require.Empty(t, mustSend(t, off, "POST", "/k", keyed("acct", "k"), `{}`).header.Values(idemhttp.RetentionHeader))
	require.Empty(t, mustSend(t, def, "POST", "/k", keyed("acct", ""), `{}`).header.Values(idemhttp.RetentionHeader), "no key, nothing kept")

	_, err := idemhttp.Handler(b.engine, "kept", &idemhttp.Config{Scope: bearerScope, Retention: 30 * time.Second})
	require.ErrorContains(t, err, "Retention")
}
