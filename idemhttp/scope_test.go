package idemhttp_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// countingBody counts the bytes read from a request body.
type countingBody struct {
	r    io.Reader
	read *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (countingBody) Close() error { return nil }

// TestControlCharacterScopeRefusedAtTheEdge: a scope holding a C0 or C1 control
// character or DEL (as a Scope function that copies a header or a token's claim would
// return it) is answered 401 invalid-scope by the handler and both middlewares, before
// the body is read, with no key row, no handler run and no ERROR line. Over the wire, a
// Bearer token with a C1 character (which net/http lets through as obs-text) or
// invalid UTF-8 is answered the same way.
func TestControlCharacterScopeRefusedAtTheEdge(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	log := &levels{}
	e, err := workflow.New(b.db.Pool, &workflow.Config{Logger: slog.New(log)})
	require.NoError(t, err)
	runs := answerFlow(t, e, "echo", func() *phases.Response { return &phases.Response{Status: http.StatusOK, Body: []byte("ok")} })
	rawScope := func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }
	cfg := &idemhttp.Config{Scope: rawScope, Logger: slog.New(log), ProblemTypeBase: serviceTypeBase}
	flow, err := idemhttp.Handler(e, "echo", cfg)
	require.NoError(t, err)
	mw, err := idemhttp.Middleware(e, cfg)
	require.NoError(t, err)
	txmw, err := idemhttp.TxMiddleware(e, cfg)
	require.NoError(t, err)
	plain := &thing{}
	handlers := map[string]http.Handler{"Handler": flow, "Middleware": mw(plain), "TxMiddleware": txmw(plain)}

	scopes := []string{"acct\x00", "acct\x01", "acct\n", "acct\x1b[2J", "acct\x7f", "acct\u0080", "acct\u009b2J", "acct\u009f"}
	for name, h := range handlers {
		for _, scope := range scopes {
			read := &atomic.Int64{}
			req := httptest.NewRequest(http.MethodPost, "/x", nil)
			req.Body = countingBody{r: strings.NewReader(`{"amount":1}`), read: read}
			req.Header = http.Header{"X-Account": {scope}, idemhttp.KeyHeader: {"k"}}
			p := requireProblem(t, serve(h, req), http.StatusUnauthorized)
			require.Equal(t, serviceTypeBase+"invalid-scope", p["type"], "%s %q", name, scope)
			require.Zero(t, read.Load(), "%s %q: the body was not read", name, scope)
		}
	}

	bearer := func(r *http.Request) (string, error) { return bearerScope(r) }
	wire, err := idemhttp.Handler(e, "echo", &idemhttp.Config{Scope: bearer, Logger: slog.New(log), ProblemTypeBase: serviceTypeBase})
	require.NoError(t, err)
	srv := newServer(t, wire)
	for _, scope := range []string{"acct\u009b31m", "acct\u0085", "acct\xff", "acct\xc2"} {
		r := mustSend(t, srv, "POST", "/charges", keyed(scope, "k"), `{"amount":1}`)
		p := requireProblem(t, r, http.StatusUnauthorized)
		require.Equal(t, serviceTypeBase+"invalid-scope", p["type"], "%q", scope)
	}

	require.Zero(t, countKeys(t, b.db), "no key row")
	require.Zero(t, runs.Load(), "the flow never ran")
	require.Zero(t, plain.runs.Load(), "the handler never ran")
	require.Zero(t, log.errors(), "no ERROR line a client can trigger")
}
