package sweeper_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/workflow"
)

// Child processes: the test binary re-executed with these variables set. TestMain runs
// the child instead of the tests.
const (
	envMode     = "IDEMFLOW_SWEEP_CHILD" // crash, sweep or zombie
	envDBURL    = "IDEMFLOW_SWEEP_DB_URL"
	envProvider = "IDEMFLOW_SWEEP_PROVIDER_URL"
	envPoint    = "IDEMFLOW_SWEEP_CRASH_POINT"
	envKey      = "IDEMFLOW_SWEEP_KEY"
)

// crashHooks SIGKILL the process at point: no deferred functions, no connection
// cleanup, exactly like a crash.
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

// runChild runs this process as a child, if it was started as one, and reports whether
// it was:
//
//   - crash: runs one charge and SIGKILLs itself at the crash point;
//   - sweep: prints "ready", waits for a line on stdin, runs RunOnce until a pass takes
//     nothing, prints the summed Stats as JSON;
//   - zombie: runs one RunOnce whose settle phase prints "paused" and SIGSTOPs the
//     process before it starts, and prints the pass's Stats as JSON.
func runChild() bool {
	mode := os.Getenv(envMode)
	if mode == "" {
		return false
	}
	fail := func(msg string, err error) {
		fmt.Fprintf(os.Stderr, "%s child: %s: %v\n", mode, msg, err)
		os.Exit(2)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envDBURL))
	if err != nil {
		fail("connect", err)
	}
	var hooks workflow.Hooks
	switch mode {
	case "crash":
		hooks = crashHooks(os.Getenv(envPoint))
	case "zombie":
		hooks.PhaseStart = func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Phase == testflow.Settle {
				fmt.Println("paused")
				// A signal aimed at this thread stops it before its next step; a
				// process-directed one may be taken by another thread while this one
				// runs on through a commit. Returns after SIGCONT.
				runtime.LockOSThread()
				_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
				runtime.UnlockOSThread()
			}
			return ctx
		}
	}
	e, err := workflow.New(pool, &workflow.Config{Hooks: hooks})
	if err != nil {
		fail("engine", err)
	}
	if err := registerFlows(e, os.Getenv(envProvider), nil); err != nil {
		fail("register", err)
	}
	s, err := sweeper.New(e, nil)
	if err != nil {
		fail("sweeper", err)
	}
	var total sweeper.Stats
	switch mode {
	case "crash":
		_, err := e.Do(ctx, chargeReq(os.Getenv(envKey)))
		fail("the crash point never fired; Do returned", err)
	case "sweep":
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fail("wait for go", err)
		}
		for {
			st, err := s.RunOnce(ctx)
			if err != nil {
				fail("pass", err)
			}
			total.Taken += st.Taken
			total.Finished += st.Finished
			total.Released += st.Released
			total.DeadLettered += st.DeadLettered
			total.LeaseLost += st.LeaseLost
			total.GivenBack += st.GivenBack
			total.Parked += st.Parked
			if st.Taken == 0 {
				break
			}
		}
	case "zombie":
		total, err = s.RunOnce(ctx)
		if err != nil {
			fail("pass", err)
		}
	default:
		fail("unknown mode", errors.New(mode))
	}
	if err := json.NewEncoder(os.Stdout).Encode(total); err != nil {
		fail("report", err)
	}
	pool.Close()
	os.Exit(0)
	return true
}

// child is a child process with pipes to its stdin and stdout.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	stderr *bytes.Buffer
}

func startChild(t *testing.T, b *bundle, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envDBURL+"="+b.db.URL, envProvider+"="+b.provider.URL)
	cmd.Env = append(cmd.Env, env...)
	c := &child{cmd: cmd, stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	var err error
	c.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	c.stdout = bufio.NewScanner(out)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // the test failed before waiting for it
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// line reads the child's next line of output.
func (c *child) line(t *testing.T) string {
	t.Helper()
	if !c.stdout.Scan() {
		_ = c.cmd.Wait()
		t.Fatalf("child ended without output (%v); stderr:\n%s", c.stdout.Err(), c.stderr)
	}
	return c.stdout.Text()
}

// stats reads the Stats the child reports last, and waits for it to exit cleanly.
func (c *child) stats(t *testing.T) sweeper.Stats {
	t.Helper()
	var st sweeper.Stats
	require.NoError(t, json.Unmarshal([]byte(c.line(t)), &st))
	require.NoError(t, c.cmd.Wait(), "stderr:\n%s", c.stderr)
	return st
}

// A process killed mid-flow leaves its key leased: the sweeper leaves it alone until the
// lease ends, then finishes it with one effect.
func TestRunOnceAfterCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct{ point, want string }{
		{"pay/after-call", testflow.Reserve},       // paid at the provider, not recorded
		{"settle/before-commit", testflow.Reserve}, // paid, settle not committed
	} {
		t.Run(strings.ReplaceAll(c.point, "/", "_"), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			ch := startChild(t, b, "crash", envPoint+"="+c.point, envKey+"=k")
			err := ch.cmd.Wait()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "stderr: %s", ch.stderr)
			ws := ee.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "not killed at %s: %s", c.point, ch.stderr)
			st := state(t, b.db, "k")
			require.Equal(t, c.want, st.RecoveryPoint)
			require.True(t, st.Leased)
			require.Equal(t, 1, b.provider.Payments())

			s := b.newSweeper(t, nil)
			_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET created_at = clock_timestamp() - interval '1 hour'`)
			require.NoError(t, err)
			before := keyRow(t, b.db, "k")
			stats, err := s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.Stats{}, stats, "the dead process's lease has not ended yet")
			require.Equal(t, before, keyRow(t, b.db, "k"))

			makeDue(t, b.db, "k")
			stats, err = s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
			requireOneEffect(t, b, "k", testflow.Pay)
			require.Equal(t, 1, b.provider.Payments())
		})
	}
}

// Four sweeper processes, each with its own pool, over a thousand stuck keys at two
// recovery points: every key is finished exactly once.
func TestManySweeperProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	const keys, procs = 1000, 4
	key := func(i int) string { return fmt.Sprintf("m-%04d", i) }
	// Even keys fail before paying (stuck at reserve), odd ones after (stuck at pay).
	b.fail.setAll(func(k, phase string) bool {
		i, _ := strconv.Atoi(strings.TrimPrefix(k, "m-"))
		return (i%2 == 0 && phase == testflow.Pay) || (i%2 == 1 && phase == testflow.Settle)
	})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, keys)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < keys; i += 8 {
				if _, err := b.engine.Do(ctx, chargeReq(key(i))); !errors.Is(err, workflow.ErrTransient) {
					errs <- fmt.Errorf("key %d: want a transient failure, got %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	b.fail.setAll(nil)
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET created_at = clock_timestamp() - interval '1 hour',
		next_attempt_at = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	var atReserve, atPay int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE recovery_point = 'reserve'),
		count(*) FILTER (WHERE recovery_point = 'pay') FROM idemflow_keys WHERE status = 'in_progress' AND locked_until IS NULL`).
		Scan(&atReserve, &atPay))
	require.Equal(t, keys/2, atReserve)
	require.Equal(t, keys/2, atPay)
	require.Equal(t, keys/2, b.provider.Payments())
	t.Logf("%d stuck keys made in %s", keys, time.Since(start))

	start = time.Now()
	children := make([]*child, procs)
	for i := range children {
		children[i] = startChild(t, b, "sweep")
	}
	for _, c := range children {
		require.Equal(t, "ready", c.line(t))
	}
	for _, c := range children { // all at once, so that each gets a share
		_, err := io.WriteString(c.stdin, "go\n")
		require.NoError(t, err)
	}
	var total sweeper.Stats
	for i, c := range children {
		st := c.stats(t)
		t.Logf("sweeper process %d: %+v", i, st)
		require.Positive(t, st.Finished, "process %d finished nothing", i)
		require.Zero(t, st.LeaseLost+st.Released+st.DeadLettered+st.GivenBack+st.Parked, "process %d: %+v", i, st)
		total.Taken += st.Taken
		total.Finished += st.Finished
	}
	t.Logf("%d sweeper processes finished %d keys in %s", procs, total.Finished, time.Since(start))
	require.Equal(t, keys, total.Taken, "every key taken once")
	require.Equal(t, keys, total.Finished, "every key finished once")

	var left, badLedger, badSettled, badSettlements int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM idemflow_keys WHERE status <> 'finished' OR response_status <> 201),
		(SELECT count(*) FROM (SELECT idem_key FROM ledger GROUP BY idem_key HAVING count(*) <> 1) x)
			+ abs((SELECT count(DISTINCT idem_key) FROM ledger) - $1),
		(SELECT count(*) FROM ledger WHERE status <> 'settled'),
		(SELECT count(*) FROM ledger l WHERE (SELECT count(*) FROM settlements s WHERE s.ledger_id = l.id) <> 1)`, keys).
		Scan(&left, &badLedger, &badSettled, &badSettlements))
	require.Zero(t, left, "keys not finished with 201")
	require.Zero(t, badLedger, "keys without exactly one ledger row")
	require.Zero(t, badSettled, "ledger rows not settled")
	require.Zero(t, badSettlements, "ledger rows without exactly one settlement")

	require.Equal(t, keys, b.provider.Payments(), "one provider payment per key")
	rows, err := b.db.Pool.Query(ctx, `SELECT id::text FROM idemflow_keys`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		_, paid := b.provider.Payment(id + ":" + testflow.Pay)
		require.True(t, paid, "no payment for derived key of %s", id)
	}
	require.NoError(t, rows.Err())
}

// A sweeper process paused (SIGSTOP) mid-flow past its lease, whose key another sweeper
// then finishes, changes nothing when it resumes: its commit is fenced off.
func TestZombieSweeper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.stuck(t, chargeReq("k"), testflow.Pay)
	makeDue(t, b.db, "k")
	stuck := state(t, b.db, "k")

	zombie := startChild(t, b, "zombie")
	require.Equal(t, "paused", zombie.line(t))
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(zombie.cmd.Process.Pid, &ws, syscall.WUNTRACED, nil)
		if !errors.Is(err, syscall.EINTR) {
			require.NoError(t, err)
			break
		}
	}
	require.True(t, ws.Stopped(), "the child stopped itself (status %v)", ws)
	taken := state(t, b.db, "k")
	require.True(t, taken.Leased)
	require.Equal(t, stuck.LockVersion+1, taken.LockVersion, "the zombie holds the key")
	require.Equal(t, 1, b.provider.Payments(), "the zombie paid")

	// Its lease runs out (by the database clock) while it is paused.
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET locked_until = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	stats, err := b.newSweeper(t, nil).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
	requireOneEffect(t, b, "k", testflow.Pay)
	finished := keyRow(t, b.db, "k")

	require.NoError(t, syscall.Kill(zombie.cmd.Process.Pid, syscall.SIGCONT))
	zst := zombie.stats(t)
	require.Equal(t, sweeper.Stats{Taken: 1, LeaseLost: 1}, zst, "the zombie's commit was fenced off")
	require.Equal(t, finished, keyRow(t, b.db, "k"), "the zombie changed nothing")
	requireOneEffect(t, b, "k", testflow.Pay)
	require.Equal(t, 1, b.provider.Payments())
}
