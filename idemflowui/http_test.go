package idemflowui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/testkit/uitest"
	"github.com/idemflow/idemflow/workflow"
)

var keyForm = url.Values{"scope": {"acct"}, "key": {"dead"}}

func withCSRF(v url.Values, csrf string) url.Values {
	out := url.Values{"csrf": {csrf}}
	for k, vs := range v {
		out[k] = vs
	}
	return out
}

// TestReadOnly: without a write token no button or form that changes anything is
// shown, and every POST and the pages that lead to one are refused 403, changing
// nothing.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.Dead(t, "acct", "dead")
	f.Released(t, "acct", "stuck", `{"amount":3}`)
	c := client(t)
	for _, k := range []string{"dead", "stuck"} {
		p := f.get(t, c, "/key?scope=acct&key="+k)
		require.Equal(t, http.StatusOK, p.status)
		require.NotContains(t, p.body, "<form", k)
		require.NotContains(t, p.body, "<button", k)
		require.NotContains(t, p.body, `id="redrive"`, k)
		require.NotContains(t, p.body, `id="release"`, k)
		require.NotContains(t, p.body, "/login", k)
		require.Contains(t, p.body, "read-only", k)
		require.Contains(t, p.body, `id="enable-writes"`, "%s: the page says how to enable writes", k)
		require.Contains(t, p.body, "-write-token-file", k)
	}
	rows := map[string]string{}
	for _, k := range []string{"dead", "stuck"} {
		rows[k] = testflow.KeyRow(t, f.DB.Pool, "acct", k)
	}
	for _, path := range []string{"/key/redrive", "/key/release", "/key/cancel", "/bulk", "/login", "/logout"} {
		for _, k := range []string{"dead", "stuck"} {
			for _, tok := range []string{token, ""} { // an empty token is no token
				p := f.post(t, c, path, withCSRF(url.Values{"scope": {"acct"}, "key": {k}, "token": {tok}}, "x"))
				require.Equal(t, http.StatusForbidden, p.status, path)
				require.Contains(t, p.body, `<p id="message">this page is read-only`, path)
				require.Empty(t, p.header.Values("Set-Cookie"), path)
			}
		}
	}
	for _, path := range []string{"/login", "/key/confirm?action=redrive&scope=acct&key=dead", "/key/cancel?scope=acct&key=dead",
		"/bulk?action=redrive&scope=acct"} {
		require.Equal(t, http.StatusForbidden, f.get(t, c, path).status, path)
	}
	for k, row := range rows {
		require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", k), "nothing changed")
	}
}

// TestWritesNeedLoginAndCSRF: with a write token, an action needs the session cookie of
// a login, the CSRF token of that session and a same-origin request; each missing
// piece is refused 403 with nothing changed, and with all of them the action runs.
func TestWritesNeedLoginAndCSRF(t *testing.T) {
	t.Parallel()
	f := setup(t, writable())
	f.Dead(t, "acct", "dead")
	row := testflow.KeyRow(t, f.DB.Pool, "acct", "dead")
	anon := client(t)

	p := f.get(t, anon, "/key?scope=acct&key=dead")
	require.NotContains(t, p.body, `id="redrive"`, "no button before the login")
	require.Contains(t, p.body, `id="login-link"`)
	loginCSRF := csrfOf(t, f.get(t, anon, "/login"))
	require.Equal(t, http.StatusForbidden, f.post(t, anon, "/key/redrive", withCSRF(keyForm, loginCSRF)).status, "no session")
	require.Equal(t, http.StatusForbidden, f.get(t, anon, "/key/confirm?action=redrive&scope=acct&key=dead").status)

	// The login itself: the right token, with the login form's CSRF token.
	wrong := f.post(t, anon, "/login", url.Values{"csrf": {loginCSRF}, "token": {token + "x"}})
	require.Equal(t, http.StatusForbidden, wrong.status)
	require.Contains(t, wrong.body, `id="login-failed"`)
	require.Empty(t, wrong.header.Values("Set-Cookie"))
	require.Equal(t, http.StatusForbidden, f.post(t, anon, "/login", url.Values{"token": {token}}).status, "login without CSRF token")
	require.Equal(t, http.StatusForbidden, f.post(t, anon, "/login", url.Values{"csrf": {loginCSRF}, "token": {token}},
		"Sec-Fetch-Site", "cross-site").status, "login from another site")
	ok := f.post(t, anon, "/login", url.Values{"csrf": {loginCSRF}, "token": {token}})
	require.Equal(t, http.StatusSeeOther, ok.status)
	cookie := ok.header.Get("Set-Cookie")
	require.Contains(t, cookie, "HttpOnly")
	require.Contains(t, cookie, "SameSite=Strict")
	require.Contains(t, cookie, "Path=/")

	c := client(t)
	csrf := f.login(t, c)
	require.NotEqual(t, loginCSRF, csrf, "a session's token is its own")
	p = f.get(t, c, "/key?scope=acct&key=dead")
	require.Contains(t, p.body, `id="redrive"`)
	require.NotContains(t, p.body, `id="release"`, "a dead key is re-driven, not released")

	// Another handler's session and token (another secret) are worth nothing here.
	other := setup(t, writable())
	oc := client(t)
	otherCSRF := other.login(t, oc)
	for name, r := range map[string]page{
		"NoCSRF":        f.post(t, c, "/key/redrive", keyForm),
		"WrongCSRF":     f.post(t, c, "/key/redrive", withCSRF(keyForm, csrf[:len(csrf)-2]+"AA")),
		"LoginCSRF":     f.post(t, c, "/key/redrive", withCSRF(keyForm, loginCSRF)),
		"OtherCSRF":     f.post(t, c, "/key/redrive", withCSRF(keyForm, otherCSRF)),
		"ForeignOrigin": f.post(t, c, "/key/redrive", withCSRF(keyForm, csrf), "Origin", "http://evil.example"),
		"CrossSite":     f.post(t, c, "/key/redrive", withCSRF(keyForm, csrf), "Sec-Fetch-Site", "cross-site"),
		"ForgedCookie":  f.post(t, client(t), "/key/redrive", withCSRF(keyForm, csrf), "Cookie", "idemflow_session=9999999999.forged"),
		"OtherCookie":   f.post(t, client(t), "/key/redrive", withCSRF(keyForm, otherCSRF), "Cookie", oc.Jar.Cookies(mustURL(t, other.Srv.URL))[0].String()),
	} {
		require.Equal(t, http.StatusForbidden, r.status, name)
		require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "%s changed nothing", name)
	}
	require.Equal(t, http.StatusMethodNotAllowed, f.get(t, c, "/key/redrive?scope=acct&key=dead").status, "a GET changes nothing")

	confirm := f.get(t, c, "/key/confirm?action=redrive&scope=acct&key=dead")
	require.Equal(t, http.StatusOK, confirm.status)
	require.Contains(t, confirm.body, "Re-driving puts it back in progress")
	require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "confirming asks, it does nothing")
	done := f.post(t, c, "/key/redrive", withCSRF(keyForm, csrfOf(t, confirm)), "Origin", f.Srv.URL, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, done.status, done.body)
	require.Equal(t, "/key?done=redriven&key=dead&scope=acct", done.header.Get("Location"))
	require.Equal(t, "in_progress", testflow.State(t, f.DB.Pool, "acct", "dead").Status)
	again := f.post(t, c, "/key/redrive", withCSRF(keyForm, csrf))
	require.Equal(t, http.StatusConflict, again.status, "already re-driven")

	out := f.post(t, c, "/logout", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, out.status)
	require.NotContains(t, f.get(t, c, "/key?scope=acct&key=dead").body, `id="release"`, "logged out")
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

// TestBadInput: malformed or invalid input in a URL or form is answered 400 with a
// message, never 500, and changes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, writable())
	f.Dead(t, "acct", "dead")
	f.Dead(t, "acct", "dead2")
	f.Released(t, "acct", "stuck", `{"amount":3}`)
	c := client(t)
	csrf := f.login(t, c)
	rows := map[string]string{"dead": testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "stuck": testflow.KeyRow(t, f.DB.Pool, "acct", "stuck")}
	long := strings.Repeat("k", 256)
	for name, path := range map[string]string{
		"UnknownStatus":   "/keys?status=stale",
		"StatusTwice":     "/keys?status=dead&status=stuck",
		"NonUTF8Flow":     "/keys?status=dead&flow=%FF",
		"NonUTF8Scope":    "/keys?status=dead&scope=a%C3",
		"NonUTF8Name":     "/keys?%FF=1",
		"LongScope":       "/keys?status=dead&scope=" + strings.Repeat("s", 256),
		"BadAge":          "/keys?status=dead&age=yesterday",
		"NegativeAge":     "/keys?status=dead&age=-5m",
		"BadCursor":       "/keys?status=dead&after=xyz",
		"OtherCursor":     "/keys?status=stuck&after=" + cursorOf(t, f, workflow.KeysDead),
		"MalformedQuery":  "/keys?status=%zz",
		"NoScope":         "/key?key=dead",
		"NoKey":           "/key?scope=acct",
		"KeyTooLong":      "/key?scope=acct&key=" + long,
		"KeyNotPrintable": "/key?scope=acct&key=a%0Ab",
		"KeyNonUTF8":      "/key?scope=acct&key=%FF",
		"ScopeNonUTF8":    "/key?scope=%FF&key=dead",
		"ScopeTooLong":    "/key?scope=" + strings.Repeat("s", 256) + "&key=dead",
		"UnknownDone":     "/key?scope=acct&key=dead&done=purged",
		"BadBodyFlag":     "/key?scope=acct&key=dead&body=yes",
		"UnknownAction":   "/key/confirm?action=purge&scope=acct&key=dead",
		"ConfirmBadKey":   "/key/confirm?action=redrive&scope=acct&key=%FF",
		"OverviewParams":  "/?x=1",
	} {
		p := f.get(t, c, path)
		require.Equal(t, http.StatusBadRequest, p.status, "%s: %s", name, p.body)
		require.Regexp(t, `<p id="message">[^<]+</p>`, p.body, name)
	}
	for name, form := range map[string]url.Values{
		"NoKey":        {"scope": {"acct"}},
		"BadKey":       {"scope": {"acct"}, "key": {"a\nb"}},
		"NonUTF8Key":   {"scope": {"acct"}, "key": {"\xff"}},
		"NonUTF8Scope": {"scope": {"\xff"}, "key": {"dead"}},
		"KeyTwice":     {"scope": {"acct"}, "key": {"dead", "stuck"}},
	} {
		for _, action := range []string{"/key/redrive", "/key/release"} {
			p := f.post(t, c, action, withCSRF(form, csrf))
			require.Equal(t, http.StatusBadRequest, p.status, "%s %s: %s", action, name, p.body)
		}
	}
	for k, row := range rows {
		require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", k), "nothing changed")
	}
	require.Equal(t, http.StatusNotFound, f.get(t, c, "/key?scope=acct&key=nope").status)
	require.Equal(t, http.StatusNotFound, f.post(t, c, "/key/redrive", withCSRF(url.Values{"scope": {"acct"}, "key": {"nope"}}, csrf)).status)
	require.Equal(t, http.StatusConflict, f.post(t, c, "/key/release", withCSRF(keyForm, csrf)).status, "a dead key is not released")
	require.Equal(t, http.StatusConflict, f.get(t, c, "/key/confirm?action=release&scope=acct&key=dead").status)
}

// cursorOf is the cursor of the second page of a list of one key per page.
func cursorOf(t *testing.T, f *fixture, status workflow.KeyStatus) string {
	t.Helper()
	page, err := f.Engine.ListKeys(context.Background(), workflow.ListOptions{Status: status, Limit: 1})
	require.NoError(t, err)
	require.NotEmpty(t, page.Next)
	return page.Next
}

// TestHeaders: every answer, pages, errors and the style sheet, carries the security
// headers; the style sheet is served as CSS.
func TestHeaders(t *testing.T) {
	t.Parallel()
	f := setup(t, writable())
	f.Dead(t, "acct", "dead")
	c := client(t)
	for _, path := range []string{"/", "/keys?status=dead", "/key?scope=acct&key=dead", "/key?scope=acct&key=nope",
		"/keys?status=bad", "/login", "/static/style.css", "/nowhere"} {
		p := f.get(t, c, path)
		require.Equal(t, "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
			p.header.Get("Content-Security-Policy"), path)
		require.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"), path)
		require.Equal(t, "no-referrer", p.header.Get("Referrer-Policy"), path)
	}
	css := f.get(t, c, "/static/style.css")
	require.Equal(t, http.StatusOK, css.status)
	require.Equal(t, "text/css; charset=utf-8", css.header.Get("Content-Type"))
	require.NotContains(t, f.get(t, c, "/").body, "style=", "no inline style: the CSP forbids it")
}

// TestListPages: a list is read a page at a time through its next-page links, every
// key once, and filters keep to their flow and scope.
func TestListPages(t *testing.T) {
	t.Parallel()
	f := setup(t, &idemflowui.Options{PageSize: 2})
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		f.Finished(t, "acct", k)
	}
	f.Finished(t, "other", "z")
	c := client(t)
	keyRe := regexp.MustCompile(`class="key"><code>([^<]+)</code>`)
	nextRe := regexp.MustCompile(`href="([^"]+)" id="next-page"`)
	var seen []string
	path := "/keys?status=finished&scope=acct"
	for range 10 {
		p := f.get(t, c, path)
		require.Equal(t, http.StatusOK, p.status, p.body)
		for _, m := range keyRe.FindAllStringSubmatch(p.body, -1) {
			seen = append(seen, m[1])
		}
		m := nextRe.FindStringSubmatch(p.body)
		if m == nil {
			break
		}
		path = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	require.Equal(t, []string{"a", "b", "c", "d", "e"}, seen)
	require.Contains(t, f.get(t, c, "/keys?status=finished&flow=nope").body, `id="no-keys"`)
	require.Contains(t, f.get(t, c, "/keys?status=finished&age=1h").body, `id="no-keys"`, "none claimed an hour ago")
	require.Contains(t, f.get(t, c, "/keys?status=finished&scope=other").body, "<code>z</code>")
}

// TestOverviewCounts: the overview counts keys by status, the dead letters of the last
// day, and links the stuck key due longest.
func TestOverviewCounts(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.Finished(t, "acct", "done")
	f.Dead(t, "acct", "dead")
	f.Released(t, "acct", "stuck", `{"amount":3}`)
	testflow.Sweepable(t, f.DB.Pool)
	p := f.get(t, client(t), "/")
	require.Equal(t, http.StatusOK, p.status)
	for id, n := range map[string]string{"total-in-progress": "1", "total-stuck": "1", "total-dead": "1", "dead-24h": "1", "total-finished": "1"} {
		require.Regexp(t, `id="`+id+`">`+n+`<`, p.body, id)
	}
	require.Contains(t, p.body, `href="/key?key=stuck&amp;scope=acct" id="oldest-stuck-link"`)
	require.Contains(t, p.body, `<svg class="chart"`)
}

// TestOverviewPartitions: on a partitioned key table the overview says how many
// partitions are ahead against how many the sweeper keeps, and warns when too few are;
// on a plain one it has no such card.
func TestOverviewPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, nil)
	p := f.get(t, client(t), "/")
	require.Equal(t, http.StatusOK, p.status)
	require.NotContains(t, p.body, `id="partitions"`)

	st, err := store.NewInSchema(f.DB.Schema)
	require.NoError(t, err)
	require.NoError(t, st.SetupPartitioned(ctx, f.DB.Pool, store.PartitionDay, 0))
	rep, err := st.CheckPartitions(ctx, f.DB.Pool)
	require.NoError(t, err)
	p = f.get(t, client(t), "/")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, fmt.Sprintf(`<span id="partitions-ahead">%d</span>`, rep.Ahead))
	require.Contains(t, p.body, `<span id="partitions-want">7</span>`)
	require.NotContains(t, p.body, "Too few")

	parts, err := st.Partitions(ctx, f.DB.Pool)
	require.NoError(t, err)
	for _, part := range parts[1:] { // the first holds now: drop those ahead of it
		_, err := f.DB.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{f.DB.Schema, part.Name}.Sanitize())
		require.NoError(t, err)
	}
	p = f.get(t, client(t), "/")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, `<span id="partitions-ahead">0</span>`)
	require.Contains(t, p.body, "Too few: a key whose creation time has no partition cannot be claimed")
}

// TestPrefix: mounted under a path, links and the session cookie keep to it, and
// requests outside it are not served.
func TestPrefix(t *testing.T) {
	t.Parallel()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	h, err := idemflowui.New(e, &idemflowui.Options{Prefix: "/ops/idemflow", WriteToken: token})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/idemflow/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f := &fixture{&uitest.Fixture{DB: db, Provider: p, Engine: e, Srv: srv}}
	c := client(t)
	ov := f.get(t, c, "/ops/idemflow/")
	require.Equal(t, http.StatusOK, ov.status)
	require.Contains(t, ov.body, `href="/ops/idemflow/static/style.css"`)
	require.Contains(t, ov.body, `href="/ops/idemflow/keys?status=dead"`)
	require.Equal(t, http.StatusOK, f.get(t, c, "/ops/idemflow/static/style.css").status)
	lp := f.get(t, c, "/ops/idemflow/login")
	r := f.post(t, c, "/ops/idemflow/login", url.Values{"csrf": {csrfOf(t, lp)}, "token": {token}})
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Equal(t, "/ops/idemflow/", r.header.Get("Location"))
	require.Contains(t, r.header.Get("Set-Cookie"), "Path=/ops/idemflow/")
	require.Equal(t, http.StatusNotFound, f.get(t, c, "/ops/idemflowx/").status)
}

// TestNew: options out of range are refused with a message.
func TestNew(t *testing.T) {
	t.Parallel()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	for name, o := range map[string]idemflowui.Options{
		"ShortToken":     {WriteToken: "short"},
		"PrefixNoSlash":  {Prefix: "ops"},
		"PrefixTrailing": {Prefix: "/ops/"},
		"BodyLimit":      {BodyLimit: idemflowui.BodyLimitMax + 1},
		"PageSize":       {PageSize: workflow.ListLimitMax + 1},
		"Window":         {Window: 48 * 3600e9},
	} {
		_, err := idemflowui.New(e, &o)
		require.Error(t, err, name)
	}
	_, err := idemflowui.New(nil, nil)
	require.Error(t, err)
	_, err = idemflowui.New(e, nil)
	require.NoError(t, err)
}

// TestSealedKey: the page (its engine has no Sealer) shows a sealed request body and a
// sealed answer as "sealed" with their size, offers no link to show their bytes, and
// never shows them.
func TestSealedKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	sealing := testflow.Engine(t, f.DB.Pool, &workflow.Config{Sealer: testflow.NewSealer(9)}, f.Provider, nil)
	ctx := context.Background()
	f.Provider.FailNext(1)
	_, err := sealing.Do(ctx, uitest.Req("acct", "open", `{"amount":31}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	_, err = sealing.Do(ctx, uitest.Req("acct", "done", `{"amount":32}`))
	require.NoError(t, err)
	c := client(t)

	p := f.get(t, c, "/key?scope=acct&key=open&body=1")
	require.Equal(t, http.StatusOK, p.status)
	require.Regexp(t, `body <strong id="body-sealed">sealed</strong>, \d+ bytes as stored`, p.body)
	require.NotContains(t, p.body, `id="show-body"`)
	require.NotContains(t, p.body, `id="body"`, "not even empty")
	require.NotContains(t, p.body, "amount")

	p = f.get(t, c, "/key?scope=acct&key=done&response=1")
	require.Equal(t, http.StatusOK, p.status)
	require.Regexp(t, `body <strong id="response-sealed">sealed</strong>, \d+ bytes as stored`, p.body)
	require.Contains(t, p.body, `id="response-headers"`, "the headers are not sealed")
	require.NotContains(t, p.body, `id="show-response"`)
	require.NotContains(t, p.body, `id="response-body"`)
	require.NotContains(t, p.body, "payment_id")
}
