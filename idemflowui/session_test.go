package idemflowui_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/testkit/uitest"
)

// getHost is a GET of path on f's server with the Host header host.
func (f *fixture) getHost(t *testing.T, c *http.Client, path, host string) page {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, f.Srv.URL+path, nil)
	require.NoError(t, err)
	r.Host = host
	return do(t, c, r)
}

// serveOn serves the page with opts on ln instead of the fixture's loopback server.
func (f *fixture) serveOn(t *testing.T, ln net.Listener, opts *idemflowui.Options) {
	t.Helper()
	h, err := idemflowui.New(f.Engine, opts)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	f.Srv = &httptest.Server{URL: "http://127.0.0.1:" + port}
}

// TestHostCheck: on every listener, loopback and unspecified alike, the page answers
// only the Host localhost, an IP literal of the address the request came in on, and the
// names the operator allowed; a page that rebinds its own name to the listener's
// address gets 403 and nothing of the keys.
func TestHostCheck(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.Released(t, "acct", "secret-key", `{"amount":4242}`)
	const path = "/key?scope=acct&key=secret-key&body=1"
	check := func(name string, want map[string]int) {
		t.Helper()
		port := uitest.PortOf(t, f.Srv.URL)
		for host, status := range want {
			host = expandPort(host, port)
			p := f.getHost(t, client(t), path, host)
			require.Equal(t, status, p.status, "%s: Host %s", name, host)
			if status == http.StatusForbidden {
				require.NotContains(t, p.body, "secret-key", "%s: Host %s", name, host)
				require.NotContains(t, p.body, "4242", "%s: Host %s", name, host)
			} else {
				require.Contains(t, p.body, "4242", "%s: Host %s", name, host)
			}
		}
	}
	refused := map[string]int{
		"rebound.example:$P": 403, "rebound.example": 403, "127.0.0.2:$P": 403, "[::1]:$P": 403,
		"evil.localhost:$P": 403, "localhost.:$P": 403, "localhost.rebound.example:$P": 403, "127.0.0.1.nip.io:$P": 403,
	}
	ok := map[string]int{"127.0.0.1:$P": 200, "127.0.0.1": 200, "localhost:$P": 200, "LocalHost:$P": 200, "localhost": 200}
	check("Loopback", merge(refused, ok))

	// The unspecified address: answers on loopback too, with the same check.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	require.NoError(t, err)
	f.serveOn(t, ln, nil)
	check("Unspecified", merge(refused, ok))

	ln, err = net.Listen("tcp4", "0.0.0.0:0")
	require.NoError(t, err)
	f.serveOn(t, ln, &idemflowui.Options{Hosts: []string{"OPS.example.com", "other.example:1"}})
	check("Allowed", merge(refused, ok, map[string]int{"ops.example.com:$P": 200, "ops.example.com": 200,
		"other.example:1": 200, "other.example:$P": 403, "sub.ops.example.com:$P": 403}))

	ln, err = net.Listen("tcp4", "0.0.0.0:0")
	require.NoError(t, err)
	f.serveOn(t, ln, &idemflowui.Options{Hosts: []string{idemflowui.AnyHost}})
	check("AnyHost", map[string]int{"rebound.example:$P": 200})

	for _, bad := range []string{"", "http://ops.example", "ops.example/x", "a b"} {
		_, err := idemflowui.New(f.Engine, &idemflowui.Options{Hosts: []string{bad}})
		require.Error(t, err, "%q", bad)
	}
}

func merge(ms ...map[string]int) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// expandPort puts the port in for $P.
func expandPort(host, port string) string {
	if i := len(host) - 2; i >= 0 && host[i:] == "$P" {
		return host[:i] + port
	}
	return host
}

// TestLogoutEndsSession: logging out ends the session on the server: the old cookie,
// replayed with its CSRF token, neither shows a button nor changes a key, and logging
// out again with it is refused.
func TestLogoutEndsSession(t *testing.T) {
	t.Parallel()
	f := setup(t, writable())
	f.Dead(t, "acct", "dead")
	row := testflow.KeyRow(t, f.DB.Pool, "acct", "dead")
	c := client(t)
	csrf := f.login(t, c)
	cookie := c.Jar.Cookies(mustURL(t, f.Srv.URL))[0].String()
	require.Contains(t, f.get(t, c, "/key?scope=acct&key=dead").body, `id="redrive"`, "logged in")

	out := f.post(t, c, "/logout", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, out.status)
	require.Contains(t, out.header.Get("Set-Cookie"), "Max-Age=0")

	replay := client(t) // the old cookie, kept by someone who saw it
	r, err := http.NewRequest(http.MethodGet, f.Srv.URL+"/key?scope=acct&key=dead", nil)
	require.NoError(t, err)
	r.Header.Set("Cookie", cookie)
	p := do(t, replay, r)
	require.NotContains(t, p.body, `id="redrive"`, "the old cookie shows no button")
	require.NotContains(t, p.body, `id="logout"`)
	for _, path := range []string{"/key/redrive", "/key/confirm?action=redrive&scope=acct&key=dead", "/logout"} {
		var p page
		if path == "/key/confirm?action=redrive&scope=acct&key=dead" {
			r, err := http.NewRequest(http.MethodGet, f.Srv.URL+path, nil)
			require.NoError(t, err)
			r.Header.Set("Cookie", cookie)
			p = do(t, replay, r)
		} else {
			p = f.post(t, replay, path, withCSRF(keyForm, csrf), "Cookie", cookie)
		}
		require.Equal(t, http.StatusForbidden, p.status, "%s with the old cookie: %s", path, p.body)
	}
	require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "nothing changed")

	// A new login is a new session; the old cookie stays dead.
	csrf2 := f.login(t, c)
	require.NotEqual(t, csrf, csrf2)
	require.Equal(t, http.StatusForbidden, f.post(t, replay, "/key/redrive", withCSRF(keyForm, csrf), "Cookie", cookie).status)
	require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "nothing changed")
}

// TestReadToken: with a read token every page but the login and the style sheet needs
// a session: without one it answers 401 with the login form and nothing of the keys.
// A read session reads and cannot write; a write session writes; logging out ends
// either, and its old cookie reads nothing.
func TestReadToken(t *testing.T) {
	t.Parallel()
	const readToken = "test-read-token-9876543210"
	f := setup(t, &idemflowui.Options{WriteToken: token, ReadToken: readToken})
	f.Dead(t, "acct", "dead")
	row := testflow.KeyRow(t, f.DB.Pool, "acct", "dead")
	anon := client(t)
	for _, path := range []string{"/", "/keys?status=dead", "/key?scope=acct&key=dead&body=1", "/key/confirm?action=redrive&scope=acct&key=dead", "/nowhere"} {
		p := f.get(t, anon, path)
		require.Equal(t, http.StatusUnauthorized, p.status, path)
		require.Contains(t, p.body, `id="token"`, path)
		require.NotContains(t, p.body, "amount", path)
		require.NotContains(t, p.body, `id="total-dead"`, path)
	}
	require.Equal(t, http.StatusOK, f.get(t, anon, "/static/style.css").status)
	require.Equal(t, http.StatusOK, f.get(t, anon, "/login").status)
	require.Equal(t, http.StatusUnauthorized, f.post(t, anon, "/key/redrive", withCSRF(keyForm, "x")).status)

	reader := client(t)
	lp := f.get(t, reader, "/login")
	require.Contains(t, lp.body, "Reading these pages needs the read token")
	res := f.post(t, reader, "/login", url.Values{"csrf": {csrfOf(t, lp)}, "token": {readToken}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	cookie := reader.Jar.Cookies(mustURL(t, f.Srv.URL))[0].String()
	p := f.get(t, reader, "/key?scope=acct&key=dead&body=1")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, "amount")
	require.NotContains(t, p.body, `id="redrive"`, "a read session shows no button")
	require.Contains(t, p.body, `id="login-link"`, "it may log in with the write token")
	csrf := csrfOf(t, p)
	require.Equal(t, http.StatusForbidden, f.post(t, reader, "/key/redrive", withCSRF(keyForm, csrf)).status, "a read session cannot write")
	require.Equal(t, http.StatusForbidden, f.get(t, reader, "/key/confirm?action=redrive&scope=acct&key=dead").status)
	require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "nothing changed")

	require.Equal(t, http.StatusSeeOther, f.post(t, reader, "/logout", url.Values{"csrf": {csrf}}).status)
	r, err := http.NewRequest(http.MethodGet, f.Srv.URL+"/key?scope=acct&key=dead&body=1", nil)
	require.NoError(t, err)
	r.Header.Set("Cookie", cookie)
	old := do(t, client(t), r)
	require.Equal(t, http.StatusUnauthorized, old.status, "the old cookie reads nothing after the logout")
	require.NotContains(t, old.body, "amount")

	writer := client(t)
	wcsrf := f.login(t, writer)
	confirm := f.get(t, writer, "/key/confirm?action=redrive&scope=acct&key=dead")
	require.Equal(t, http.StatusOK, confirm.status)
	done := f.post(t, writer, "/key/redrive", withCSRF(keyForm, wcsrf))
	require.Equal(t, http.StatusSeeOther, done.status, done.body)
	require.Equal(t, "in_progress", testflow.State(t, f.DB.Pool, "acct", "dead").Status)

	for name, o := range map[string]idemflowui.Options{
		"ShortReadToken": {ReadToken: "short"},
		"SameTokens":     {ReadToken: token, WriteToken: token},
	} {
		_, err := idemflowui.New(f.Engine, &o)
		require.Error(t, err, name)
	}
}
