package browser_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/testkit/uitest"
)

// The browser tests drive the pages in headless Chromium (Debian's chromium package)
// through the DevTools protocol. They skip when no Chromium binary is found, unless
// IDEMFLOW_REQUIRE_CHROMIUM=1 (as .ci/run sets it), when they fail instead.
const envRequireChromium = "IDEMFLOW_REQUIRE_CHROMIUM"

// browser is one Chromium for the package's tests, started by the first that needs
// it; each test gets a tab in a browser context of its own (its own cookies).
var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel []context.CancelFunc
	err    error
}

func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func startBrowser(path string) {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // the tests run as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		// rebound.test stands for a site whose name an attacker has rebound to 127.0.0.1.
		chromedp.Flag("host-resolver-rules", "MAP rebound.test 127.0.0.1"),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(""), // set below: a fresh one
	}
	dir, err := os.MkdirTemp("", "idemflowui-chromium-")
	if err != nil {
		browser.err = err
		return
	}
	opts[len(opts)-1] = chromedp.UserDataDir(dir)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	browser.ctx, browser.cancel = bctx, []context.CancelFunc{bcancel, acancel, func() { os.RemoveAll(dir) }}
	browser.err = chromedp.Do(bctx) // starts the browser
}

func closeBrowser() {
	for _, c := range browser.cancel {
		c()
	}
}

// tab returns a context for a new tab in a fresh browser context, closed at cleanup.
func tab(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv(envRequireChromium) == "1" {
			t.Fatalf("no Chromium binary found (chromium, chromium-browser, google-chrome) and %s=1", envRequireChromium)
		}
		t.Skipf("no Chromium binary found: apt-get install chromium (set %s=1 to fail instead)", envRequireChromium)
	}
	browser.once.Do(func() { startBrowser(path) })
	require.NoError(t, browser.err, "start %s", path)
	ctx, cancel := chromedp.NewContext(browser.ctx, chromedp.WithNewBrowserContext())
	// A bound on a hung browser, not a threshold: every step waits on a condition. It
	// covers the whole test, fixture included, so it is sized for a loaded machine
	// (under the stress run a test of a dozen steps took four minutes).
	ctx, cancelT := context.WithTimeout(ctx, 10*time.Minute)
	t.Cleanup(func() { cancelT(); cancel() })
	return ctx
}

func text(ctx context.Context, t *testing.T, sel string) string {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel))))
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err)
	return strings.TrimSpace(s)
}

// loginIn logs the tab in with the write token through the login page.
func (f *fixture) loginIn(ctx context.Context, t *testing.T) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.Srv.URL+"/"),
		chromedp.Click(chromedp.CSS("#login-link")),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#total-stuck")),
	))
	require.Equal(t, "writes enabled", text(ctx, t, "#mode"))
}

// TestBrowserStuckKeyOfACrashedServer: a server SIGKILLed in a key's call phase leaves
// it in progress; once its lease has run out (by the database clock) the overview
// counts it stuck and links it; its page shows where it stopped; the operator releases
// it after a confirmation page, and a sweep finishes it with one effect.
func TestBrowserStuckKeyOfACrashedServer(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	f := setup(t, writable())
	f.Crash(t, "crashed")
	testflow.Sweepable(t, f.DB.Pool) // the dead server's lease has run out

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/")))
	require.Equal(t, "1", text(ctx, t, "#total-stuck"))
	require.Equal(t, "crashed", text(ctx, t, "#oldest-stuck-link"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#oldest-stuck-link"))))
	require.Equal(t, "crashed", text(ctx, t, "#key"))
	require.Equal(t, "stuck", text(ctx, t, "#status"))
	require.Equal(t, testflow.Reserve, text(ctx, t, "#recovery-point"))
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#release, #redrive").length`))
	require.NoError(t, err)
	require.Zero(t, buttons, "not logged in: no button")

	f.loginIn(ctx, t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.Srv.URL+"/keys?status=stuck"),
		chromedp.Click(chromedp.CSS(`#keys a.key`)),
		chromedp.WaitVisible(chromedp.CSS("#release")),
		chromedp.Click(chromedp.CSS("#release")),
	))
	require.Contains(t, text(ctx, t, "#what"), "Releasing takes its lease away")
	require.Equal(t, 1, int(testflow.State(t, f.DB.Pool, "acct", "crashed").LockVersion), "the confirmation page changes nothing")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm"))))
	require.Contains(t, text(ctx, t, "#flash"), "Released")
	require.Equal(t, 2, int(testflow.State(t, f.DB.Pool, "acct", "crashed").LockVersion), "released: fenced")

	require.Equal(t, 1, f.Sweep(t, 0).Finished)
	require.NoError(t, chromedp.Do(ctx, chromedp.Reload()))
	require.Equal(t, "finished", text(ctx, t, "#status"))
	history := text(ctx, t, "#history")
	require.Contains(t, history, "operator_released")
	require.Contains(t, history, "had reached reserve")
	require.Contains(t, history, "by sweeper")
	testflow.RequireOneEffect(t, f.DB.Pool, f.Provider, "acct", "crashed")
}

// TestBrowserRedrive: a dead-lettered key is found in the dead list, re-driven after a
// confirmation page that says what it does, and finished by the next sweep.
func TestBrowserRedrive(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	f := setup(t, writable())
	f.Dead(t, "acct", "dead")
	f.loginIn(ctx, t)
	require.Equal(t, "1", text(ctx, t, "#dead-24h"))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.Srv.URL+"/keys?status=dead"),
		chromedp.Click(chromedp.CSS(`#keys a.key`)),
	))
	require.Equal(t, "dead", text(ctx, t, "#status"))
	require.Equal(t, testflow.Pay, text(ctx, t, "#failed-phase"))
	require.Contains(t, text(ctx, t, "#last-error"), "503")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#redrive"))))
	require.Contains(t, text(ctx, t, "#what"), "Re-driving puts it back in progress")
	require.Equal(t, "dead", testflow.State(t, f.DB.Pool, "acct", "dead").Status, "the confirmation page changes nothing")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm"))))
	require.Contains(t, text(ctx, t, "#flash"), "Re-driven")
	require.Equal(t, "stuck", text(ctx, t, "#status"), "due at once")
	require.Equal(t, "0", text(ctx, t, "#attempts"))

	require.Equal(t, 1, f.Sweep(t, 0).Finished)
	require.NoError(t, chromedp.Do(ctx, chromedp.Reload()))
	require.Equal(t, "finished", text(ctx, t, "#status"))
	require.Contains(t, text(ctx, t, "#history"), "redriven")
	testflow.RequireOneEffect(t, f.DB.Pool, f.Provider, "acct", "dead")
}

// TestBrowserBulkAndCancel: from the dead list the operator counts the keys of a
// scope (nothing changes), confirms, and they are re-driven; then cancels another
// key: the form says what the cancel runs (no compensation), refused with its derived
// key shown until the reconciliation box is ticked,
// after which the key page shows the stored response, which a retry gets.
func TestBrowserBulkAndCancel(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	f := setup(t, writable())
	f.Dead(t, "bulk", "b1")
	f.Dead(t, "bulk", "b2")
	f.Dead(t, "acct", "dead")
	f.loginIn(ctx, t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.Srv.URL+"/keys?status=dead"),
		chromedp.WaitVisible(chromedp.CSS("#bulk")),
		chromedp.SendKeys(chromedp.CSS("#b-scope"), "bulk"),
		chromedp.Click(chromedp.CSS("#b-count")),
	))
	require.Equal(t, "2", text(ctx, t, "#count"))
	require.Equal(t, "dead", testflow.State(t, f.DB.Pool, "bulk", "b1").Status, "counting changes nothing")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm"))))
	require.Equal(t, "2", text(ctx, t, "#acted"))
	for _, k := range []string{"b1", "b2"} {
		require.Equal(t, "in_progress", testflow.State(t, f.DB.Pool, "bulk", k).Status, k)
	}
	require.Equal(t, "dead", testflow.State(t, f.DB.Pool, "acct", "dead").Status, "another scope's key")

	info, err := f.Engine.InspectKey(context.Background(), "acct", "dead")
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.Srv.URL+"/key?scope=acct&key=dead"),
		chromedp.Click(chromedp.CSS("#cancel-key")),
		chromedp.WaitVisible(chromedp.CSS("#c-status")),
	))
	require.Contains(t, text(ctx, t, "#effect"), `no compensation: flow "`+info.Flow+`" declares none`, "what the cancel runs, before it acts")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm"))))
	require.Contains(t, text(ctx, t, "#refused"), info.ID+":pay")
	require.Equal(t, "dead", testflow.State(t, f.DB.Pool, "acct", "dead").Status, "refused: nothing changed")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("#c-force")),
		chromedp.Click(chromedp.CSS("#confirm")),
	))
	require.Contains(t, text(ctx, t, "#flash"), "Cancelled")
	require.Equal(t, "finished", text(ctx, t, "#status"))
	require.Equal(t, "409", text(ctx, t, "#response-status"))
	require.Contains(t, text(ctx, t, "#response-headers"), "application/problem+json")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#show-response"))))
	shown := text(ctx, t, "#response-body")
	res, err := f.Engine.Do(context.Background(), uitest.Req("acct", "dead", `{"amount":2}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, string(res.Response.Body), shown, "the page shows what a retry gets")
	require.Contains(t, text(ctx, t, "#history"), "operator_cancelled")
	cancelled := testflow.KeyRow(t, f.DB.Pool, "acct", "dead")
	require.Equal(t, 2, f.Sweep(t, 0).Finished, "the sweep finishes the two re-driven keys")
	require.Equal(t, cancelled, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "and leaves the cancelled key alone")
}

// TestBrowserScriptInBody: a stored body, a key and an error holding markup are shown
// as text: no element is made from them and no script runs (the script would set the
// title and a global).
func TestBrowserScriptInBody(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	f := setup(t, nil)
	const key = `<i id="k">x</i>`
	body := `{"amount":7,"note":"<script>document.title='pwned';window.pwned=1</script><img src=x onerror=\"window.pwned=2\">"}`
	f.Released(t, "acct", key, body)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/keys?status=in_progress")))
	require.Equal(t, key, text(ctx, t, "#keys a.key"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#keys a.key"))))
	require.Equal(t, key, text(ctx, t, "#key"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#show-body"))))
	require.Equal(t, body, text(ctx, t, "#body"), "the body, as text")
	title, err := chromedp.Run(ctx, chromedp.Title())
	require.NoError(t, err)
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[string](`typeof window.pwned`))
	require.NoError(t, err)
	injected, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("script, img, #k").length`))
	require.NoError(t, err)
	require.Equal(t, "Key "+key+" · idemflow", title)
	require.Equal(t, "undefined", pwned, "no script ran")
	require.Zero(t, injected, "no element was made from client data")
}

// TestBrowserRebinding: a page loaded under a name rebound to the page's address
// (Chromium resolves rebound.test to 127.0.0.1) gets 403 and nothing of the keys; the
// same page under localhost and 127.0.0.1 shows the key.
func TestBrowserRebinding(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	f := setup(t, nil)
	f.Released(t, "acct", "secret-key", `{"amount":4242}`)
	port := uitest.PortOf(t, f.Srv.URL)
	page := "/key?scope=acct&key=secret-key&body=1"
	for _, host := range []string{"127.0.0.1", "localhost"} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+host+":"+port+page)))
		require.Equal(t, `{"amount":4242}`, text(ctx, t, "#body"), host)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://rebound.test:"+port+page)))
	body := text(ctx, t, "body")
	require.Contains(t, body, "not served under this host name")
	require.NotContains(t, body, "4242")
	require.NotContains(t, body, "secret-key")
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int64](`performance.getEntriesByType("navigation")[0].responseStatus`))
	require.NoError(t, err)
	require.EqualValues(t, http.StatusForbidden, status)
}

// cookieTap serves h and keeps the last session cookie it set, as someone who copied
// it would.
type cookieTap struct {
	h    http.Handler
	last chan string
}

func (c *cookieTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.h.ServeHTTP(w, r)
	for _, v := range w.Header().Values("Set-Cookie") {
		if ck, err := http.ParseSetCookie(v); err == nil && ck.Name == "idemflow_session" && ck.Value != "" {
			select {
			case <-c.last:
			default:
			}
			c.last <- ck.Value
		}
	}
}

// TestBrowserLogout: with a read token, the browser is shown the login form, logs in
// with the read token, reads, and logs out with the page's button; the cookie it had,
// replayed, then reads nothing and writes nothing. A write login works the same way.
func TestBrowserLogout(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	const readToken = "browser-read-token-0123456789"
	f := setup(t, nil)
	f.Dead(t, "acct", "dead")
	row := testflow.KeyRow(t, f.DB.Pool, "acct", "dead")
	h, err := idemflowui.New(f.Engine, &idemflowui.Options{WriteToken: token, ReadToken: readToken})
	require.NoError(t, err)
	tap := &cookieTap{h: h, last: make(chan string, 1)}
	f.Srv = httptest.NewServer(tap)
	t.Cleanup(f.Srv.Close)

	for _, tok := range []string{readToken, token} {
		require.NoError(t, chromedp.Do(ctx,
			chromedp.Navigate(f.Srv.URL+"/key?scope=acct&key=dead"),
			chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), tok),
			chromedp.Click(chromedp.CSS("#login")),
			chromedp.WaitVisible(chromedp.CSS("#total-dead")),
		))
		cookie := <-tap.last
		wantMode := map[string]string{readToken: "read-only", token: "writes enabled"}[tok]
		require.Equal(t, wantMode, text(ctx, t, "#mode"))
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/key?scope=acct&key=dead")))
		require.Equal(t, "dead", text(ctx, t, "#status"))
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token"))))

		for _, path := range []string{"/", "/key?scope=acct&key=dead&body=1"} {
			r, err := http.NewRequest(http.MethodGet, f.Srv.URL+path, nil)
			require.NoError(t, err)
			r.AddCookie(&http.Cookie{Name: "idemflow_session", Value: cookie})
			p := send(t, r)
			require.Equal(t, http.StatusUnauthorized, p.status, "%s with the cookie of a logged-out session", path)
			require.NotContains(t, p.body, "amount")
		}
		r, err := http.NewRequest(http.MethodPost, f.Srv.URL+"/key/redrive", strings.NewReader(url.Values{"scope": {"acct"}, "key": {"dead"}}.Encode()))
		require.NoError(t, err)
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.AddCookie(&http.Cookie{Name: "idemflow_session", Value: cookie})
		require.Equal(t, http.StatusUnauthorized, send(t, r).status)
		require.Equal(t, row, testflow.KeyRow(t, f.DB.Pool, "acct", "dead"), "nothing changed")
	}
}

// TestScreenshots writes the pictures in docs/ that docs/OPERATIONS.md shows. Run it
// by hand: IDEMFLOW_SCREENSHOTS=docs go test -run TestScreenshots ./integration/browser
func TestScreenshots(t *testing.T) {
	if os.Getenv("IDEMFLOW_SCREENSHOTS") != "docs" {
		t.Skip("set IDEMFLOW_SCREENSHOTS=docs to write docs/ui-*.png")
	}
	ctx := tab(t)
	f := setup(t, writable())
	for i, k := range []string{"ch_1001", "ch_1002", "ch_1003", "ch_1004", "ch_1005", "ch_1006"} {
		f.Finished(t, []string{"acct_42", "acct_7"}[i%2], k)
	}
	f.Dead(t, "acct_42", "ch_0998")
	f.Crash(t, "ch_1007")
	testflow.Sweepable(t, f.DB.Pool)
	f.loginIn(ctx, t)
	shot := func(url, name string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("main"))))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join("..", "..", "docs", name), png, 0o644))
	}
	shot(f.Srv.URL+"/", "ui-overview.png")
	shot(f.Srv.URL+"/key?scope=acct_42&key=ch_0998&body=1", "ui-key.png")
	shot(f.Srv.URL+"/bulk?action=redrive&scope=acct_42", "ui-bulk.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/key/cancel?scope=acct_42&key=ch_0998"),
		chromedp.WaitVisible(chromedp.CSS("#confirm")), chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS("#refused"))))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join("..", "..", "docs", "ui-cancel.png"), png, 0o644))
	shot(f.Srv.URL+"/key?scope=acct_7&key=ch_1002&response=1", "ui-response.png")
}

// page is a response as the tests read it.
type page struct {
	status int
	body   string
}

// send sends r with no cookie jar and no redirects followed: only the cookies r carries.
func send(t *testing.T, r *http.Request) page {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return page{status: resp.StatusCode, body: string(b)}
}

// attr is the attribute name of the first element sel matches.
func attr(ctx context.Context, t *testing.T, sel, name string) string {
	t.Helper()
	res, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
	require.NoError(t, err)
	require.True(t, res.Exists, "%s has no %s", sel, name)
	return res.Value
}

// TestBrowserOnCall: what an operator needs at 3 a.m., in place. The dead-letter list
// shows each key's failed phase and the class of its last error, and says what
// dead-lettered means with a link to its runbook; a stuck key's page and an in-progress
// list do the same for theirs; a key's page shows the derived key its call phase
// sent, the one the remote side saw, marked where it failed, and a finished key's
// page the one that made the effect.
func TestBrowserOnCall(t *testing.T) {
	t.Parallel()
	ctx := tab(t)
	f := setup(t, &idemflowui.Options{RunbookURL: "https://runbooks.example.com/OPERATIONS.md"})
	f.Dead(t, "acct", "dead")
	f.Finished(t, "acct", "done")
	f.Released(t, "acct", "stuck", `{"amount":3}`)
	testflow.Sweepable(t, f.DB.Pool)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/keys?status=dead")))
	require.Contains(t, text(ctx, t, "#explain"), "Dead-lettered: its attempts ran out")
	require.Equal(t, "https://runbooks.example.com/OPERATIONS.md#runbook-dead-lettered-keys", attr(ctx, t, "#runbook", "href"))
	require.Equal(t, testflow.Pay, text(ctx, t, "#keys .failed-phase"))
	require.Equal(t, "phase error", text(ctx, t, "#keys .error-class"))
	require.Contains(t, attr(ctx, t, "#keys .error-class", "title"), "returned this error on every attempt")

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#keys a.key`))))
	require.Equal(t, "dead", text(ctx, t, "#status"))
	require.Equal(t, "https://runbooks.example.com/OPERATIONS.md#runbook-dead-lettered-keys", attr(ctx, t, "#runbook", "href"))
	derived := text(ctx, t, "#derived-keys tr.failed .derived-key")
	require.Equal(t, testflow.Pay, text(ctx, t, "#derived-keys tr.failed .phase"), "the failed call is marked")
	require.Equal(t, "may have been sent", text(ctx, t, "#derived-keys tr.failed .state"))
	require.Equal(t, 2, f.Provider.Requests(derived), "the key shown is the one the remote side got, on each attempt")
	require.Equal(t, testflow.Pay, text(ctx, t, "#failed-phase"))

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/key?scope=acct&key=done")))
	done := text(ctx, t, "#derived-keys .derived-key")
	require.Equal(t, "sent", text(ctx, t, "#derived-keys .state"))
	_, paid := f.Provider.Effect(done)
	require.True(t, paid, "the finished key's call made its effect under the derived key shown (%s)", done)
	failed, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#derived-keys tr.failed").length`))
	require.NoError(t, err)
	require.Zero(t, failed, "a finished key has no failed call")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/key?scope=acct&key=stuck")))
	require.Equal(t, "stuck", text(ctx, t, "#status"))
	require.Contains(t, text(ctx, t, "#explain"), "Stuck: in progress, but its lease ran out")
	require.Equal(t, "https://runbooks.example.com/OPERATIONS.md#runbook-stuck-keys", attr(ctx, t, "#runbook", "href"))

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.Srv.URL+"/keys?status=in_progress")))
	require.Contains(t, text(ctx, t, "#explain"), "In progress: an attempt holds the key")
	require.Equal(t, "https://runbooks.example.com/OPERATIONS.md#runbook-keys-in-progress", attr(ctx, t, "#runbook", "href"))
	columns, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#keys .error-class, #keys .failed-phase").length`))
	require.NoError(t, err)
	require.Zero(t, columns, "only the dead-letter list has the failure columns")
}
