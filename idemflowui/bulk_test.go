package idemflowui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/testkit/uitest"
	"github.com/idemflow/idemflow/workflow"
)

// TestBulkPages: the dead list offers a bulk re-drive; its count page changes nothing
// and refuses an empty filter; the confirmed action acts on at most the keys counted.
func TestBulkPages(t *testing.T) {
	t.Parallel()
	f := setup(t, writable())
	for _, k := range []string{"d1", "d2", "d3"} {
		f.Dead(t, "acct", k)
	}
	f.Dead(t, "other", "d4")
	rows := map[string]string{}
	for _, k := range []string{"d1", "d2", "d3"} {
		rows[k] = testflow.KeyRow(t, f.DB.Pool, "acct", k)
	}
	c := client(t)
	csrf := f.login(t, c)
	require.Contains(t, f.get(t, c, "/keys?status=dead").body, `id="bulk"`)
	require.NotContains(t, f.get(t, c, "/keys?status=finished").body, `id="bulk"`, "finished keys have no bulk action")

	require.Equal(t, http.StatusBadRequest, f.get(t, c, "/bulk?action=redrive").status, "no filter")
	require.Equal(t, http.StatusBadRequest, f.get(t, c, "/bulk?action=purge&scope=acct").status)
	count := f.get(t, c, "/bulk?action=redrive&scope=acct&point=reserve")
	require.Equal(t, http.StatusOK, count.status)
	require.Contains(t, count.body, `<span id="count">3</span>`)
	require.Contains(t, count.body, `name="expect" value="3"`)
	for k, row := range rows {
		require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", k), "counting changes nothing")
	}

	form := url.Values{"action": {"redrive"}, "scope": {"acct"}, "point": {"reserve"}}
	require.Equal(t, http.StatusBadRequest, f.post(t, c, "/bulk", withCSRF(form, csrf)).status, "no confirmed count")
	require.Equal(t, http.StatusForbidden, f.post(t, c, "/bulk", form).status, "no CSRF token")
	form.Set("expect", "2") // the operator confirmed two: never more are acted on
	done := f.post(t, c, "/bulk", withCSRF(form, csrf))
	require.Equal(t, http.StatusOK, done.status, done.body)
	require.Contains(t, done.body, `<span id="acted">2</span>`)
	require.Contains(t, done.body, "More keys match than were confirmed")
	dead := 0
	for _, k := range []string{"d1", "d2", "d3"} {
		if testflow.State(t, f.DB.Pool, "acct", k).Status == "dead" {
			dead++
		}
	}
	require.Equal(t, 1, dead, "two of three re-driven")
	require.Equal(t, "dead", testflow.State(t, f.DB.Pool, "other", "d4").Status, "the filter's scope only")
}

// TestCancelPage: the cancel form refuses a key whose call phase may have run,
// naming its derived key and changing nothing, until the operator ticks the
// reconciliation box; the form says what the cancel runs (here no compensation); a
// 5xx is refused 400; the key page then shows the stored
// response, which a retry gets byte for byte.
func TestCancelPage(t *testing.T) {
	t.Parallel()
	f := setup(t, writable())
	f.Dead(t, "acct", "dead")
	row := testflow.KeyRow(t, f.DB.Pool, "acct", "dead")
	info, err := f.Engine.InspectKey(context.Background(), "acct", "dead")
	require.NoError(t, err)
	c := client(t)
	csrf := f.login(t, c)
	require.Contains(t, f.get(t, c, "/key?scope=acct&key=dead").body, `id="cancel-key"`)
	formPage := f.get(t, c, "/key/cancel?scope=acct&key=dead")
	require.Equal(t, http.StatusOK, formPage.status)
	require.Contains(t, formPage.body, "never run again by a sweeper")
	require.Contains(t, formPage.body, `<p id="effect"><strong>What the cancel runs:</strong> no compensation: flow &#34;`+info.Flow+`&#34; declares none`,
		"the form says what the cancel runs before it acts")
	require.NotContains(t, formPage.body, `id="c-skip"`, "nothing to skip")

	body := `{"title":"cancelled <by> ops"}`
	form := url.Values{"scope": {"acct"}, "key": {"dead"}, "status": {"409"}, "content_type": {"application/problem+json"}, "body": {body}}
	refused := f.post(t, c, "/key/cancel", withCSRF(form, csrf))
	require.Equal(t, http.StatusConflict, refused.status)
	require.Contains(t, refused.body, `id="refused"`)
	require.Contains(t, refused.body, info.ID+":pay")
	require.Contains(t, refused.body, `id="c-force"`)
	bad := withCSRF(form, csrf)
	bad.Set("status", "503")
	bad.Set("force", "1")
	fiveXX := f.post(t, c, "/key/cancel", bad)
	require.Equal(t, http.StatusBadRequest, fiveXX.status)
	require.Contains(t, fiveXX.body, "5xx is never stored")
	require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "refusals change nothing")

	forced := withCSRF(form, csrf)
	forced.Set("force", "1")
	done := f.post(t, c, "/key/cancel", forced)
	require.Equal(t, http.StatusSeeOther, done.status, done.body)
	require.Equal(t, "/key?done=cancelled&key=dead&scope=acct", done.header.Get("Location"))
	page := f.get(t, c, "/key?scope=acct&key=dead&response=1")
	require.Contains(t, page.body, `<strong id="response-status">409</strong>`)
	require.Contains(t, page.body, "<code>Content-Type</code></th><td><code>application/problem&#43;json</code>")
	require.Contains(t, page.body, `{&#34;title&#34;:&#34;cancelled &lt;by&gt; ops&#34;}`, "the body, as text")
	require.Contains(t, page.body, "operator_cancelled")
	res, err := f.Engine.Do(context.Background(), uitest.Req("acct", "dead", `{"amount":2}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, body, string(res.Response.Body))
	require.Equal(t, 0, f.Sweep(t, 0).Finished+f.Sweep(t, 0).DeadLettered, "the sweeper leaves it alone")
	require.Equal(t, http.StatusConflict, f.get(t, c, "/key/cancel?scope=acct&key=dead").status, "finished: nothing to cancel")
}

// TestCancelPageFlowUnknown: a page whose engine does not register the key's flow (as
// the one `idemflow ui` serves) says it cannot tell whether the flow declares a
// compensation, refuses a forced cancel saying so and changing nothing, and cancels
// once *Skip the compensation* is ticked too.
func TestCancelPageFlowUnknown(t *testing.T) {
	t.Parallel()
	served := setup(t, writable())
	served.Dead(t, "acct", "dead")
	row := testflow.KeyRow(t, served.DB.Pool, "acct", "dead")
	bare, err := workflow.New(served.DB.Pool, nil)
	require.NoError(t, err)
	h, err := idemflowui.New(bare, writable())
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f := &fixture{&uitest.Fixture{DB: served.DB, Provider: served.Provider, Engine: bare, Srv: srv}}
	c := client(t)
	csrf := f.login(t, c)

	formPage := f.get(t, c, "/key/cancel?scope=acct&key=dead")
	require.Equal(t, http.StatusOK, formPage.status)
	require.Contains(t, formPage.body, `refused: flow &#34;`+testflow.Name+`&#34; is not registered here`)
	require.Contains(t, formPage.body, `id="c-skip"`)

	form := withCSRF(url.Values{"scope": {"acct"}, "key": {"dead"}, "status": {"409"}, "body": {"{}"}, "force": {"1"}}, csrf)
	refused := f.post(t, c, "/key/cancel", form)
	require.Equal(t, http.StatusConflict, refused.status)
	require.Contains(t, refused.body, "whether the flow declares a compensation is unknown")
	require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "refused: nothing changed")

	form.Set("skip_compensation", "1")
	done := f.post(t, c, "/key/cancel", form)
	require.Equal(t, http.StatusSeeOther, done.status, done.body)
	require.Equal(t, "finished", testflow.State(t, f.DB.Pool, "acct", "dead").Status)
}
