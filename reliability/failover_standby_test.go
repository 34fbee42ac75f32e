package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestFailoverAsyncCommit runs a primary whose commits are asynchronous
// (synchronous_commit off, for the whole server or for the engine's sessions only)
// and a streaming standby, with Config.StandbyWait. The primary crashes (SIGQUIT, an
// immediate shutdown) the moment the call phase starts, after the standby wait let it
// start; the standby is promoted and the retry goes there. The standby must have the
// key row, the retry must resume it under the same derived key, and the provider must
// have charged once. The WAL writer is slowed (wal_writer_delay 10s) and autovacuum is
// off, so that nothing but the engine flushes the primary's WAL within the test: a
// wait for a position short of the commit's record (the WAL write position, as before
// issue 36) lets the call start with the commit unflushed, and the crash loses it.
func TestFailoverAsyncCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		server  []string // settings of the primary
		session bool     // synchronous_commit off for the engine's sessions only
	}{
		{"ServerOff", []string{"synchronous_commit=off"}, false},
		{"SessionOff", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hang bound for the whole test: it took 217 s under the stress run
			defer cancel()
			primary := startPrimary(ctx, t, append([]string{"wal_writer_delay=10s", "autovacuum=off"}, tc.server...)...)
			standby, err := pgtest.StartStandby(ctx, primary, primary.Addr())
			require.NoError(t, err)
			t.Cleanup(func() { _ = standby.Stop() })
			setup := poolWith(ctx, t, primary.URL, "on") // setup commits durable before the standby catches up
			require.NoError(t, migrations.Migrate(ctx, setup))
			require.NoError(t, testflow.CreateTables(ctx, setup))
			waitCaughtUp(ctx, t, setup)
			sc := ""
			if tc.session {
				sc = "off"
			}
			ppool := poolWith(ctx, t, primary.URL, sc)
			require.NoError(t, ppool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
			require.Equal(t, "off", sc, "the engine's sessions commit asynchronously")
			crashAtCall(ctx, t, primary, standby, ppool)
		})
	}
}

// poolWith is a pool on url, closed when t ends, whose sessions run with
// synchronous_commit sc (the server's when sc is "").
func poolWith(ctx context.Context, t *testing.T, url, sc string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	if sc != "" {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = sc
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// crashAtCall runs one charge on the primary that crashes the primary as its call
// starts, promotes standby, retries there and checks the key: one row, its derived
// key the first attempt's, one payment. The standby wait's bound is long: the call
// must start, and a shorter bound could pass before a stalled standby confirmed.
func crashAtCall(ctx context.Context, t *testing.T, primary, standby *pgtest.Dedicated, ppool *pgxpool.Pool) {
	t.Helper()
	remote := idemflowtest.NewRemote(t, nil)
	var derived string
	var crashed error
	e := testflow.Engine(t, ppool, &workflow.Config{StandbyWait: time.Minute}, remote, func(_ context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx == nil && derived == "" {
			derived = run.DerivedKey() // the call started: the standby wait let it
			crashed = primary.Crash()
		}
		return nil
	})
	_, err := e.Do(ctx, chargeReq("async"))
	require.Error(t, err, "the settle phase cannot commit on a crashed primary")
	require.NotEmpty(t, derived, "the call phase never started: %v", err)
	require.NoError(t, crashed)
	require.Equal(t, 1, remote.Made(), "the first attempt's payment")

	spool, err := pgxpool.New(ctx, standby.URL)
	require.NoError(t, err)
	t.Cleanup(spool.Close)
	_, err = spool.Exec(ctx, `SELECT pg_promote(true, 60)`)
	require.NoError(t, err)
	had := idemflowtest.ExpireLease(t, spool, "acct", "async") // the crashed attempt's lease
	res, err := testflow.Engine(t, spool, nil, remote, nil).Do(ctx, chargeReq("async"))
	require.NoError(t, err, "the retry on the promoted standby")
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.Equal(t, 1, remote.Made(), "provider payments: the retry found no key row and paid under a new derived key")
	require.True(t, had, "the promoted standby had no key row")
	var id string
	require.NoError(t, spool.QueryRow(ctx, `SELECT id::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'async'`).Scan(&id))
	require.Equal(t, derived, id+":"+testflow.Pay, "the retry's derived key")
	testflow.RequireOneEffect(t, spool, remote, "acct", "async")
}

// TestStandbyWaitCountsOnlyPhysical checks which walsenders the standby wait counts,
// on a primary with a physical streaming standby and logical replication (a
// subscription of a second server: a CDC consumer confirms the same way). With the
// standby streaming a call starts (with StandbyNames naming it too); with the standby
// down and the logical consumer streaming and confirming, no call starts: the
// attempt is answered 503 with Retry-After (ErrStandbyBehind), the key is released and
// the provider is not called, whether StandbyNames is empty or names the standby that
// is down. A WAL archiver (pg_receivewal --synchronous, physical and flushing, but
// replaying nothing: no server to promote) does not count either.
//
// Where a standby confirms, the wait's bound is long (confirmWait): a bound of 2 s (and
// of 0.5 s once pg_monitor is granted) let a machine that stalled the wait, or the
// standby, pass it before the confirmation and answer 503. Where none can confirm, the
// wait runs to its bound, which is still long enough (behindWait) that the reads it
// makes first (a connection, the commit's position, the walsenders) come before it:
// the cause asserted (pg_monitor, "not flushed by a standby that counts") is the last
// read's, and a bound that passed before any read says only "context deadline
// exceeded" (a temporary 2.1 s sleep at the wait's start failed every subtest).
func TestStandbyWaitCountsOnlyPhysical(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hang bound for the whole test: it took 217 s under the stress run
	defer cancel()
	primary := startPrimary(ctx, t, "wal_level=logical")
	standby, err := pgtest.StartStandby(ctx, primary, primary.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	ppool, err := pgxpool.New(ctx, primary.URL)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	require.NoError(t, migrations.Migrate(ctx, ppool))
	require.NoError(t, testflow.CreateTables(ctx, ppool))
	waitCaughtUp(ctx, t, ppool)
	remote := idemflowtest.NewRemote(t, nil)
	const confirmWait, behindWait = time.Minute, 5 * time.Second
	serve := func(wait time.Duration, names []string, key string) *http.Response {
		e := testflow.Engine(t, ppool, &workflow.Config{StandbyWait: wait, StandbyNames: names}, remote, nil)
		h, err := idemhttp.Handler(e, testflow.Name, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "acct", nil }})
		require.NoError(t, err)
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", bytes.NewReader([]byte(`{"amount":5}`)))
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}
	t.Run("StandbyStreaming", func(t *testing.T) {
		require.Equal(t, http.StatusCreated, serve(confirmWait, nil, "streaming").StatusCode)
		require.Equal(t, http.StatusCreated, serve(confirmWait, []string{"walreceiver"}, "named").StatusCode)
		require.Equal(t, 2, remote.Made())
	})
	t.Run("RoleWithoutMonitor", func(t *testing.T) {
		// The positions read as NULL: the wait cannot learn them and must not pass.
		_, err := ppool.Exec(ctx, `CREATE ROLE app LOGIN;
			GRANT ALL ON ALL TABLES IN SCHEMA public TO app; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO app`)
		require.NoError(t, err)
		apool, err := pgxpool.New(ctx, strings.Replace(primary.URL, "postgres@", "app@", 1))
		require.NoError(t, err)
		defer apool.Close()
		var logs lockedBuffer
		e := testflow.Engine(t, apool, &workflow.Config{StandbyWait: behindWait,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}, remote, nil)
		made := remote.Made()
		for _, key := range []string{"nomonitor-1", "nomonitor-2"} {
			_, err := e.Do(ctx, chargeReq(key))
			require.ErrorIs(t, err, workflow.ErrStandbyBehind)
			require.ErrorContains(t, err, "pg_monitor")
		}
		require.Equal(t, made, remote.Made(), "the provider was called")
		_, err = ppool.Exec(ctx, `GRANT pg_monitor TO app`)
		require.NoError(t, err)
		res, err := testflow.Engine(t, apool, &workflow.Config{StandbyWait: confirmWait}, remote, nil).Do(ctx, chargeReq("monitor"))
		require.NoError(t, err, "with pg_monitor")
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.Equal(t, 1, strings.Count(logs.String(), "level=WARN msg=\"workflow: StandbyWait cannot read"), "warnings:\n%s", logs.String())
	})

	// The standby goes down; a logical consumer (a subscription of a second server)
	// and a WAL archiver stream and confirm everything the primary flushed.
	require.NoError(t, standby.Stop())
	waitNoWalsender(ctx, t, ppool)
	subscribe(ctx, t, primary, ppool)
	waitWalsenderFlushed(ctx, t, ppool, "cdc")
	consume(ctx, t, "pg_receivewal", "--synchronous", "--status-interval=1", "--no-loop", "--directory="+t.TempDir(),
		"--dbname="+conninfo(primary, ""))
	waitWalsenderFlushed(ctx, t, ppool, "pg_receivewal")

	for _, tc := range []struct {
		name  string
		names []string
	}{
		{"AnyStandby", nil},
		{"NamedStandbyDown", []string{"walreceiver"}},
		{"NamedArchiver", []string{"pg_receivewal"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "down-" + tc.name
			made := remote.Made()
			res := serve(behindWait, tc.names, key)
			require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "the call started with no physical standby streaming")
			require.NotEmpty(t, res.Header.Get("Retry-After"))
			require.Equal(t, made, remote.Made(), "the provider was called")
			st := testflow.State(t, ppool, "acct", key)
			require.Equal(t, "in_progress", st.Status)
			require.False(t, st.HasLease, "the key was not released")
			var lastErr string
			if st.LastError != nil {
				lastErr = *st.LastError
			}
			require.Contains(t, lastErr, workflow.ErrStandbyBehind.Error())
			require.Contains(t, lastErr, "not flushed by a standby that counts")
		})
	}
}

// startPrimary starts a dedicated server, stopped when t ends, with settings
// ("name=value") in its postgresql.auto.conf before its first start (some need a
// restart), which a standby copied from it keeps; it checks that the server runs with
// each.
func startPrimary(ctx context.Context, t *testing.T, settings ...string) *pgtest.Dedicated {
	t.Helper()
	primary, err := pgtest.StartDedicatedWith(ctx, settings...)
	if errors.Is(err, pgtest.ErrNoServer) {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop() })
	if len(settings) == 0 {
		return primary
	}
	pool, err := pgxpool.New(ctx, primary.URL)
	require.NoError(t, err)
	defer pool.Close()
	for _, s := range settings {
		name, value, _ := strings.Cut(s, "=")
		var got string
		require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&got))
		require.Equal(t, value, got, "the primary's %s", name)
	}
	return primary
}

// conninfo is a libpq connection string for primary as the superuser.
func conninfo(primary *pgtest.Dedicated, dbname string) string {
	host, port, _ := strings.Cut(primary.Addr(), ":")
	s := fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable", host, port)
	if dbname != "" {
		s += " dbname=" + dbname
	}
	return s
}

// subscribe makes a second server subscribe to a publication of primary: a logical
// walsender on primary (application_name "cdc") that confirms, on every keepalive,
// all the WAL primary flushed.
func subscribe(ctx context.Context, t *testing.T, primary *pgtest.Dedicated, ppool *pgxpool.Pool) {
	t.Helper()
	sub, err := pgtest.StartDedicated(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Stop() })
	const table = `CREATE TABLE walsender_tick (n int)`
	_, err = ppool.Exec(ctx, table+`; CREATE PUBLICATION cdc FOR TABLE walsender_tick`)
	require.NoError(t, err)
	spool, err := pgxpool.New(ctx, sub.URL)
	require.NoError(t, err)
	defer spool.Close()
	_, err = spool.Exec(ctx, table)
	require.NoError(t, err)
	_, err = spool.Exec(ctx, fmt.Sprintf(`CREATE SUBSCRIPTION cdc CONNECTION '%s' PUBLICATION cdc`, conninfo(primary, "postgres")))
	require.NoError(t, err)
}

// consume runs a PostgreSQL client tool until t ends.
func consume(ctx context.Context, t *testing.T, tool string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath(tool)
	if err != nil {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + tool)
		require.NotEmpty(t, dirs, "no %s binary", tool)
		bin = dirs[len(dirs)-1]
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
}

// poll calls f every 10ms until it reports true; f fails the test when ctx ends.
func poll(ctx context.Context, f func() bool) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !f() {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// waitNoWalsender waits until the primary has no walsender left.
func waitNoWalsender(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	poll(ctx, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication`).Scan(&n), "a walsender is left")
		return n == 0
	})
}

// waitWalsenderFlushed waits until the walsender of application_name app streams and
// has confirmed a flush at or past everything the primary flushed after a new commit:
// the standby wait of an engine that counted it would pass.
func waitWalsenderFlushed(ctx context.Context, t *testing.T, pool *pgxpool.Pool, app string) {
	t.Helper()
	_, err := pool.Exec(ctx, `INSERT INTO walsender_tick VALUES (1)`)
	require.NoError(t, err)
	var target string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&target))
	poll(ctx, func() bool {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(flush_lsn >= $1::pg_lsn), false) FROM pg_stat_replication
			WHERE state = 'streaming' AND application_name = $2`, target, app).Scan(&ok)
		require.NoError(t, err, "the %s walsender did not confirm %s", app, target)
		return ok
	})
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers (a logger's).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
