package idemhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/workflow"
)

// switcher is a handler that switches protocols when it can: it answers 101 through
// WriteHeader and, if the writer can be hijacked, finishes the handshake on the raw
// connection. Behind a middleware under a key it never runs for an upgrade request.
type switcher struct{ runs atomic.Int32 }

func (h *switcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		w.Header().Set("Upgrade", "test")
		w.WriteHeader(http.StatusSwitchingProtocols)
		return
	}
	defer conn.Close()
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
	_ = rw.Flush()
}

// middlewares are the two middlewares under test, by name.
func middlewares(t *testing.T, e *workflow.Engine, cfg *idemhttp.Config) map[string]func(http.Handler) http.Handler {
	t.Helper()
	plain, err := idemhttp.Middleware(e, cfg)
	require.NoError(t, err)
	tx, err := idemhttp.TxMiddleware(e, cfg)
	require.NoError(t, err)
	return map[string]func(http.Handler) http.Handler{"Middleware": plain, "TxMiddleware": tx}
}

// TestMiddlewareRefusesKeyedUpgrade: a protocol upgrade (WebSocket, h2c, a bare
// Connection: upgrade, CONNECT) with a key is answered 400 upgrade-not-idempotent
// before the handler runs, every time, and nothing is written: never a 500, never a
// second run of a handler whose answer could not be stored.
func TestMiddlewareRefusesKeyedUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	upgrades := map[string]http.Header{
		"WebSocket":      {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"H2C":            {"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"AAMAAABkAAQAAP__"}},
		"ConnectionOnly": {"Connection": {"keep-alive, upgrade"}},
		"UpgradeOnly":    {"Upgrade": {"websocket"}},
	}
	for mwName, mw := range middlewares(t, b.engine, &idemhttp.Config{Scope: bearerScope, ProblemTypeBase: serviceTypeBase}) {
		for name, extra := range upgrades {
			t.Run(mwName+"/"+name, func(t *testing.T) {
				t.Parallel()
				acct := "acct_" + mwName + "_" + name
				h := &switcher{}
				for range 2 {
					req := httptest.NewRequest(http.MethodPost, "/ws", strings.NewReader(`{}`))
					req.Header = keyed(acct, "k")
					for k, v := range extra {
						req.Header[k] = v
					}
					r := serve(mw(h), req)
					requireUpgradeRefused(t, r)
				}
				require.Zero(t, h.runs.Load(), "the handler never ran")
				require.Zero(t, rowsFor(t, b.db, acct, "k"), "nothing was written")
			})
		}
		t.Run(mwName+"/Connect", func(t *testing.T) {
			t.Parallel()
			h := &switcher{}
			req := httptest.NewRequest(http.MethodConnect, "/ws", strings.NewReader(``))
			req.Header = keyed("acct_connect_"+mwName, "k")
			requireUpgradeRefused(t, serve(mw(h), req))
			require.Zero(t, h.runs.Load())
		})
	}
}

func requireUpgradeRefused(t *testing.T, r reply) {
	t.Helper()
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, serviceTypeBase+"upgrade-not-idempotent", p.Type)
	requireUnbranded(t, r)
	require.Contains(t, p.Detail, "without an Idempotency-Key")
}

// TestMiddlewareUpgradeWithoutKey: an upgrade request without a key goes to the
// handler as any request without a key, with the real response writer: the handler
// hijacks the connection and switches protocols. So does a WebSocket-style GET with a
// key, even where keys are required: a GET is never keyed.
func TestMiddlewareUpgradeWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, key := range []string{"", "ws-k"} {
		for mwName, mw := range middlewares(t, b.engine, &idemhttp.Config{Scope: bearerScope, RequireKey: key != ""}) {
			acct := "acct_unkeyed_" + mwName + key
			t.Run(mwName+"/"+key, func(t *testing.T) {
				t.Parallel()
				h := &switcher{}
				srv := newServer(t, mw(h))
				req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/ws", nil)
				require.NoError(t, err)
				req.Header = keyed(acct, key)
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "test")
				resp, err := srv.Client().Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
				require.Equal(t, "test", resp.Header.Get("Upgrade"))
				require.EqualValues(t, 1, h.runs.Load())
				require.Zero(t, rowsFor(t, b.db, acct, ""))
			})
		}
	}
}

// TestMiddlewareInformationalAnswer: a handler that writes an informational status
// (101 included, to a request that did not ask for an upgrade) before its answer, or
// as its only one, is answered what it wrote after it (200 when that is only a body or
// nothing), stored and replayed: never a 500, never a second run.
func TestMiddlewareInformationalAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cases := map[string]struct {
		write    func(w http.ResponseWriter)
		status   int
		wantBody string
	}{
		"SwitchingThenBody": {func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusSwitchingProtocols)
			_, _ = w.Write([]byte("done"))
		}, http.StatusOK, "done"},
		"SwitchingOnly": {func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusSwitchingProtocols)
		}, http.StatusOK, ""},
		"EarlyHintsThenCreated": {func(w http.ResponseWriter) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("made"))
		}, http.StatusCreated, "made"},
	}
	for mwName, mw := range middlewares(t, b.engine, &idemhttp.Config{Scope: bearerScope}) {
		for name, c := range cases {
			t.Run(mwName+"/"+name, func(t *testing.T) {
				t.Parallel()
				var runs atomic.Int32
				srv := newServer(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					c.write(w)
				})))
				acct := "acct_info_" + mwName + "_" + name
				first := mustSend(t, srv, "POST", "/x", keyed(acct, "k"), `{}`)
				require.Equal(t, c.status, first.status, "%s", first.body)
				require.Equal(t, c.wantBody, string(first.body))
				require.False(t, first.replayed())
				again := mustSend(t, srv, "POST", "/x", keyed(acct, "k"), `{}`)
				require.Equal(t, c.status, again.status)
				require.True(t, again.replayed())
				require.Equal(t, c.wantBody, string(again.body))
				require.EqualValues(t, 1, runs.Load(), "the handler ran once")
			})
		}
	}
}
