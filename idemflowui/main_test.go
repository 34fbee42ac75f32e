package idemflowui_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) {
	if runCrasher() { // this process is a server that is about to be killed, not a test run
		return
	}
	os.Exit(idemflowtest.Run(m, closeBrowser))
}

// token is the write token of the fixtures that allow writes.
const token = "test-write-token-0123456789"

// fixture is a schema with the test flow's tables, an engine, and the page served on
// a test server.
type fixture struct {
	db       *pgtest.DB
	provider *idemflowtest.Remote
	engine   *workflow.Engine
	srv      *httptest.Server
}

// setup serves the page with opts (nil: read-only) on a fresh schema.
func setup(t *testing.T, opts *idemflowui.Options) *fixture {
	t.Helper()
	db, p := testflow.Start(t)
	f := &fixture{db: db, provider: p, engine: testflow.Engine(t, db.Pool, nil, p, nil)}
	h, err := idemflowui.New(f.engine, opts)
	require.NoError(t, err)
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

func writable() *idemflowui.Options { return &idemflowui.Options{WriteToken: token} }

func req(scope, key, body string) workflow.Request {
	return workflow.Request{Scope: scope, Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
}

// finished makes a finished key.
func (f *fixture) finished(t *testing.T, scope, key string) {
	t.Helper()
	_, err := f.engine.Do(context.Background(), req(scope, key, `{"amount":1}`))
	require.NoError(t, err)
}

// released makes a key whose provider call failed: in progress at reserve, released,
// and (after sweepable) stuck.
func (f *fixture) released(t *testing.T, scope, key, body string) {
	t.Helper()
	f.provider.FailNext(1)
	_, err := f.engine.Do(context.Background(), req(scope, key, body))
	require.ErrorIs(t, err, workflow.ErrTransient)
}

// dead makes a dead-lettered key: its first attempt and the sweep after it fail.
func (f *fixture) dead(t *testing.T, scope, key string) {
	t.Helper()
	f.released(t, scope, key, `{"amount":2}`)
	testflow.Sweepable(t, f.db.Pool)
	f.provider.FailNext(1)
	st := f.sweep(t, 1)
	require.Equal(t, 1, st.DeadLettered)
}

// sweep runs one sweeper pass, no grace, with maxAttempts (0: the default).
func (f *fixture) sweep(t *testing.T, maxAttempts int) sweeper.Stats {
	t.Helper()
	s, err := sweeper.New(f.engine, &sweeper.Config{Grace: -1, MaxAttempts: maxAttempts})
	require.NoError(t, err)
	st, err := s.RunOnce(context.Background())
	require.NoError(t, err)
	return st
}

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
	r, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	require.NoError(t, err)
	return do(t, c, r)
}

// post sends a form; header pairs follow.
func (f *fixture) post(t *testing.T, c *http.Client, path string, form url.Values, header ...string) page {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
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

// The crashed server: a child process (this test binary) that serves one request of
// the test flow and stops in its call phase, its key row written and its lease live,
// waiting on a pipe that never speaks, until the test kills it with SIGKILL.
const (
	envCrashDB       = "IDEMFLOWUI_CRASH_DB_URL"
	envCrashProvider = "IDEMFLOWUI_CRASH_PROVIDER_URL"
	envCrashKey      = "IDEMFLOWUI_CRASH_KEY"
)

func runCrasher() bool {
	dbURL := os.Getenv(envCrashDB)
	if dbURL == "" {
		return false
	}
	hang := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx == nil {
			fmt.Println("in call phase")
			_, _ = io.ReadAll(os.Stdin) // until killed
		}
		return nil
	}
	err := testflow.RunChild(context.Background(), dbURL, os.Getenv(envCrashProvider), hang, req("acct", os.Getenv(envCrashKey), `{"amount":9}`))
	fmt.Printf("error: not killed (%v)\n", err)
	os.Exit(3)
	return true
}

// crash runs a crashing server on key and SIGKILLs it in its call phase.
func (f *fixture) crash(t *testing.T, key string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashDB+"="+f.db.URL, envCrashProvider+"="+f.provider.URL, envCrashKey+"="+key)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan())
	require.Equal(t, "in call phase", lines.Text())
	require.NoError(t, cmd.Process.Kill()) // SIGKILL
	err = cmd.Wait()
	require.Error(t, err, "killed")
	_ = stdin.Close()
	st := testflow.State(t, f.db.Pool, "acct", key)
	require.Equal(t, testflow.KeyState{Status: "in_progress", RecoveryPoint: testflow.Reserve, LockVersion: 1, HasLease: true, Attempts: 1}, st,
		"the dead server left its key at reserve with a live lease")
}
