package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// bearerScope is the tests' Scope: the account of an "Authorization: Bearer <account>"
// header.
func bearerScope(r *http.Request) (string, error) {
	acct, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", errors.New("no bearer token")
	}
	return acct, nil
}

// reply is an HTTP answer as the client saw it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) replayed() bool { return r.header.Get(idemhttp.ReplayedHeader) == "true" }

// keyed returns the headers of a request by acct with key; an empty acct or key leaves
// that header out.
func keyed(acct, key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if acct != "" {
		h.Set("Authorization", "Bearer "+acct)
	}
	if key != "" {
		h.Set(idemhttp.KeyHeader, key)
	}
	return h
}

// send makes a request to srv and reads the whole answer. It may run on any goroutine:
// it returns the error rather than failing the test.
func send(ctx context.Context, srv *httptest.Server, method, path string, h http.Header, body string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header = h.Clone()
	resp, err := srv.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func mustSend(t *testing.T, srv *httptest.Server, method, path string, h http.Header, body string) reply {
	t.Helper()
	r, err := send(context.Background(), srv, method, path, h, body)
	require.NoError(t, err)
	return r
}

// serve calls h directly, for requests a real client refuses to send (control
// characters in a header, a body of unknown length).
func serve(h http.Handler, req *http.Request) reply {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return reply{status: rec.Code, header: rec.Result().Header, body: rec.Body.Bytes()}
}

// serviceTypeBase is the Config.ProblemTypeBase of tests that check a problem's kind:
// the default, about:blank, names none.
const serviceTypeBase = "https://api.example.com/problems/"

// requireUnbranded checks that nothing in an answer (a header's name or value, the
// body) names this library: the answers are the service's.
func requireUnbranded(t *testing.T, r reply) {
	t.Helper()
	for k, vs := range r.header {
		require.NotContains(t, strings.ToLower(k), "idem"+"flow", "header %s", k)
		for _, v := range vs {
			require.NotContains(t, strings.ToLower(v), "idemflow", "header %s: %s", k, v)
			require.NotContains(t, strings.ToLower(v), "idemhttp", "header %s: %s", k, v)
		}
	}
	require.NotContains(t, strings.ToLower(string(r.body)), "idemflow", "body: %s", r.body)
	require.NotContains(t, strings.ToLower(string(r.body)), "idemhttp", "body: %s", r.body)
}

// requireProblem checks an RFC 9457 answer: about:blank, or a kind of its status
// under serviceTypeBase; nothing in it names this library.
func requireProblem(t *testing.T, r reply, status int) map[string]any {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(r.body, &p))
	if p["type"] != "about:blank" { // the default; else the type names the kind under the service's base
		kind, ok := strings.CutPrefix(p["type"].(string), serviceTypeBase)
		require.True(t, ok, "type %q", p["type"])
		require.Contains(t, problemKinds[status], kind, "type %q for status %d", p["type"], status)
	}
	require.Equal(t, http.StatusText(status), p["title"])
	requireUnbranded(t, r)
	require.EqualValues(t, status, p["status"])
	require.NotEmpty(t, p["detail"])
	require.False(t, r.replayed())
	return p
}

// problemKinds are the kinds of problem each status may have, as docs/API.md lists them.
var problemKinds = map[int][]string{
	400: {"invalid-key", "invalid-request"},
	401: {"no-scope", "invalid-scope"},
	405: {"method-not-allowed"},
	409: {"key-in-progress"},
	410: {"key-dead-lettered"},
	413: {"body-too-large"},
	422: {"key-reused"},
	500: {"server-error", "response-too-large"},
	503: {"unavailable"},
}

// requireRetryAfter checks that r has an integer Retry-After of at least 1 and returns
// it.
func requireRetryAfter(t *testing.T, r reply) int {
	t.Helper()
	s, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
	require.GreaterOrEqual(t, s, 1)
	return s
}

// rowsFor counts key rows of scope or with key.
func rowsFor(t *testing.T, db *pgtest.DB, scope, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idemflow_keys WHERE scope = $1 OR idempotency_key = $2`, scope, key).Scan(&n))
	return n
}

// duplicates sends n identical requests at once. release is closed once all but one
// have been answered (the one left is the executor, made to wait for it), and the
// answers are returned in the order they came.
func duplicates(t *testing.T, srv *httptest.Server, path string, h http.Header, body string, n int, release chan struct{}) []reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type answer struct {
		r   reply
		err error
	}
	answers := make(chan answer, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			r, err := send(ctx, srv, http.MethodPost, path, h, body)
			answers <- answer{r, err}
		}()
	}
	close(start)
	released := false
	free := func() {
		if !released {
			released = true
			close(release)
		}
	}
	defer free()
	var got []reply
	for len(got) < n {
		if len(got) == n-1 {
			free()
		}
		select {
		case a := <-answers:
			require.NoError(t, a.err)
			got = append(got, a.r)
		case <-ctx.Done():
			t.Fatalf("only %d of %d duplicates were answered while one was held executing", len(got), n)
		}
	}
	return got
}

// checkDuplicates checks the answers of duplicates: one executed with status, the
// others were turned away with 409 and an integer Retry-After.
func checkDuplicates(t *testing.T, got []reply, status int) reply {
	t.Helper()
	var winner reply
	executed := 0
	for _, r := range got {
		switch r.status {
		case status:
			require.False(t, r.replayed())
			executed++
			winner = r
		case http.StatusConflict:
			requireProblem(t, r, http.StatusConflict)
			requireRetryAfter(t, r)
		default:
			t.Fatalf("unexpected answer %d: %s", r.status, r.body)
		}
	}
	require.Equal(t, 1, executed, "exactly one duplicate executes")
	require.Equal(t, got[len(got)-1], winner, "the executor answers last")
	return winner
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// flowServer serves the bundle's charge3 flow at POST /charges.
func flowServer(t *testing.T, b *bundle, cfg *idemhttp.Config) (*httptest.Server, http.Handler) {
	t.Helper()
	if cfg == nil {
		cfg = &idemhttp.Config{Scope: bearerScope}
	}
	h, err := idemhttp.Handler(b.engine, testflow.Name, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /charges", h)
	return newServer(t, mux), h
}

func TestHandlerReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	srv, _ := flowServer(t, b, nil)

	t.Run("SequentialDuplicate", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/charges", keyed("acct_seq", "k"), `{"amount":100}`)
		require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
		require.False(t, first.replayed())
		require.Empty(t, first.header.Values(idemhttp.ReplayedHeader))
		require.Equal(t, "session=secret", first.header.Get("Set-Cookie"), "the first answer is the flow's own")
		require.NotEmpty(t, first.header.Get("Location"))

		second := mustSend(t, srv, "POST", "/charges", keyed("acct_seq", "k"), `{"amount":100}`)
		require.Equal(t, http.StatusCreated, second.status)
		require.True(t, second.replayed())
		require.Equal(t, first.body, second.body, "byte-identical body")
		require.Equal(t, first.header.Get("Location"), second.header.Get("Location"))
		require.Equal(t, first.header.Get("Content-Type"), second.header.Get("Content-Type"))
		require.Empty(t, second.header.Values("Set-Cookie"), "Set-Cookie is never replayed")
		requireOneEffect(t, b, "acct_seq", "k")

		var row struct{ route, method string }
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT route, method FROM idemflow_keys WHERE scope = 'acct_seq' AND idempotency_key = 'k'`).Scan(&row.route, &row.method))
		require.Equal(t, "/charges", row.route, "the request path is the route")
		require.Equal(t, "POST", row.method)
	})
	t.Run("QuotedAndBareKeyAreTheSame", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/charges", keyed("acct_quote", "k-1"), `{"amount":100}`)
		require.Equal(t, http.StatusCreated, first.status)
		requireReplay(t, srv, "/charges", keyed("acct_quote", `"k-1"`), `{"amount":100}`, first)
	})
	t.Run("ReorderedJSON", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/charges", keyed("acct_json", "k"), `{"amount":100,"note":"x"}`)
		require.Equal(t, http.StatusCreated, first.status)
		second := mustSend(t, srv, "POST", "/charges", keyed("acct_json", "k"), "{ \"note\" : \"x\",\n\t\"amount\": 100 }\n")
		require.Equal(t, http.StatusCreated, second.status)
		require.True(t, second.replayed(), "reordered keys and whitespace are the same request")
		require.Equal(t, first.body, second.body)
		requireOneEffect(t, b, "acct_json", "k")
	})
	t.Run("DifferentBody", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/charges", keyed("acct_mismatch", "k"), `{"amount":5}`)
		require.Equal(t, http.StatusCreated, first.status)
		before := keyRow(t, b.db, "acct_mismatch", "k")
		r := mustSend(t, srv, "POST", "/charges", keyed("acct_mismatch", "k"), `{"amount":6}`)
		requireProblem(t, r, http.StatusUnprocessableEntity)
		require.Equal(t, before, keyRow(t, b.db, "acct_mismatch", "k"), "a mismatch writes nothing")
		requireOneEffect(t, b, "acct_mismatch", "k")
	})
	t.Run("AccountsAreIndependent", func(t *testing.T) {
		t.Parallel()
		a := mustSend(t, srv, "POST", "/charges", keyed("acct_ind_a", "same"), `{"amount":7}`)
		c := mustSend(t, srv, "POST", "/charges", keyed("acct_ind_b", "same"), `{"amount":7}`)
		require.Equal(t, http.StatusCreated, a.status)
		require.Equal(t, http.StatusCreated, c.status)
		require.False(t, c.replayed())
		require.NotEqual(t, a.body, c.body)
	})
	t.Run("DeterministicFailureIsReplayed", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/charges", keyed("acct_400", "k"), `{"amount":-1}`)
		require.Equal(t, http.StatusBadRequest, first.status)
		second := mustSend(t, srv, "POST", "/charges", keyed("acct_400", "k"), `{"amount":-1}`)
		require.Equal(t, http.StatusBadRequest, second.status)
		require.True(t, second.replayed())
		require.Equal(t, first.body, second.body)
	})
}

func TestHandlerReplayedHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const date = "Mon, 02 Jan 2006 15:04:05 GMT"
	require.NoError(t, b.engine.Register(phases.Flow{Name: "headers", Phases: []phases.Phase{
		phases.Tx("answer", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			h := http.Header{}
			h.Set("Content-Type", "application/vnd.test+json")
			h.Set("Location", "/things/1")
			h.Set("ETag", `"v1"`)
			h.Add("Set-Cookie", "session=secret")
			h.Add("Set-Cookie", "other=secret")
			h.Set("Date", date)
			h.Set("WWW-Authenticate", "Bearer")
			h.Set("X-Request-Id", "req-1")
			return &phases.Response{Status: http.StatusCreated, Header: h, Body: []byte(`{"id":1}`)}, nil
		}),
	}}))
	h, err := idemhttp.Handler(b.engine, "headers", &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	srv := newServer(t, h)

	first := mustSend(t, srv, "POST", "/things", keyed("acct", "k"), `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, []string{"session=secret", "other=secret"}, first.header.Values("Set-Cookie"))
	require.Equal(t, date, first.header.Get("Date"))
	require.Equal(t, "req-1", first.header.Get("X-Request-Id"))

	replay := requireReplay(t, srv, "/things", keyed("acct", "k"), `{}`, first)
	for _, kept := range []string{"Content-Type", "Location", "ETag"} {
		require.Equal(t, first.header.Values(kept), replay.header.Values(kept), kept)
	}
	require.Empty(t, replay.header.Values("Set-Cookie"))
	require.NotEqual(t, date, replay.header.Get("Date"), "the stored Date is not replayed (the server sets its own)")
	require.Empty(t, replay.header.Values("Www-Authenticate"))
	require.Empty(t, replay.header.Values("X-Request-Id"), "headers off the allow-list are not replayed")
}

func TestHandlerConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var payCalls atomic.Int32
	b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			payCalls.Add(1)
			select { // hold the executor in its call phase until the others are answered
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}})
	srv, _ := flowServer(t, b, nil)

	got := duplicates(t, srv, "/charges", keyed("acct", "dup"), `{"amount":100}`, 20, release)
	winner := checkDuplicates(t, got, http.StatusCreated)
	require.EqualValues(t, 1, payCalls.Load())
	requireOneEffect(t, b, "acct", "dup")
	require.Equal(t, 1, b.provider.Made())

	requireReplay(t, srv, "/charges", keyed("acct", "dup"), `{"amount":100}`, winner)
}

func TestHandlerFinishesAfterClientLeaves(t *testing.T) {
	t.Parallel()
	entered, proceed := make(chan struct{}), make(chan struct{})
	finished := make(chan struct{}, 1)
	b := setup(t, setupOpts{
		cfg: &workflow.Config{Hooks: workflow.Hooks{Key: func(ctx context.Context, ev workflow.KeyEvent) {
			if ev.Kind == workflow.OutcomeFinished {
				select {
				case finished <- struct{}{}:
				default:
				}
			}
		}}},
		before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
			if run.Phase() == testflow.Pay {
				close(entered)
				select {
				case <-proceed:
				case <-ctx.Done(): // the lease, not the client
					return ctx.Err()
				}
			}
			return nil
		},
	})
	srv, _ := flowServer(t, b, nil)

	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan error, 1)
	go func() {
		_, err := send(ctx, srv, http.MethodPost, "/charges", keyed("acct", "k"), `{"amount":4}`)
		sent <- err
	}()
	<-entered
	cancel()
	require.ErrorIs(t, <-sent, context.Canceled)
	close(proceed)
	<-finished

	require.Equal(t, "finished", state(t, b.db, "acct", "k").Status, "the flow ran on without its client")
	r := mustSend(t, srv, "POST", "/charges", keyed("acct", "k"), `{"amount":4}`)
	require.Equal(t, http.StatusCreated, r.status)
	require.True(t, r.replayed())
	requireOneEffect(t, b, "acct", "k")
}

func TestHandlerRejectsBadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	srv, h := flowServer(t, b, nil)

	badKeys := []struct {
		name string
		keys []string
	}{
		{"MissingKey", nil},
		{"EmptyKey", []string{""}},
		{"LongKey", []string{strings.Repeat("k", 256)}},
		{"ControlCharacter", []string{"a\x01b"}},
		{"QuotedControlCharacter", []string{"\"a\x1fb\""}},
		{"NonASCII", []string{"clé"}},
		{"TwoHeaderFields", []string{"a", "b"}},
		{"List", []string{`"a", "b"`}},
		{"Parameters", []string{`"a";p=1`}},
	}
	for _, c := range badKeys {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			acct := "acct_" + c.name
			r := serve(h, badKeyRequest(acct, c.keys, `{"amount":1}`))
			requireProblem(t, r, http.StatusBadRequest)
			require.Zero(t, rowsFor(t, b.db, acct, ""), "nothing written")
		})
	}
	t.Run("LongKeyOverTheWire", func(t *testing.T) {
		t.Parallel()
		r := mustSend(t, srv, "POST", "/charges", keyed("acct_wire", strings.Repeat("k", 256)), `{"amount":1}`)
		requireProblem(t, r, http.StatusBadRequest)
		require.Zero(t, rowsFor(t, b.db, "acct_wire", ""))
	})
	t.Run("NoScope", func(t *testing.T) {
		t.Parallel()
		r := mustSend(t, srv, "POST", "/charges", keyed("", "no-scope"), `{"amount":1}`)
		requireProblem(t, r, http.StatusUnauthorized)
		require.Zero(t, rowsFor(t, b.db, "", "no-scope"), "no scope never touches the key table")
	})
	t.Run("EmptyScope", func(t *testing.T) {
		t.Parallel()
		h := keyed("", "empty-scope")
		h.Set("Authorization", "Bearer ")
		r := mustSend(t, srv, "POST", "/charges", h, `{"amount":1}`)
		requireProblem(t, r, http.StatusUnauthorized)
		require.Zero(t, rowsFor(t, b.db, "", "empty-scope"))
	})
	t.Run("NoScopeComesBeforeABadKey", func(t *testing.T) {
		t.Parallel()
		r := serve(h, badKeyRequest("", []string{"a", "b"}, `{"amount":1}`))
		requireProblem(t, r, http.StatusUnauthorized)
	})
	runBodyLimitSubtests(t, b)
	t.Run("ProblemDoesNotLeakInternals", func(t *testing.T) {
		t.Parallel()
		r := serve(h, badKeyRequest("acct_leak", []string{"a\x01b"}, `{}`))
		p := requireProblem(t, r, http.StatusBadRequest)
		require.Equal(t, "no-store", r.header.Get("Cache-Control"))
		require.NotContains(t, p["detail"], "a\x01b", "the key is not echoed")
		require.Len(t, p, 4, "type, title, status, detail")
	})
}

// badKeyRequest is a POST /charges of acct with the Idempotency-Key header fields keys.
func badKeyRequest(acct string, keys []string, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
	req.Header = keyed(acct, "")
	req.Header[idemhttp.KeyHeader] = keys
	return req
}

// runBodyLimitSubtests runs, as subtests of t, the checks of a handler whose
// MaxBodyBytes is 32.
func runBodyLimitSubtests(t *testing.T, b *bundle) {
	t.Helper()
	small, err := idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{Scope: bearerScope, MaxBodyBytes: 32})
	require.NoError(t, err)
	smallSrv := newServer(t, small)
	t.Run("BodyTooLarge", func(t *testing.T) {
		t.Parallel()
		body := `{"amount":1,"pad":"` + strings.Repeat("x", 20) + `"}`
		require.Greater(t, len(body), 32)
		r := mustSend(t, smallSrv, "POST", "/charges", keyed("acct_413", "k"), body)
		requireProblem(t, r, http.StatusRequestEntityTooLarge)
		require.Zero(t, rowsFor(t, b.db, "acct_413", ""))
	})
	t.Run("BodyOfUnknownLengthTooLarge", func(t *testing.T) {
		t.Parallel()
		req := badKeyRequest("acct_413_chunked", []string{"k"}, `{"amount":1,"pad":"`+strings.Repeat("x", 40)+`"}`)
		req.ContentLength = -1
		r := serve(small, req)
		requireProblem(t, r, http.StatusRequestEntityTooLarge)
		require.Zero(t, rowsFor(t, b.db, "acct_413_chunked", ""))
	})
	t.Run("BodyAtTheLimit", func(t *testing.T) {
		t.Parallel()
		body := `{"amount":1,"pad":"` + strings.Repeat("x", 11) + `"}`
		require.Len(t, body, 32)
		r := mustSend(t, smallSrv, "POST", "/charges", keyed("acct_32", "k"), body)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	})
}

func TestHandlerTransientFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	srv, _ := flowServer(t, b, nil)
	b.provider.FailNext(1)

	r := mustSend(t, srv, "POST", "/charges", keyed("acct", "k"), `{"amount":3}`)
	requireProblem(t, r, http.StatusServiceUnavailable)
	requireRetryAfter(t, r)
	require.NotContains(t, string(r.body), "provider", "the cause is not sent")
	st := state(t, b.db, "acct", "k")
	require.Equal(t, "in_progress", st.Status, "a transient failure is never stored")
	require.False(t, st.HasLease, "the key is released")

	again := mustSend(t, srv, "POST", "/charges", keyed("acct", "k"), `{"amount":3}`)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.False(t, again.replayed())
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())
}

// A statement the database refuses for good (an undefined function here; on Citus, a
// statement it cannot run on one shard) is a 500, not a 503 to retry, and the key is
// dead-lettered with it: later attempts get 410.
func TestHandlerRefusedIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() != testflow.Settle {
			return nil
		}
		_, err := tx.Exec(ctx, `SELECT idemflow_no_such_function()`)
		return err
	}})
	srv, _ := flowServer(t, b, nil)
	r := mustSend(t, srv, "POST", "/charges", keyed("acct", "k"), `{"amount":3}`)
	requireProblem(t, r, http.StatusInternalServerError)
	require.Empty(t, r.header.Get("Retry-After"))
	require.Equal(t, "dead", state(t, b.db, "acct", "k").Status)
	again := mustSend(t, srv, "POST", "/charges", keyed("acct", "k"), `{"amount":3}`)
	requireProblem(t, again, http.StatusGone)
}

func TestHandlerPassesFiveHundredOn(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var calls atomic.Int32
	require.NoError(t, b.engine.Register(phases.Flow{Name: "flaky", Phases: []phases.Phase{
		phases.Tx("first", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Call("answer", func(context.Context, *phases.Run) (*phases.Response, error) {
			if calls.Add(1) == 1 {
				return &phases.Response{Status: http.StatusBadGateway, Header: http.Header{"X-Upstream": {"down"}}, Body: []byte("upstream down")}, nil
			}
			return &phases.Response{Status: http.StatusOK, Body: []byte("ok")}, nil
		}),
	}}))
	h, err := idemhttp.Handler(b.engine, "flaky", &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	srv := newServer(t, h)

	r := mustSend(t, srv, "POST", "/f", keyed("acct", "k"), ``)
	require.Equal(t, http.StatusBadGateway, r.status)
	require.Equal(t, "upstream down", string(r.body), "the flow's 5xx is passed on as it is")
	require.Equal(t, "down", r.header.Get("X-Upstream"))
	require.Equal(t, 1, requireRetryAfter(t, r), "Retry-After added")
	require.Equal(t, "in_progress", state(t, b.db, "acct", "k").Status)

	r = mustSend(t, srv, "POST", "/f", keyed("acct", "k"), ``)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "ok", string(r.body))
}

func TestHandlerConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := idemhttp.Handler(b.engine, testflow.Name, nil)
	require.ErrorContains(t, err, "Scope is required")
	_, err = idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{Scope: bearerScope, MaxBodyBytes: -1})
	require.ErrorContains(t, err, "MaxBodyBytes")
	_, err = idemhttp.Handler(b.engine, "nope", &idemhttp.Config{Scope: bearerScope})
	require.ErrorIs(t, err, workflow.ErrUnknownFlow)
	_, err = idemhttp.Handler(b.engine, idemhttp.MiddlewareFlow, &idemhttp.Config{Scope: bearerScope})
	require.Error(t, err)

	c := (*idemhttp.Config)(nil).WithDefaults()
	require.Equal(t, workflow.MaxBodyBytesDefault, c.MaxBodyBytes)
	require.NotNil(t, c.Route)
	req := httptest.NewRequest(http.MethodPost, "/v1/x?y=1", nil)
	require.Equal(t, "/v1/x?y=1", c.Route(req), "the path and query")
	req.Pattern = "POST /v1/{id}"
	require.Equal(t, "/v1/x?y=1", c.Route(req), "a pattern does not hide path parameters")
}

// thing is the plain handler the middleware tests wrap: it counts its runs, echoes what
// it got and sets a cookie that must never be replayed.
type thing struct {
	runs   atomic.Int32
	fail   atomic.Int32 // answer this many runs with 500
	before func(r *http.Request)
}

func (h *thing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.before != nil {
		h.before(r)
	}
	n := h.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	if h.fail.Add(-1) >= 0 {
		w.Header().Set("X-Failure", "yes")
		http.Error(w, "handler failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/things/"+strconv.Itoa(int(n)))
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"id":%q,"body":%q}`, n, r.PathValue("id"), body)
}

// middlewareServer serves h behind the engine's middleware at POST /v1/things/{id}.
func middlewareServer(t *testing.T, e *workflow.Engine, cfg *idemhttp.Config, h http.Handler) *httptest.Server {
	t.Helper()
	if cfg == nil {
		cfg = &idemhttp.Config{Scope: bearerScope, RequireKey: true}
	}
	mw, err := idemhttp.Middleware(e, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/things/{id}", mw(h))
	return newServer(t, mux)
}

func TestMiddlewareReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	h := &thing{}
	srv := middlewareServer(t, b.engine, nil, h)

	t.Run("SequentialDuplicate", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/v1/things/t1", keyed("acct_seq", "k"), `{"a":1}`)
		require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
		require.False(t, first.replayed())
		require.Equal(t, "session=secret", first.header.Get("Set-Cookie"))
		var echo struct{ ID, Body string }
		require.NoError(t, json.Unmarshal(first.body, &echo))
		require.Equal(t, "t1", echo.ID, "the handler sees path values")
		require.Equal(t, `{"a":1}`, echo.Body, "the handler gets the body")

		second := mustSend(t, srv, "POST", "/v1/things/t1", keyed("acct_seq", "k"), `{"a":1}`)
		require.Equal(t, http.StatusCreated, second.status)
		require.True(t, second.replayed())
		require.Equal(t, first.body, second.body)
		require.Equal(t, first.header.Get("Location"), second.header.Get("Location"))
		require.Equal(t, "application/json", second.header.Get("Content-Type"))
		require.Empty(t, second.header.Values("Set-Cookie"))

		st := state(t, b.db, "acct_seq", "k")
		require.Equal(t, "finished", st.Status)
		var route, flow string
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT route, flow FROM idemflow_keys WHERE scope = 'acct_seq' AND idempotency_key = 'k'`).Scan(&route, &flow))
		require.Equal(t, "/v1/things/t1", route)
		require.Equal(t, idemhttp.MiddlewareFlow, flow)
	})
	t.Run("ReorderedJSON", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/v1/things/t2", keyed("acct_json", "k"), `{"a":1,"b":[1,2]}`)
		require.Equal(t, http.StatusCreated, first.status)
		requireReplay(t, srv, "/v1/things/t2", keyed("acct_json", "k"), " {\"b\": [1, 2],\n \"a\": 1}", first)
	})
	t.Run("DifferentBody", func(t *testing.T) {
		t.Parallel()
		first := mustSend(t, srv, "POST", "/v1/things/t3", keyed("acct_mismatch", "k"), `{"a":1}`)
		require.Equal(t, http.StatusCreated, first.status)
		before := keyRow(t, b.db, "acct_mismatch", "k")
		r := mustSend(t, srv, "POST", "/v1/things/t3", keyed("acct_mismatch", "k"), `{"a":2}`)
		requireProblem(t, r, http.StatusUnprocessableEntity)
		require.Equal(t, before, keyRow(t, b.db, "acct_mismatch", "k"))
	})
	t.Run("DifferentPathSameRoute", func(t *testing.T) {
		t.Parallel()
		// The path is part of the request: another id with the same key and body is a
		// different request, never a replay of the first.
		first := mustSend(t, srv, "POST", "/v1/things/t4", keyed("acct_path", "k"), `{}`)
		require.Equal(t, http.StatusCreated, first.status)
		before := keyRow(t, b.db, "acct_path", "k")
		second := mustSend(t, srv, "POST", "/v1/things/t5", keyed("acct_path", "k"), `{}`)
		requireProblem(t, second, http.StatusUnprocessableEntity)
		require.Equal(t, before, keyRow(t, b.db, "acct_path", "k"))
	})
}

func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	release := make(chan struct{})
	h := &thing{before: func(r *http.Request) {
		select { // hold the executor until the others are answered
		case <-release:
		case <-r.Context().Done():
		}
	}}
	srv := middlewareServer(t, b.engine, nil, h)

	got := duplicates(t, srv, "/v1/things/x", keyed("acct", "dup"), `{"a":1}`, 20, release)
	winner := checkDuplicates(t, got, http.StatusCreated)
	require.EqualValues(t, 1, h.runs.Load(), "the handler ran once")

	requireReplay(t, srv, "/v1/things/x", keyed("acct", "dup"), `{"a":1}`, winner)
	require.EqualValues(t, 1, h.runs.Load())
}

func TestMiddlewareWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	t.Run("PassesThrough", func(t *testing.T) {
		t.Parallel()
		h := &thing{}
		srv := middlewareServer(t, b.engine, &idemhttp.Config{Scope: bearerScope}, h)
		for i := 1; i <= 2; i++ {
			r := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_pass", ""), `{"a":1}`)
			require.Equal(t, http.StatusCreated, r.status)
			require.False(t, r.replayed())
			require.Equal(t, "session=secret", r.header.Get("Set-Cookie"))
			require.EqualValues(t, i, h.runs.Load(), "no key: the handler runs every time")
		}
		r := mustSend(t, srv, "POST", "/v1/things/x", keyed("", ""), `{"a":1}`)
		require.Equal(t, http.StatusCreated, r.status, "no key needs no scope")
		require.Zero(t, rowsFor(t, b.db, "acct_pass", ""), "the key table is not touched")

		r = mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_pass", "a\tb"), `{"a":1}`)
		requireProblem(t, r, http.StatusBadRequest)
		require.EqualValues(t, 3, h.runs.Load(), "an invalid key is refused even when keys are optional")
	})
	t.Run("Required", func(t *testing.T) {
		t.Parallel()
		h := &thing{}
		srv := middlewareServer(t, b.engine, &idemhttp.Config{Scope: bearerScope, RequireKey: true}, h)
		r := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_req", ""), `{"a":1}`)
		requireProblem(t, r, http.StatusBadRequest)
		r = mustSend(t, srv, "POST", "/v1/things/x", keyed("", "req-k"), `{"a":1}`)
		requireProblem(t, r, http.StatusUnauthorized)
		require.Zero(t, h.runs.Load())
		require.Zero(t, rowsFor(t, b.db, "acct_req", "req-k"))
	})
	t.Run("BadRequests", func(t *testing.T) {
		t.Parallel()
		h := &thing{}
		mw, err := idemhttp.Middleware(b.engine, &idemhttp.Config{Scope: bearerScope, MaxBodyBytes: 8})
		require.NoError(t, err)
		wrapped := mw(h)
		for _, keys := range [][]string{{"a", "b"}, {`"a", "b"`}, {strings.Repeat("k", 256)}, {"a\x00"}} {
			req := httptest.NewRequest(http.MethodPost, "/v1/things/x", strings.NewReader(`{}`))
			req.Header = keyed("acct_bad", "")
			req.Header[idemhttp.KeyHeader] = keys
			requireProblem(t, serve(wrapped, req), http.StatusBadRequest)
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/things/x", strings.NewReader(`{"a":"123456789"}`))
		req.Header = keyed("acct_bad", "k")
		requireProblem(t, serve(wrapped, req), http.StatusRequestEntityTooLarge)
		require.Zero(t, h.runs.Load())
		require.Zero(t, rowsFor(t, b.db, "acct_bad", ""))
	})
}

func TestMiddlewareFiveHundredIsNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	h := &thing{}
	h.fail.Store(1)
	srv := middlewareServer(t, b.engine, nil, h)

	r := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct", "k"), `{"a":1}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Equal(t, "handler failed\n", string(r.body), "the handler's own answer is passed on")
	require.Equal(t, "yes", r.header.Get("X-Failure"))
	requireRetryAfter(t, r)
	st := state(t, b.db, "acct", "k")
	require.Equal(t, "in_progress", st.Status, "a 5xx is never stored")
	require.False(t, st.HasLease, "the key is released")

	f, ok := b.engine.Flow(idemhttp.MiddlewareFlow)
	require.True(t, ok)
	require.True(t, f.ClientOnly)
	before := keyRow(t, b.db, "acct", "k")
	_, err := b.engine.Resume(context.Background(), "acct", "k")
	require.ErrorIs(t, err, workflow.ErrNeedsClient, "without its client the key cannot run")
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "and is left as it was")
	require.EqualValues(t, 1, h.runs.Load())

	r = mustSend(t, srv, "POST", "/v1/things/x", keyed("acct", "k"), `{"a":1}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.False(t, r.replayed())
	require.EqualValues(t, 2, h.runs.Load(), "the retry runs the handler again")

	requireReplay(t, srv, "/v1/things/x", keyed("acct", "k"), `{"a":1}`, r)
	require.EqualValues(t, 2, h.runs.Load())
}

func TestMiddlewareCapture(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	t.Run("ImplicitStatusAndFlush", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int32
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			_, _ = io.WriteString(w, "hello, ")
			w.(http.Flusher).Flush()
			if err := http.NewResponseController(w).Flush(); err != nil {
				panic(err)
			}
			w.Header().Set("X-Too-Late", "1") // after the header was sent: no effect
			_, _ = w.Write([]byte("world"))
		})
		srv := middlewareServer(t, b.engine, nil, h)
		first := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_flush", "k"), ``)
		require.Equal(t, http.StatusOK, first.status)
		require.Equal(t, "hello, world", string(first.body))
		require.Equal(t, "text/plain; charset=utf-8", first.header.Get("Content-Type"), "sniffed, as net/http does")
		require.Empty(t, first.header.Get("X-Too-Late"))
		second := requireReplay(t, srv, "/v1/things/x", keyed("acct_flush", "k"), ``, first)
		require.Equal(t, first.header.Get("Content-Type"), second.header.Get("Content-Type"))
		require.EqualValues(t, 1, runs.Load())
	})
	t.Run("NothingWritten", func(t *testing.T) {
		t.Parallel()
		srv := middlewareServer(t, b.engine, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		first := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_empty", "k"), `{}`)
		require.Equal(t, http.StatusOK, first.status)
		require.Empty(t, first.body)
		second := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_empty", "k"), `{}`)
		require.Equal(t, http.StatusOK, second.status)
		require.True(t, second.replayed())
	})
	t.Run("HandlerPanics", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int32
		srv := middlewareServer(t, b.engine, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				panic("boom")
			}
			w.WriteHeader(http.StatusAccepted)
		}))
		r := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_panic", "k"), `{}`)
		requireProblem(t, r, http.StatusInternalServerError)
		require.NotContains(t, string(r.body), "boom")
		r = mustSend(t, srv, "POST", "/v1/things/x", keyed("acct_panic", "k"), `{}`)
		require.Equal(t, http.StatusAccepted, r.status)
		require.EqualValues(t, 2, runs.Load())
	})
}

func TestMiddlewareResponseTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e, err := workflow.New(b.db.Pool, &workflow.Config{MaxResponseBytes: 16})
	require.NoError(t, err)
	var runs atomic.Int32
	var writeErr atomic.Value
	srv := middlewareServer(t, e, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 10))
		_, err := w.Write(bytes.Repeat([]byte("y"), 7))
		writeErr.Store(err)
	}))

	// The handler ran, so its answer is final: the key is dead-lettered (410, the same
	// answer every retry gets), not released to run the handler again.
	r := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct", "k"), `{}`)
	requireProblem(t, r, http.StatusGone)
	require.NotContains(t, string(r.body), "xxxx", "never truncated")
	require.ErrorIs(t, writeErr.Load().(error), workflow.ErrResponseTooLarge, "the handler's write fails")
	st := state(t, b.db, "acct", "k")
	require.Equal(t, "dead", st.Status, "the handler ran: the key is dead-lettered, not released")
	require.False(t, st.HasLease)

	r = mustSend(t, srv, "POST", "/v1/things/x", keyed("acct", "k"), `{}`)
	requireProblem(t, r, http.StatusGone)
	require.EqualValues(t, 1, runs.Load(), "the next attempt does not run the handler again")
}

func TestMiddlewareSharedEngine(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cfg := &idemhttp.Config{Scope: bearerScope, RequireKey: true}
	mwA, err := idemhttp.Middleware(b.engine, cfg)
	require.NoError(t, err)
	mwB, err := idemhttp.Middleware(b.engine, cfg)
	require.NoError(t, err, "Middleware may be called again on the same engine")
	a, c := &thing{}, &thing{}
	flow, err := idemhttp.Handler(b.engine, testflow.Name, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /a/{id}", mwA(a))
	mux.Handle("POST /b/{id}", mwB(c))
	mux.Handle("POST /charges", flow)
	srv := newServer(t, mux)

	r := mustSend(t, srv, "POST", "/a/1", keyed("acct", "k1"), `{}`)
	require.Equal(t, http.StatusCreated, r.status)
	r = mustSend(t, srv, "POST", "/b/1", keyed("acct", "k2"), `{}`)
	require.Equal(t, http.StatusCreated, r.status)
	r = mustSend(t, srv, "POST", "/charges", keyed("acct", "k3"), `{"amount":1}`)
	require.Equal(t, http.StatusCreated, r.status)

	r = mustSend(t, srv, "POST", "/b/1", keyed("acct", "k1"), `{}`)
	requireProblem(t, r, http.StatusUnprocessableEntity)
	r = mustSend(t, srv, "POST", "/charges", keyed("acct", "k1"), `{}`)
	requireProblem(t, r, http.StatusUnprocessableEntity)
	r = mustSend(t, srv, "POST", "/a/1", keyed("acct", "k3"), `{"amount":1}`)
	requireProblem(t, r, http.StatusUnprocessableEntity) // a flow's key reused on a middleware route
	require.EqualValues(t, 1, a.runs.Load())
	require.EqualValues(t, 1, c.runs.Load())
}

func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	_, err = idemhttp.Middleware(e, nil)
	require.ErrorContains(t, err, "Scope is required")

	require.NoError(t, e.Register(phases.Flow{Name: idemhttp.MiddlewareFlow, Phases: []phases.Phase{
		phases.Tx("t", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
	}}))
	_, err = idemhttp.Middleware(e, &idemhttp.Config{Scope: bearerScope})
	require.ErrorContains(t, err, "reserved")
}

// requireReplay POSTs body under h and requires the stored answer of first: replayed,
// with first's status and body bytes.
func requireReplay(t *testing.T, srv *httptest.Server, path string, h http.Header, body string, first reply) reply {
	t.Helper()
	r := mustSend(t, srv, "POST", path, h, body)
	require.True(t, r.replayed(), "a replay")
	require.Equal(t, first.status, r.status, "the stored status")
	require.Equal(t, first.body, r.body, "the stored body bytes")
	return r
}
