package workflow_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The tests in this file hold pipelined tx phases (phases.Pipelined) to the engine's
// invariants: one effect per key, losers of the claim or the fence run none of the
// phase's statements, and the round trips the design promises.

// pipeSchema holds the pipelined flows' effects. The sequence is the witness that a
// statement ran on the server, even one whose transaction rolled back.
const pipeSchema = `
CREATE TABLE pipe_effects (
	id       bigserial PRIMARY KEY,
	scope    text NOT NULL,
	idem_key text NOT NULL,
	phase    text NOT NULL,
	n        bigint NOT NULL CHECK (n >= 0)
);`

var pipeTotal = phases.NewSlot[int64]("total")

// pipeFlow: reserve (pipelined, one round trip: an insert, phase data fixed up front),
// pay (a call phase that counts its calls in calls, and waits in gate when gate is not
// nil) and settle (pipelined, two round trips: an update returning a sum read by a
// callback, the answer decided by Then).
func pipeFlow(name string, calls *atomic.Int32, gate func()) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Pipelined("reserve", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			if strings.Contains(string(run.Body()), "bad") {
				return nil, phases.Fail(&phases.Response{Status: http.StatusBadRequest, Body: []byte("bad")})
			}
			p.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'reserve', $3)`,
				run.Scope(), run.Key(), int64(len(run.Body())))
			return nil, pipeTotal.Set(run, int64(len(run.Body())))
		}),
		phases.Call("pay", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			calls.Add(1)
			if gate != nil {
				gate()
			}
			return nil, nil
		}),
		phases.Pipelined("settle", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			total, err := pipeTotal.Get(run)
			if err != nil {
				return nil, err
			}
			var sum int64
			p.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'settle', $3)`,
				run.Scope(), run.Key(), total).Exec(phases.RowsAffected(1))
			p.Queue(`SELECT sum(n) FROM pipe_effects WHERE scope = $1 AND idem_key = $2`,
				run.Scope(), run.Key()).QueryRow(func(row pgx.Row) error { return row.Scan(&sum) })
			p.Then(func(run *phases.Run) (*phases.Response, error) {
				return phases.JSON(http.StatusCreated, map[string]any{"key": run.Key(), "sum": sum})
			})
			return nil, nil
		}),
	}}
}

// pipeSetup is a schema with the key table and pipe_effects, an engine on a pool whose
// statements a tracer counts, and pipeFlow registered as "pipe".
type pipeBundle struct {
	db     *pgtest.DB
	pool   *pgxpool.Pool
	engine *workflow.Engine
	trips  *tripCounter
	calls  atomic.Int32
}

func pipeSetup(t *testing.T, mode pgx.QueryExecMode, url string) *pipeBundle {
	t.Helper()
	b := &pipeBundle{db: pgtest.New(t), trips: &tripCounter{}}
	_, err := b.db.Pool.Exec(context.Background(), pipeSchema)
	require.NoError(t, err)
	if url == "" {
		url = b.db.URL
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.Tracer = b.trips
	b.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	b.engine, err = workflow.New(b.pool, nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.Register(pipeFlow("pipe", &b.calls, nil)))
	// The engine's one-time start-up check reads the key table's layout on its first
	// connection: run it before the round trips are counted.
	require.NoError(t, workflow.StartUp(context.Background(), b.engine))
	return b
}

// tripCounter counts round trips (a query or a batch each), the statements sent in
// them (all, and BEGINs), and the statements of the user's table, by text.
type tripCounter struct {
	trips  atomic.Int64
	stmts  atomic.Int64
	begins atomic.Int64
	mu     sync.Mutex
	user   int // statements on pipe_effects sent
	ran    int // statements on pipe_effects that the server ran without error
	// onResult, when set, is called with each statement's result of a batch as it is
	// read, before the next statement's is asked for.
	onResult atomic.Pointer[func(pgx.TraceBatchQueryData)]
}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.trips.Add(1)
	c.count(d.SQL)
	return ctx
}
func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	for _, q := range d.Batch.QueuedQueries {
		c.count(q.SQL)
	}
	return ctx
}
func (c *tripCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if fn := c.onResult.Load(); fn != nil {
		(*fn)(d)
	}
	if d.Err == nil && strings.Contains(d.SQL, "pipe_effects") {
		c.mu.Lock()
		c.ran++
		c.mu.Unlock()
	}
}
func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *tripCounter) count(sql string) {
	c.stmts.Add(1)
	if strings.HasPrefix(sql, "BEGIN") {
		c.begins.Add(1)
	}
	if strings.Contains(sql, "pipe_effects") {
		c.mu.Lock()
		c.user++
		c.mu.Unlock()
	}
}

// seqRuns is how many inserts into pipe_effects the server ran, committed or not.
func seqRuns(t *testing.T, db *pgtest.DB) int64 {
	t.Helper()
	var n int64
	var called bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT last_value, is_called FROM pipe_effects_id_seq`).Scan(&n, &called))
	if !called {
		return 0
	}
	return n
}

func pipeReq(key, body string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: "pipe", Method: "POST", Route: "/pipe", Body: []byte(body)}
}

// TestPipelinedRoundTrips: a fresh key of pipeFlow costs the look-up, one round trip
// for reserve and two for settle, and commits its effects once; a replay costs one.
// Reserve, in one round trip, is an implicit transaction of three statements (the
// claim lock, the key row's insert and the phase's insert: no BEGIN, no COMMIT);
// settle, in two, begins with BEGIN. In every query exec mode, straight on Postgres and
// through pgbouncer in transaction mode.
func TestPipelinedRoundTrips(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testPipelinedRoundTrips(t, pipeSetup(t, mode, ""))
		})
	}
	t.Run("Pgbouncer", func(t *testing.T) {
		t.Parallel()
		pgtest.RequirePgbouncer(t)
		p, err := pgtest.SharedPgbouncer(context.Background())
		require.NoError(t, err)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(mode.String(), func(t *testing.T) {
				db := pgtest.NewDatabase(t)
				b := &pipeBundle{db: db, trips: &tripCounter{}}
				_, err := db.Pool.Exec(context.Background(), pipeSchema)
				require.NoError(t, err)
				testPipelinedRoundTrips(t, pipeSetupOn(t, b, mode, p.URLFor(dbName(t, db), mode)))
			})
		}
	})
}

func dbName(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var name string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&name))
	return name
}

// pipeSetupOn is pipeSetup for a bundle whose database exists, through url.
func pipeSetupOn(t *testing.T, b *pipeBundle, mode pgx.QueryExecMode, url string) *pipeBundle {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.Tracer = b.trips
	b.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	b.engine, err = workflow.New(b.pool, nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.Register(pipeFlow("pipe", &b.calls, nil)))
	// The engine's one-time start-up check reads the key table's layout on its first
	// connection: run it before the round trips are counted.
	require.NoError(t, workflow.StartUp(context.Background(), b.engine))
	return b
}

func testPipelinedRoundTrips(t *testing.T, b *pipeBundle) {
	ctx := context.Background()
	// On Citus reserve, one round trip, goes with BEGIN and COMMIT too: a pipeline
	// without BEGIN is no transaction across its nodes (keytable's SendExplicit).
	var citus bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus))
	reserveBlock := 0
	if citus {
		reserveBlock = 1
	}
	for i := range 3 {
		key := fmt.Sprintf("rt%d", i)
		before, stmts, begins := b.trips.trips.Load(), b.trips.stmts.Load(), b.trips.begins.Load()
		res, err := b.engine.Do(ctx, pipeReq(key, `{"a":1}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.JSONEq(t, `{"key":"`+key+`","sum":14}`, string(res.Response.Body))
		require.EqualValues(t, 4, b.trips.trips.Load()-before, "look-up, reserve, settle's two")
		require.EqualValues(t, 1+3+4+2+2*reserveBlock, b.trips.stmts.Load()-stmts,
			"look-up; reserve's claim lock, key insert, insert (on Citus in BEGIN, COMMIT); settle's BEGIN, fence, insert, select; its finish, COMMIT")
		require.EqualValues(t, 1+reserveBlock, b.trips.begins.Load()-begins, "settle's BEGIN alone (and reserve's on Citus)")
		before = b.trips.trips.Load()
		again, err := b.engine.Do(ctx, pipeReq(key, `{"a":1}`))
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, res.Response.Body, again.Response.Body)
		require.EqualValues(t, 1, b.trips.trips.Load()-before, "a replay")
	}
	require.EqualValues(t, 6, seqRuns(t, b.db), "two inserts per key, each run once")
	require.EqualValues(t, 3, b.calls.Load())
}

// TestPipelinedCrashMatrix kills a real child process at every boundary of pipeFlow,
// including between settle's two round trips (its BeforeCommit: the statements ran,
// uncommitted), and recovers each key by a retry, a sweeper, and a sweeper after a
// killed sweeper: one reserve row and one settle row per key, and the answer sums them.
func TestPipelinedCrashMatrix(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, pipeSchema)
	var calls atomic.Int32
	flow := pipeFlow("pipe", &calls, nil)
	cases := 0
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    flow,
		Request: pipeReq("crash", `{"a":1}`),
		Check: func(t testing.TB, c *idemflowtest.Case) {
			cases++
			var reserve, settle int
			require.NoError(t, c.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE phase = 'reserve'),
				count(*) FILTER (WHERE phase = 'settle') FROM pipe_effects WHERE scope = $1 AND idem_key = $2`,
				c.Request.Scope, c.Request.Key).Scan(&reserve, &settle))
			require.Equal(t, [2]int{1, 1}, [2]int{reserve, settle}, "effects per key")
			require.Equal(t, http.StatusCreated, c.Answer.Status)
			require.JSONEq(t, `{"key":"`+c.Request.Key+`","sum":14}`, string(c.Answer.Body))
		},
	})
	require.Equal(t, len(idemflowtest.Boundaries(flow))*3, cases)
}
