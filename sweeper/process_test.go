package sweeper_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// Child processes: the test binary re-executed as childproc's program "sweeper", with
// these variables set.
const (
	envMode     = "IDEMFLOW_SWEEP_CHILD" // crash, loop, sweep or zombie
	envDBURL    = "IDEMFLOW_SWEEP_DB_URL"
	envProvider = "IDEMFLOW_SWEEP_PROVIDER_URL"
	envPoint    = "IDEMFLOW_SWEEP_CRASH_POINT"
	envNth      = "IDEMFLOW_SWEEP_CRASH_NTH" // the time the crash point is reached that fires (default the first)
	envScan     = "IDEMFLOW_SWEEP_SCAN"      // the engine's Config.Scan (default: the engine's choice)
	envApp      = "IDEMFLOW_SWEEP_APP"       // the application_name of the child's sessions (default pgx's)
	envKey      = "IDEMFLOW_SWEEP_KEY"
)

func init() { childproc.Register("sweeper", runChild) }

// loopConcurrency is the Concurrency of a loop child's sweeper.
const loopConcurrency = 4

// childLine is a line a child prints: an event (ready, paused, stats) and its stats.
type childLine struct {
	Event string
	Stats sweeper.Stats
}

// childPool is a child's pool on envDBURL, its sessions named envApp when set.
func childPool(ctx context.Context) *pgxpool.Pool {
	pcfg, err := pgxpool.ParseConfig(os.Getenv(envDBURL))
	if err != nil {
		childproc.Fail("connect", err)
	}
	if app := os.Getenv(envApp); app != "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		childproc.Fail("connect", err)
	}
	return pool
}

// runChild is a child process's work:
//
//   - crash: runs one charge and SIGKILLs itself at the crash point;
//   - loop: starts the engine's sweeper (Engine.Start, Concurrency 4) and SIGKILLs
//     itself at the crash point (the nth time it is reached) of a key the background
//     loop runs;
//   - sweep: prints ready, waits for a line on stdin, runs passes (Engine.Sweep)
//     until one takes nothing, prints the summed Stats;
//   - zombie: runs one pass whose settle phase prints paused and SIGSTOPs the
//     process before it starts, and prints the pass's Stats.
func runChild() {
	mode := os.Getenv(envMode)
	ctx := context.Background()
	pool := childPool(ctx)
	var hooks workflow.Hooks
	switch mode {
	case "crash", "loop":
		nth, _ := strconv.Atoi(os.Getenv(envNth))
		hooks = childproc.NewPoints(os.Getenv(envPoint), nth, func(string) { childproc.Kill() }).Hooks(hooks)
	case "zombie":
		hooks.PhaseStart = func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Phase == testflow.Settle {
				childproc.Emit(childLine{Event: "paused"})
				childproc.Stop() // returns after SIGCONT
			}
			return ctx
		}
	}
	cfg := &workflow.Config{Hooks: hooks, Scan: workflow.Scan(os.Getenv(envScan))}
	if mode == "sweep" || mode == "loop" {
		// A lease sized for a slow machine: a pass's workers reach the last keys it
		// took long after it took them when the cores are busy, and a key with too
		// little of its lease left is given back unrun, which the test counts as a fault.
		// A killed loop's keys must stay leased until the test ends their leases by
		// the database clock, however slowly the live sweepers around them run.
		cfg.Lease = 10 * time.Minute
	}
	e, err := workflow.New(pool, cfg)
	if err != nil {
		childproc.Fail("engine", err)
	}
	if err := registerFlows(e, os.Getenv(envProvider), nil); err != nil {
		childproc.Fail("register", err)
	}
	var total sweeper.Stats
	switch mode {
	case "crash":
		_, err := e.Do(ctx, chargeReq(os.Getenv(envKey)))
		childproc.Fail("the crash point never fired; Do returned", err)
	case "loop":
		if err := e.Start(ctx, &sweeper.Config{Grace: -1, Interval: time.Millisecond, Concurrency: loopConcurrency}); err != nil {
			childproc.Fail("start", err)
		}
		<-time.After(time.Minute) // a bound on a failure, not a wait for success
		childproc.Fail("the crash point never fired", errors.New("the background loop ran on"))
	case "sweep":
		childproc.Emit(childLine{Event: "ready"})
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			childproc.Fail("wait for go", err)
		}
		for {
			st, err := e.Sweep(ctx, nil)
			if err != nil {
				childproc.Fail("pass", err)
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
		total, err = e.Sweep(ctx, nil)
		if err != nil {
			childproc.Fail("pass", err)
		}
	default:
		childproc.Fail("unknown mode", errors.New(mode))
	}
	childproc.Emit(childLine{Event: "stats", Stats: total})
	pool.Close()
}

func startChild(t *testing.T, b *bundle, mode string, env ...string) *childproc.Child {
	t.Helper()
	env = append(env, childproc.Program("sweeper"), envMode+"="+mode, envDBURL+"="+b.db.URL, envProvider+"="+b.provider.URL)
	return childproc.Start(t, "^$", env...)
}

// waitSessionsGone waits until the server has ended every session named app: the
// backends of a killed child finish the statement they were running (a COMMIT sent
// before the kill still commits) and exit when they find its socket closed.
func waitSessionsGone(t *testing.T, b *bundle, app string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		if n == 0 {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("the sessions of %s did not end within a minute", app)
		case <-tick.C:
		}
	}
}

// event reads the child's next line and requires it to be the event want.
func event(t *testing.T, c *childproc.Child, want string) childLine {
	t.Helper()
	var l childLine
	c.Next(t, 2*time.Minute, &l)
	require.Equal(t, want, l.Event, "stderr:\n%s", c.Stderr())
	return l
}

// finalStats reads the Stats the child reports last, and waits for it to exit cleanly.
func finalStats(t *testing.T, c *childproc.Child) sweeper.Stats {
	t.Helper()
	st := event(t, c, "stats").Stats
	rest, err := c.Exit()
	require.NoError(t, err, "stderr:\n%s", c.Stderr())
	require.Empty(t, rest)
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
			killed, _ := ch.Killed(t)
			require.True(t, killed, "not killed at %s: %s", c.point, ch.Stderr())
			st := state(t, b.db, "k")
			require.Equal(t, c.want, st.RecoveryPoint)
			require.True(t, st.Leased)
			require.Equal(t, 1, b.provider.Made())

			s := b.newSweeper(t, nil)
			_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET created_at = statement_timestamp() - interval '1 hour'`)
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
			require.Equal(t, 1, b.provider.Made())
		})
	}
}

// TestStartedSweeperKilled: a process whose engine's sweeper (Engine.Start) is killed
// while its background loop holds a key (right after taking it over, after the
// provider's call, before the last commit) leaves the key leased; once the lease ends a
// pass of another process finishes it, with one effect.
func TestStartedSweeperKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, point := range []string{childproc.Swept, "pay/after-call", "settle/before-commit"} {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			b.stuck(t, chargeReq("k"), testflow.Pay)
			makeDue(t, b.db, "k")
			before := state(t, b.db, "k")
			ch := startChild(t, b, "loop", envPoint+"="+point)
			killed, _ := ch.Killed(t)
			require.True(t, killed, "not killed at %s: %s", point, ch.Stderr())
			st := state(t, b.db, "k")
			require.Equal(t, "in_progress", st.Status)
			require.Equal(t, testflow.Reserve, st.RecoveryPoint)
			require.True(t, st.Leased, "the dead process's takeover holds the key")
			require.Equal(t, before.LockVersion+1, st.LockVersion, "taken over once")

			makeDue(t, b.db, "k")
			stats, err := b.engine.Sweep(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
			requireOneEffect(t, b, "k", testflow.Pay)
			require.Equal(t, 1, b.provider.Made())
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
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET created_at = statement_timestamp() - interval '1 hour',
		next_attempt_at = statement_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	var atReserve, atPay int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE recovery_point = 'reserve'),
		count(*) FILTER (WHERE recovery_point = 'pay') FROM idemflow_keys WHERE status = 'in_progress' AND locked_until IS NULL`).
		Scan(&atReserve, &atPay))
	require.Equal(t, keys/2, atReserve)
	require.Equal(t, keys/2, atPay)
	require.Equal(t, keys/2, b.provider.Made())
	t.Logf("%d stuck keys made in %s", keys, time.Since(start))

	start = time.Now()
	children := make([]*childproc.Child, procs)
	for i := range children {
		children[i] = startChild(t, b, "sweep")
	}
	for _, c := range children {
		event(t, c, "ready")
	}
	for _, c := range children { // all at once, so that each gets a share
		c.Send(t, "go")
	}
	var total sweeper.Stats
	for i, c := range children {
		st := finalStats(t, c)
		t.Logf("sweeper process %d: %+v", i, st)
		require.Positive(t, st.Finished, "process %d finished nothing", i)
		require.Zero(t, st.LeaseLost+st.Released+st.DeadLettered+st.GivenBack+st.Parked, "process %d: %+v", i, st)
		total.Taken += st.Taken
		total.Finished += st.Finished
	}
	t.Logf("%d sweeper processes finished %d keys in %s", procs, total.Finished, time.Since(start))
	require.Equal(t, keys, total.Taken, "every key taken once")
	require.Equal(t, keys, total.Finished, "every key finished once")

	requireEachKeyOnce(t, b, keys)
}

// requireEachKeyOnce checks that each of the keys keys is finished with 201, with one
// ledger row, settled, one settlement and one provider payment under its derived key.
func requireEachKeyOnce(t *testing.T, b *bundle, keys int) {
	t.Helper()
	ctx := context.Background()
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

	require.Equal(t, keys, b.provider.Made(), "one provider payment per key")
	rows, err := b.db.Pool.Query(ctx, `SELECT id::text FROM idemflow_keys`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		_, paid := b.provider.Effect(id + ":" + testflow.Pay)
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
	event(t, zombie, "paused")
	zombie.Paused(t)
	taken := state(t, b.db, "k")
	require.True(t, taken.Leased)
	require.Equal(t, stuck.LockVersion+1, taken.LockVersion, "the zombie holds the key")
	require.Equal(t, 1, b.provider.Made(), "the zombie paid")

	// Its lease runs out (by the database clock) while it is paused.
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET locked_until = statement_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	stats, err := b.newSweeper(t, nil).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 1, Finished: 1}, stats)
	requireOneEffect(t, b, "k", testflow.Pay)
	finished := keyRow(t, b.db, "k")

	zombie.Continue(t)
	zst := finalStats(t, zombie)
	require.Equal(t, sweeper.Stats{Taken: 1, LeaseLost: 1}, zst, "the zombie's commit was fenced off")
	require.Equal(t, finished, keyRow(t, b.db, "k"), "the zombie changed nothing")
	requireOneEffect(t, b, "k", testflow.Pay)
	require.Equal(t, 1, b.provider.Made())
}
