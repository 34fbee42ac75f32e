// Package uitest is the fixture of idemflowui's tests: a schema with the test flow's
// tables, an engine, the operator page served on a test server, and keys made finished,
// released, dead-lettered or left behind by a crashed server. idemflowui's HTTP tests
// (in the library module) and its browser tests (integration/browser, in the integration
// module because chromedp is a dependency only they need) share it.
//
// Part of idemflow's test-support tree (testkit/): no compatibility promise.
package uitest

import (
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// Token is the write token of the fixtures that allow writes.
const Token = "test-write-token-0123456789"

// Fixture is a schema with the test flow's tables, an engine, and the page served on a
// test server.
type Fixture struct {
	DB       *pgtest.DB
	Provider *idemflowtest.Remote
	Engine   *workflow.Engine
	Srv      *httptest.Server
}

// Setup serves the page with opts (nil: read-only) on a fresh schema.
func Setup(t *testing.T, opts *idemflowui.Options) *Fixture {
	t.Helper()
	db, p := testflow.Start(t)
	f := &Fixture{DB: db, Provider: p, Engine: testflow.Engine(t, db.Pool, nil, p, nil)}
	h, err := idemflowui.New(f.Engine, opts)
	require.NoError(t, err)
	f.Srv = httptest.NewServer(h)
	t.Cleanup(f.Srv.Close)
	return f
}

// Writable is the options of a page that allows writes with Token.
func Writable() *idemflowui.Options { return &idemflowui.Options{WriteToken: Token} }

// Req is a request of the test flow.
func Req(scope, key, body string) workflow.Request {
	return workflow.Request{Scope: scope, Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
}

// Finished makes a finished key.
func (f *Fixture) Finished(t *testing.T, scope, key string) {
	t.Helper()
	_, err := f.Engine.Do(context.Background(), Req(scope, key, `{"amount":1}`))
	require.NoError(t, err)
}

// Released makes a key whose provider call failed: in progress at reserve, released,
// and (after testflow.Sweepable) stuck.
func (f *Fixture) Released(t *testing.T, scope, key, body string) {
	t.Helper()
	f.Provider.FailNext(1)
	_, err := f.Engine.Do(context.Background(), Req(scope, key, body))
	require.ErrorIs(t, err, workflow.ErrTransient)
}

// Dead makes a dead-lettered key: its first attempt and the sweep after it fail.
func (f *Fixture) Dead(t *testing.T, scope, key string) {
	t.Helper()
	f.Released(t, scope, key, `{"amount":2}`)
	testflow.Sweepable(t, f.DB.Pool)
	f.Provider.FailNext(1)
	st := f.Sweep(t, 1)
	require.Equal(t, 1, st.DeadLettered)
}

// Sweep runs one sweeper pass, no grace, with maxAttempts (0: the default).
func (f *Fixture) Sweep(t *testing.T, maxAttempts int) workflow.SweepStats {
	t.Helper()
	st, err := f.Engine.Sweep(context.Background(), &workflow.SweeperConfig{Grace: -1, MaxAttempts: maxAttempts})
	require.NoError(t, err)
	return st
}

// The crashed server: a child process (the test binary, on testkit/childproc) that
// serves one request of the test flow and stops in its call phase, its key row written
// and its lease live, waiting on a pipe that never speaks, until the test kills it with
// SIGKILL. The TestMain of tests that call Crash runs childproc.RunIfChild first (as
// idemflowtest.Main and Run do).
const (
	envCrashDB       = "IDEMFLOWUI_CRASH_DB_URL"
	envCrashProvider = "IDEMFLOWUI_CRASH_PROVIDER_URL"
	envCrashKey      = "IDEMFLOWUI_CRASH_KEY"
)

func init() { childproc.Register("uicrash", runCrasher) }

// crashLine is what the crashed server prints when its call phase is reached.
type crashLine struct {
	Event string `json:"event"`
}

func runCrasher() {
	hang := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx == nil {
			childproc.Emit(crashLine{Event: "in-call"})
			_, _ = io.ReadAll(os.Stdin) // until killed
		}
		return nil
	}
	err := testflow.RunChild(context.Background(), os.Getenv(envCrashDB), os.Getenv(envCrashProvider), hang, Req("acct", os.Getenv(envCrashKey), `{"amount":9}`))
	childproc.Fail("not killed", err)
}

// Crash runs a crashing server on key and SIGKILLs it in its call phase.
func (f *Fixture) Crash(t *testing.T, key string) {
	t.Helper()
	c := childproc.Start(t, "^$", childproc.Program("uicrash"),
		envCrashDB+"="+f.DB.URL, envCrashProvider+"="+f.Provider.URL, envCrashKey+"="+key)
	var l crashLine
	c.Next(t, 2*time.Minute, &l)
	require.Equal(t, "in-call", l.Event)
	c.Kill(t)
	killed, _ := c.Killed(t)
	require.True(t, killed, "killed")
	st := testflow.State(t, f.DB.Pool, "acct", key)
	require.Equal(t, testflow.KeyState{Status: "in_progress", RecoveryPoint: testflow.Reserve, LockVersion: 1, HasLease: true, Attempts: 1}, st,
		"the dead server left its key at reserve with a live lease")
}

// PortOf is the port of a server's URL (as httptest.Server.URL gives it).
func PortOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Port()
}
