package workflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/faultproxy"
	"github.com/idemflow/idemflow/internal/pgtest"
	"github.com/idemflow/idemflow/internal/testflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// Crash points: where the child process SIGKILLs itself.
var crashPoints = []string{
	"reserve/after-claim", // the claim lock is held, nothing of the phase ran
	"reserve/before-commit",
	"reserve/after-commit",
	"pay/before-call",
	"pay/after-call",
	"settle/before-commit",
	"settle/after-commit",
}

const (
	envCrashPoint = "IDEMFLOW_CRASH_POINT"
	envDBURL      = "IDEMFLOW_CRASH_DB_URL"
	envProvider   = "IDEMFLOW_CRASH_PROVIDER_URL"
	envKey        = "IDEMFLOW_CRASH_KEY"
)

// crashApp is the application_name of a crash child's sessions, so that the test can
// wait until the server has ended them (and with them the child's claim lock).
func crashApp(key string) string { return "idemflow-crash-" + key }

// crashHooks kill the process with SIGKILL at point: no deferred functions, no
// connection cleanup, exactly like a crash.
func crashHooks(point string) workflow.Hooks {
	die := func(at string) {
		if at == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	return workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				die(ev.Phase + "/before-call")
			}
			return ctx
		},
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) { die(ev.Phase + "/before-commit") },
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if err != nil {
				return
			}
			if ev.Kind == phases.KindCall {
				die(ev.Phase + "/after-call")
			} else {
				die(ev.Phase + "/after-commit")
			}
		},
	}
}

// runCrashChild runs one request in this process and dies at the crash point, when
// the test binary was started as a crash-matrix child. It reports whether it was.
func runCrashChild() bool {
	point := os.Getenv(envCrashPoint)
	if point == "" {
		return false
	}
	fail := func(msg string, err error) {
		fmt.Fprintf(os.Stderr, "crash child: %s: %v\n", msg, err)
		os.Exit(2)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDBURL))
	if err != nil {
		fail("parse database URL", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = crashApp(os.Getenv(envKey))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fail("connect", err)
	}
	e, err := workflow.New(pool, &workflow.Config{Hooks: crashHooks(point)})
	if err != nil {
		fail("engine", err)
	}
	// The first line of a tx phase runs right after the claim for a new key.
	before := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx != nil && point == run.Phase()+"/after-claim" {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	if err := e.Register(testflow.Flow(testflow.Options{ProviderURL: os.Getenv(envProvider), Before: before})); err != nil {
		fail("register", err)
	}
	_, err = e.Do(ctx, chargeReq("acct", os.Getenv(envKey), `{"amount":250}`))
	fail("the crash point "+point+" never fired; Do returned", err)
	return true
}

func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	for i, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			key := "crash-" + strconv.Itoa(i)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(),
				envCrashPoint+"="+point, envDBURL+"="+b.db.URL, envProvider+"="+b.provider.URL, envKey+"="+key)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "child output: %s", out)
			ws := ee.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child was not killed at %s: %s", point, out)
			waitSessionsGone(t, b.db, crashApp(key))

			var res *workflow.Result
			if point == "reserve/after-claim" || point == "reserve/before-commit" {
				// The key row is inserted at the first phase's commit: nothing is left,
				// and the claim lock died with the child's connection, so a retry
				// claims the key at once.
				require.Equal(t, "", keyRow(t, b.db, "acct", key))
				require.Equal(t, testflow.Effects{}, effects(t, b.db, "acct", key))
				res, err = b.engine.Do(ctx, chargeReq("acct", key, `{"amount":250}`))
				require.NoError(t, err)
			} else {
				if st := state(t, b.db, "acct", key); st.Status != "finished" {
					expireLease(t, b.db, "acct", key)
				}
				res, err = b.engine.Resume(ctx, "acct", key)
				require.NoError(t, err)
			}
			require.Equal(t, 201, res.Response.Status)
			requireOneEffect(t, b, "acct", key)

			var ans testflow.Answer
			require.NoError(t, json.Unmarshal(res.Response.Body, &ans))
			paid, ok := b.provider.Payment(mustID(t, b, "acct", key) + ":" + testflow.Pay)
			require.True(t, ok)
			require.Equal(t, paid, ans.PaymentID, "the answer names the one provider payment")

			replay, err := b.engine.Do(ctx, chargeReq("acct", key, `{"amount":250}`))
			require.NoError(t, err)
			require.True(t, replay.Replayed)
			require.Equal(t, res.Response.Body, replay.Response.Body)
		})
	}
	require.Equal(t, len(crashPoints), b.provider.Payments(), "one provider payment per key")
}

// proxiedPool opens a pool on the schema whose connections go through a fault proxy.
func proxiedPool(t *testing.T, b *bundle) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	proxy, err := faultproxy.New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil // the proxy reads plain protocol
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, proxy
}

func TestCommitAcknowledgementLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, phase := range []string{testflow.Reserve, testflow.Settle} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			pool, proxy := proxiedPool(t, b)
			var armed atomic.Bool
			var runs atomic.Int32
			e := b.newEngine(t, setupOpts{pool: pool, cfg: &workflow.Config{Hooks: workflow.Hooks{
				PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
					if ev.Phase == phase {
						runs.Add(1)
					}
					return ctx
				},
				BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
					if ev.Phase == phase && armed.CompareAndSwap(false, true) {
						proxy.DropNextCommitAck()
					}
				},
			}}})
			res, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
			require.NoError(t, err, "the engine re-reads the key and learns the commit happened")
			require.EqualValues(t, 1, proxy.Dropped(), "the fault fired")
			require.EqualValues(t, 1, runs.Load(), "the phase was not redone")
			require.Equal(t, 201, res.Response.Status)
			requireOneEffect(t, b, "acct", "k")

			replay, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
			require.NoError(t, err)
			require.True(t, replay.Replayed)
			require.Equal(t, res.Response.Body, replay.Response.Body)
		})
	}
}

func TestDatabaseGoneMidPhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var killed atomic.Bool
	e := b.newEngine(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Settle && killed.CompareAndSwap(false, true) {
			// the phase's own backend is terminated under it
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() WHERE $1::int > 0`, 1).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 1 WHERE $1::int > 0`, 1)
			return err
		}
		return nil
	}})
	_, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.True(t, killed.Load())
	st := state(t, b.db, "acct", "k")
	require.Equal(t, testflow.Pay, st.RecoveryPoint, "released with the call's result")
	require.False(t, st.Leased)

	res, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":3}`))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Payments())
}

// waitSessionsGone polls pg_stat_activity (the server has no hook for it) until no
// session named app is left: the server noticed that the killed child's connections
// closed and ended their transactions. Until then a dead child's claim lock can still
// turn a retry away.
func waitSessionsGone(t *testing.T, db *pgtest.DB, app string) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		if n == 0 {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("the sessions of %s did not end within 30s", app)
		case <-tick.C:
		}
	}
}
