package idemflowui_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/testkit/uitest"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

// token is the write token of the fixtures that allow writes.
const token = uitest.Token

// fixture is a schema with the test flow's tables, an engine, and the page served on
// a test server (testkit/uitest, shared with the browser tests).
type fixture struct{ *uitest.Fixture }

// setup serves the page with opts (nil: read-only) on a fresh schema.
func setup(t *testing.T, opts *idemflowui.Options) *fixture {
	t.Helper()
	return &fixture{uitest.Setup(t, opts)}
}

func writable() *idemflowui.Options { return uitest.Writable() }

// page is one HTTP answer, read.
type page struct {
	status int
	header http.Header
	body   string
}

// client is a cookie-keeping HTTP client that does not follow redirects.
func client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, r *http.Request) page {
	t.Helper()
	resp, err := c.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return page{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (f *fixture) get(t *testing.T, c *http.Client, path string) page {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, f.Srv.URL+path, nil)
	require.NoError(t, err)
	return do(t, c, r)
}

// post sends a form; header pairs follow.
func (f *fixture) post(t *testing.T, c *http.Client, path string, form url.Values, header ...string) page {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, f.Srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return do(t, c, r)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf is the CSRF token in a page's forms.
func csrfOf(t *testing.T, p page) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(p.body)
	require.NotNil(t, m, "no CSRF field in the page")
	return m[1]
}

// login logs c in with the write token and returns the CSRF token of its session.
func (f *fixture) login(t *testing.T, c *http.Client) string {
	t.Helper()
	lp := f.get(t, c, "/login")
	require.Equal(t, http.StatusOK, lp.status)
	r := f.post(t, c, "/login", url.Values{"csrf": {csrfOf(t, lp)}, "token": {token}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	return csrfOf(t, f.get(t, c, "/"))
}
