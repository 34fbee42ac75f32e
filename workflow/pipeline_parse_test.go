package workflow_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// parseShapes are the phase shapes whose first round trip carries a new key's claim
// ahead of a statement on the user's table: a pipelined phase in one round trip (an
// implicit transaction), one in two (its statement has a callback), and a Go-code
// phase whose claim rides with its first statement (Config.ClaimWithFirstStatement).
var parseShapes = []string{"parse_one", "parse_two", "parse_go"}

const parseInsert = `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'parse', 1)`

// parseFlow is the one-phase flow of shape name, which inserts into pipe_effects.
func parseFlow(name string) phases.Flow {
	var p phases.Phase
	switch name {
	case "parse_one":
		p = phases.Pipelined("insert", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(parseInsert, run.Scope(), run.Key())
			return phases.JSON(http.StatusCreated, "one")
		})
	case "parse_two":
		p = phases.Pipelined("insert", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(parseInsert, run.Scope(), run.Key()).Exec(phases.RowsAffected(1))
			p.Then(func(*phases.Run) (*phases.Response, error) { return phases.JSON(http.StatusCreated, "two") })
			return nil, nil
		})
	default:
		p = phases.Tx("insert", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if _, err := tx.Exec(ctx, parseInsert, run.Scope(), run.Key()); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, "go")
		})
	}
	return phases.Flow{Name: name, Phases: []phases.Phase{p}}
}

// parseEngine is an engine with the parse flows on a pool of its own, of at most
// conns connections, on url in mode: a connection that has prepared nothing yet.
func parseEngine(t *testing.T, url string, mode pgx.QueryExecMode, conns int32, learn bool) *workflow.Engine {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = conns
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := workflow.New(pool, &workflow.Config{ClaimWithFirstStatement: true})
	require.NoError(t, err)
	for _, name := range parseShapes {
		require.NoError(t, e.Register(parseFlow(name)))
	}
	if learn { // else the engine claims as on a key table of unknown layout
		require.NoError(t, workflow.StartUp(context.Background(), e))
	}
	return e
}

// TestLosersParseNothing (issue 36, hole 7): while a winner holds a key's claim and
// its first statement waits for a lock on the user's table (a test transaction holds
// it in ACCESS EXCLUSIVE mode, as a migration would), every loser, each on a
// connection that has prepared nothing, answers 409 at once, in every pgx query exec
// mode, straight on Postgres and through pgbouncer in transaction mode. The lock is
// released only once every loser answered, so a loser that sent a Parse of the user's
// statement (which takes its locks) could never answer: and pg_locks, watched until
// they all did, shows no backend but the winners' waiting on the table.
func TestLosersParseNothing(t *testing.T) {
	t.Parallel()
	all := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	}
	for _, mode := range all {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			_, err := db.Pool.Exec(context.Background(), pipeSchema)
			require.NoError(t, err)
			testLosersParseNothing(t, db, db.URL, mode)
		})
	}
	t.Run("Pgbouncer", func(t *testing.T) {
		t.Parallel()
		pgtest.RequirePgbouncer(t)
		// The modes valid there: pgx's default keeps named statements, which pgbouncer
		// 1.18 hands from one client to another (pooltest's TestWrongExecMode), and
		// describe-exec describes a statement in a transaction of its own, which
		// pgbouncer may send to another server connection than its execution.
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(mode.String(), func(t *testing.T) {
				t.Parallel()
				p := pgtest.NewPooled(t)
				_, err := p.Direct.Pool.Exec(context.Background(), pipeSchema)
				require.NoError(t, err)
				testLosersParseNothing(t, p.Direct, p.Pgbouncer.URLFor(p.Database, mode), mode)
			})
		}
	})
}

// testLosersParseNothing: winners straight on db, losers at loserURL in mode; db's
// pool looks at pg_locks and holds the table's lock.
func testLosersParseNothing(t *testing.T, db *pgtest.DB, loserURL string, mode pgx.QueryExecMode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // only a hung test reaches it
	defer cancel()
	// The winners' mode sends the claim and the statement in one pipeline whatever the
	// connection prepared, so a winner holds the claim when it waits for the table.
	admin := db.Pool
	winner := parseEngine(t, db.URL, pgx.QueryExecModeExec, int32(len(parseShapes)), true)
	for _, flow := range parseShapes {
		res, err := winner.Do(ctx, flowReq(flow, "acct", "warm-"+flow, bodyA))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
	}

	holder, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(context.Background())
	_, err = holder.Exec(ctx, `LOCK TABLE pipe_effects IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	won := make(chan error, len(parseShapes))
	for _, flow := range parseShapes {
		go func() {
			res, err := winner.Do(ctx, flowReq(flow, "acct", "k-"+flow, bodyA))
			if err == nil && res.Response.Status != http.StatusCreated {
				err = fmt.Errorf("%s: winner answered %d", flow, res.Response.Status)
			}
			won <- err
		}()
	}
	waiting := func() []string { return tableWaiters(t, ctx, admin) }
	tick := time.NewTicker(10 * time.Millisecond) // polls the database's state
	defer tick.Stop()
	for len(waiting()) < len(parseShapes) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the winners never waited for the table's lock: %q", waiting())
		}
	}

	const perShape = 2
	answers := make(chan error, perShape*len(parseShapes))
	for i := range perShape {
		for _, flow := range parseShapes {
			loser := parseEngine(t, loserURL, mode, 1, i%2 == 0)
			go func() {
				_, err := loser.Do(ctx, flowReq(flow, "acct", "k-"+flow, bodyA))
				answers <- err
			}()
		}
	}
	for n := 0; n < cap(answers); {
		select {
		case err := <-answers:
			n++
			ip, ok := isInProgress(err)
			require.True(t, ok, "a loser answers 409 while the winner holds the claim, not %v", err)
			require.GreaterOrEqual(t, ip.RetryAfter, time.Second)
		case <-ctx.Done():
			t.Fatalf("%d losers of %d answered while the table's lock was held; waiting for it: %q",
				n, cap(answers), waiting())
		case <-tick.C:
			w := waiting()
			require.Len(t, w, len(parseShapes), "only the winners wait for the table's lock: %q", w)
		}
	}

	require.NoError(t, holder.Rollback(ctx))
	for range parseShapes {
		require.NoError(t, <-won)
	}
	var rows int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pipe_effects`).Scan(&rows))
	require.EqualValues(t, 2*len(parseShapes), rows, "the warm-ups and the winners, once each")
	require.EqualValues(t, rows, seqRuns(t, db), "no loser's insert ran, not even rolled back")
}

// tableWaiters are the statements of the backends waiting for a lock on pipe_effects.
func tableWaiters(t *testing.T, ctx context.Context, admin *pgxpool.Pool) []string {
	t.Helper()
	rows, err := admin.Query(ctx, `SELECT coalesce(a.query, '') FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE NOT l.granted AND l.relation = 'pipe_effects'::regclass`)
	require.NoError(t, err)
	q, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for i := range q {
		q[i] = strings.Join(strings.Fields(q[i]), " ")
	}
	return q
}

// fenceFlow: an insert into pipe_effects, a call phase that waits in gate the first
// time, and a second insert, in pipelined phases (pipelined) or Go-code ones.
func fenceFlow(name string, pipelined bool, gate func()) phases.Flow {
	insert := func(phase string) phases.Phase {
		sql := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, '` + phase + `', 1)`
		if pipelined {
			return phases.Pipelined(phase, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
				p.Queue(sql, run.Scope(), run.Key())
				if phase == "settle" {
					return phases.JSON(http.StatusCreated, "settled")
				}
				return nil, nil
			})
		}
		return phases.Tx(phase, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if _, err := tx.Exec(ctx, sql, run.Scope(), run.Key()); err != nil {
				return nil, err
			}
			if phase == "settle" {
				return phases.JSON(http.StatusCreated, "settled")
			}
			return nil, nil
		})
	}
	return phases.Flow{Name: name, Phases: []phases.Phase{
		insert("reserve"),
		phases.Call("pay", func(context.Context, *phases.Run) (*phases.Response, error) { gate(); return nil, nil }),
		insert("settle"),
	}}
}

// TestFenceLoserParsesNothing: an executor whose lease was taken over while it was in
// a call phase goes on to a tx phase whose statement its connection has not prepared,
// while another transaction holds an ACCESS EXCLUSIVE lock on the statement's table
// (released only once the executor answered): its fence (a pipelined phase's) or its
// fence's check (a Go-code phase's) refuses it at once, and the server never parsed
// the statement, which would have waited for the lock. In every query exec mode.
func TestFenceLoserParsesNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		for _, shape := range []string{"Pipelined", "GoCode"} {
			t.Run(mode.String()+"/"+shape, func(t *testing.T) {
				t.Parallel()
				testFenceLoserParsesNothing(t, mode, shape == "Pipelined")
			})
		}
	}
}

func testFenceLoserParsesNothing(t *testing.T, mode pgx.QueryExecMode, pipelined bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // only a hung test reaches it
	defer cancel()
	b := pipeSetup(t, pgx.QueryExecModeExec, "")
	require.NoError(t, b.engine.Register(fenceFlow("fence", pipelined, func() {})))
	inside, gate := make(chan struct{}), make(chan struct{})
	stale := parseEngine(t, b.db.URL, mode, 1, true)
	require.NoError(t, stale.Register(fenceFlow("fence", pipelined, func() { close(inside); <-gate })))
	done := make(chan error, 1)
	go func() {
		_, err := stale.Do(ctx, flowReq("fence", "acct", "stale", bodyA))
		done <- err
	}()
	<-inside
	expireLease(t, b.db, "acct", "stale")
	res, err := b.engine.Resume(ctx, "acct", "stale")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)

	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(context.Background())
	_, err = holder.Exec(ctx, `LOCK TABLE pipe_effects IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	close(gate)
	tick := time.NewTicker(10 * time.Millisecond) // polls the database's state
	defer tick.Stop()
	for answered := false; !answered; {
		select {
		case err := <-done:
			require.ErrorIs(t, err, workflow.ErrLeaseLost)
			answered = true
		case <-tick.C:
			w := tableWaiters(t, ctx, b.db.Pool)
			require.Empty(t, w, "the stale executor waits for the table's lock: %q", w)
		case <-ctx.Done():
			t.Fatalf("the stale executor did not answer while the table's lock was held")
		}
	}
	require.NoError(t, holder.Rollback(ctx))
	require.EqualValues(t, 2, seqRuns(t, b.db), "reserve once, settle once (the new owner's)")
}
