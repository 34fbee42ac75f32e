package matrix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// guard bounds every wait of a cell. Answers come in milliseconds; the guard only
// turns an engine that makes an attempt wait on another into a failure, not a hang.
const guard = time.Minute

// Request bodies: bodyB is another request under the same key.
const (
	bodyA = `{"amount":100}`
	bodyB = `{"amount":999}`
)

// rig is one cell's world: a schema of its own (the key table in the cell's layout,
// the effect table), a fake remote, the race's hold, and the engines.
type rig struct {
	t      *testing.T
	c      cell
	ctx    context.Context
	db     *pgtest.DB // the schema, straight on the server (search_path set)
	app    string     // application_name of the engines' connections
	remote *idemflowtest.Remote
	deps   *deps
	key    string // the race's key
	gate   int32  // the second half of the advisory lock the key table's trigger waits for
}

// gateClass is the first half of the advisory lock of gateSQL's trigger (the engine's
// claim lock is a one-argument advisory lock: no clash).
const gateClass = 0x6d61

// gateSQL is a trigger on the key table of schema %[1]s that waits, before every
// insert of a key row, for the advisory lock (%[2]d, %[3]d), shared: at once, unless
// the test holds it (lockKeyInserts). It runs after the insert's statement took its
// snapshot and made its checks, so that a race of inserts is decided by what the
// claim locks, not by which insert happened to commit first.
const gateSQL = `CREATE FUNCTION %[1]s.m_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock_shared(%[2]d, %[3]d);
	RETURN NEW;
END $$;
CREATE TRIGGER m_gate BEFORE INSERT ON %[1]s.idemflow_keys FOR EACH ROW EXECUTE FUNCTION %[1]s.m_gate();`

func newRig(t *testing.T, c cell) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*guard)
	t.Cleanup(cancel)
	db := pgtest.New(t)
	if c.partitioned() {
		require.NoError(t, store.New().SetupPartitioned(ctx, db.Pool, store.PartitionDay, 0))
	}
	schema := pgx.Identifier{db.Schema}.Sanitize()
	r := &rig{t: t, c: c, ctx: ctx, db: db, app: "m_" + db.Schema, remote: idemflowtest.NewRemote(t, nil), key: "race", gate: rand.Int32()}
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(effectsSQL, schema))
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(gateSQL, schema, gateClass, r.gate))
	require.NoError(t, err)
	r.deps = &deps{
		insert: `INSERT INTO ` + schema + `.m_effects (scope, key, phase, row_id) VALUES ($1, $2, $3, $4)`,
		hold:   newHold(r.key), remote: r.remote.URL, ctx: ctx,
	}
	return r
}

// engineOn is one engine of a cell on a pool of its own, as another process's.
type engineOn struct {
	name    string
	pool    *pgxpool.Pool
	engine  *workflow.Engine
	handler http.Handler // the middleware around the plain handler (shapeMiddleware)
	crash   atomic.Pointer[workflow.Hooks]
	cut     *cutFirst // the layout-check saboteur (layoutUnlearnt), or nil
	bar     *barrier  // holds claims back in stage A
}

// newEngine opens a pool in the cell's exec mode, straight or through pgbouncer, and an
// engine on it with the cell's flow. With layoutUnlearnt the pool's first statement
// (the engine's start-up check of the key table's layout) has its connection
// terminated, and a first request is sent to make that happen.
func (r *rig) newEngine(name string) *engineOn {
	t := r.t
	t.Helper()
	e := &engineOn{name: name}
	connURL := r.db.URL
	if r.c.pooled {
		p, err := pgtest.SharedPgbouncer(r.ctx)
		require.NoError(t, err)
		u, err := url.Parse(r.db.URL)
		require.NoError(t, err)
		connURL = p.URLFor(strings.TrimPrefix(u.Path, "/"), 0) // no search_path: Config.Schema names the schema
	}
	cfg, err := pgxpool.ParseConfig(connURL)
	require.NoError(t, err)
	cfg.MaxConns = 6
	cfg.ConnConfig.DefaultQueryExecMode = r.c.mode
	cfg.ConnConfig.RuntimeParams["application_name"] = r.app
	e.bar = newBarrier(r.ctx)
	tr := &tracer{bar: e.bar}
	if r.c.layout == layoutUnlearnt {
		e.cut = &cutFirst{admin: r.db.Pool, pooled: r.c.pooled}
		tr.cut = e.cut
	}
	cfg.ConnConfig.Tracer = tr
	e.pool, err = pgxpool.NewWithConfig(r.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(e.pool.Close)
	e.engine, err = workflow.New(e.pool, &workflow.Config{Schema: r.db.Schema, Hooks: e.crashHooks()})
	require.NoError(t, err)
	require.NoError(t, e.engine.Register(shapeFlow("", nil)))
	if r.c.shape == shapeMiddleware {
		mw, err := idemhttp.Middleware(e.engine, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "acct", nil }})
		require.NoError(t, err)
		e.handler = mw(http.HandlerFunc(r.plainHandler(e.pool)))
	} else {
		require.NoError(t, e.engine.Register(shapeFlow(r.c.shape, r.deps)))
	}
	if e.cut != nil {
		r.prime(e)
	}
	return e
}

// prime sends the engine's first request, whose connection the saboteur cuts under
// the start-up check: the engine has not learnt the layout. The request's own answer
// may be a retryable failure (its connection is gone) or, if the engine recovers, its
// answer; no final answer other than the flow's is acceptable.
func (r *rig) prime(e *engineOn) {
	t := r.t
	t.Helper()
	res, err := e.engine.Do(r.ctx, workflow.Request{Scope: "acct", Key: "prime-" + e.name, Flow: "m_prime", Method: "POST", Route: "/prime", Body: []byte(`{}`)})
	require.True(t, e.cut.fired.Load(), "%s: the first statement's connection was cut", e.name)
	require.True(t, e.cut.failed.Load(), "%s: the start-up check on the cut connection failed", e.name)
	if err != nil {
		var te *workflow.TransientError
		require.True(t, errors.Is(err, workflow.ErrUnavailable) || errors.As(err, &te), "%s: the first request on a cut connection: %v", e.name, err)
		return
	}
	require.Equal(t, http.StatusOK, res.Response.Status)
}

// plainHandler is the handler under idemhttp.Middleware: it writes its effect on a
// connection of its own (outside the engine's transactions), then answers 201.
func (r *rig) plainHandler(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		key := strings.Trim(req.Header.Get("Idempotency-Key"), `"`)
		body, _ := io.ReadAll(req.Body)
		if _, err := pool.Exec(req.Context(), r.deps.insert, "acct", key, middlewarePhaseID, ""); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // not stored: the key is released
			return
		}
		if err := r.deps.hold.enter(req.Context(), key); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answerBody(key, body))
	}
}

// crashHooks run the hooks of the crash point armed on e (e.crash), if any.
func (e *engineOn) crashHooks() workflow.Hooks {
	return workflow.Hooks{
		ClaimHeld: func(ctx context.Context, ev workflow.PhaseEvent) {
			if h := e.crash.Load(); h != nil {
				h.ClaimHeld(ctx, ev)
			}
		},
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if h := e.crash.Load(); h != nil {
				return h.PhaseStart(ctx, ev)
			}
			return ctx
		},
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) {
			if h := e.crash.Load(); h != nil {
				h.BeforeCommit(ctx, ev)
			}
		},
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if h := e.crash.Load(); h != nil {
				h.PhaseEnd(ctx, ev, err)
			}
		},
		Key: func(ctx context.Context, ev workflow.KeyEvent) {
			if h := e.crash.Load(); h != nil {
				h.Key(ctx, ev)
			}
		},
	}
}

// crash abandons an attempt of the race's key at the cell's crash point, in this
// process (as idemflowtest's in-process crash matrix does: a panic from the engine's
// hook at the boundary, recovered here), on an engine that is used for nothing else;
// then it moves a lease the attempt left past by the database clock, as a crashed
// holder's runs out.
func (r *rig) crash(e *engineOn) {
	t := r.t
	t.Helper()
	type abandoned struct{ at string }
	pts := childproc.NewPoints(r.c.crash, 0, func(at string) { panic(abandoned{at}) })
	h := pts.Hooks(workflow.Hooks{})
	e.crash.Store(&h)
	defer e.crash.Store(nil)
	var a answer
	fired := func() (at string) {
		defer func() {
			if v := recover(); v != nil {
				ab, ok := v.(abandoned)
				if !ok {
					panic(v)
				}
				at = ab.at
			}
		}()
		a = r.send(e, bodyA)
		return ""
	}()
	require.NotEmpty(t, fired, "the attempt never reached %s; it answered %s", r.c.crash, a)
	if k, ok := idemflowtest.LookupKey(t, r.db.Pool, "acct", r.key); ok && k.Status == "in_progress" {
		idemflowtest.ExpireLease(t, r.db.Pool, "acct", r.key)
	}
}

// warm sends fresh keys of the shape through e, as many at once as the pool has
// connections, so that its connections have sent (and, in the caching modes,
// prepared) the flow's statements.
func (r *rig) warm(e *engineOn) {
	t := r.t
	t.Helper()
	n := int(e.pool.Config().MaxConns)
	out := make(chan answer, n)
	for i := range n {
		go func() { out <- r.sendKey(e, fmt.Sprintf("warm-%s-%d", e.name, i), bodyA) }()
	}
	for range n {
		a := <-out
		require.Equal(t, "fresh", a.class(), "a warm-up request: %s", a)
	}
}

// answer is what one attempt got.
type answer struct {
	body     string // the request's
	status   int    // the HTTP status (middleware), or the response's
	replayed bool
	resp     []byte
	err      error
}

// class is the answer's kind: fresh, replay, 409, 422, or "undocumented: ...".
func (a answer) class() string {
	var ip *workflow.InProgressError
	switch {
	case a.err != nil && errors.As(a.err, &ip):
		return "409"
	case a.err != nil && errors.Is(a.err, workflow.ErrMismatch):
		return "422"
	case a.err != nil:
		return "undocumented: " + a.err.Error()
	case a.status == http.StatusConflict:
		return "409"
	case a.status == http.StatusUnprocessableEntity:
		return "422"
	case a.status != http.StatusCreated && a.status != http.StatusPaymentRequired:
		return fmt.Sprintf("undocumented: %d %s", a.status, a.resp)
	case a.replayed:
		return "replay"
	}
	return "fresh"
}

func (a answer) String() string {
	return fmt.Sprintf("%s (body %s, status %d, response %s)", a.class(), a.body, a.status, a.resp)
}

// send sends the race's key with body through e.
func (r *rig) send(e *engineOn, body string) answer { return r.sendKey(e, r.key, body) }

func (r *rig) sendKey(e *engineOn, key, body string) answer {
	ctx, cancel := context.WithTimeout(r.ctx, guard)
	defer cancel()
	if e.handler != nil {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/m", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", quoteKey(key))
		rec := httptest.NewRecorder()
		e.handler.ServeHTTP(rec, req)
		return answer{body: body, status: rec.Code, replayed: rec.Header().Get("Idempotent-Replayed") == "true", resp: rec.Body.Bytes()}
	}
	res, err := e.engine.Do(ctx, workflow.Request{Scope: "acct", Key: key, Flow: shapeFlow(r.c.shape, nil).Name, Method: "POST", Route: "/m", Body: []byte(body)})
	if err != nil {
		return answer{body: body, err: err}
	}
	return answer{body: body, status: res.Response.Status, replayed: res.Replayed, resp: res.Response.Body}
}

// cutFirst is a pgx tracer that cuts the connection of the first statement sent on
// its pool, before it is sent: straight on the server its backend is terminated
// (pg_terminate_backend, waiting until it is gone); through pgbouncer, whose
// backends serve any client, the client's connection to the pooler is closed. It
// records whether a statement on that connection then failed.
type cutFirst struct {
	admin  *pgxpool.Pool
	pooled bool
	fired  atomic.Bool
	failed atomic.Bool
	target atomic.Pointer[pgx.Conn]
}

func (c *cutFirst) cut(ctx context.Context, conn *pgx.Conn) {
	if !c.fired.CompareAndSwap(false, true) {
		return
	}
	c.target.Store(conn)
	if c.pooled {
		_ = conn.PgConn().Conn().Close()
		return
	}
	pid := conn.PgConn().PID()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guard)
	defer cancel()
	if _, err := c.admin.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
		panic(fmt.Sprintf("terminate the start-up check's backend: %v", err))
	}
	for gone := false; !gone; {
		if err := c.admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone); err != nil {
			panic(fmt.Sprintf("wait for the start-up check's backend to end: %v", err))
		}
	}
}

func (c *cutFirst) ended(conn *pgx.Conn, err error) {
	if err != nil && c.target.Load() == conn {
		c.failed.Store(true)
	}
}

// tracer is the engines' pgx tracer: the saboteur of the start-up check (or nil) and
// the claim barrier.
type tracer struct {
	cut *cutFirst
	bar *barrier
}

func (tr *tracer) start(ctx context.Context, conn *pgx.Conn, sql string) {
	if tr.cut != nil {
		tr.cut.cut(ctx, conn)
	}
	tr.bar.arrive(sql)
}

func (tr *tracer) end(conn *pgx.Conn, err error) {
	if tr.cut != nil {
		tr.cut.ended(conn, err)
	}
}

func (tr *tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.start(ctx, conn, d.SQL)
	return ctx
}

func (tr *tracer) TraceQueryEnd(_ context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	tr.end(conn, d.Err)
}

func (tr *tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var sql strings.Builder
	for _, q := range d.Batch.QueuedQueries {
		sql.WriteString(q.SQL)
		sql.WriteByte(';')
	}
	tr.start(ctx, conn, sql.String())
	return ctx
}

func (tr *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (tr *tracer) TraceBatchEnd(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchEndData) {
	tr.end(conn, d.Err)
}

// barrier holds back, while stage A runs, every statement that tries a key's claim
// lock (every claim sends pg_try_advisory_xact_lock) before it is sent, and before
// pgx prepares or describes anything of it: the first (the leader) until
// releaseLeader, the rest of the first `early` until releaseEarly, the others until
// releaseLate. So every attempt has made its look-up before any claims; the leader
// claims first, the early ones while it holds the claim lock, and the late ones after
// its claim (a look-up older than the winner's claim, a claim younger than it: what a
// duplicate meets when it is a little slower).
type barrier struct {
	ctx           context.Context
	mu            sync.Mutex
	active        bool
	arrived       int
	early         int
	gates         [3]chan struct{} // leader, early, late
	releaseLeader func()
	releaseEarly  func()
	releaseLate   func()
}

func newBarrier(ctx context.Context) *barrier {
	b := &barrier{ctx: ctx}
	for i := range b.gates {
		b.gates[i] = make(chan struct{})
	}
	b.releaseLeader = sync.OnceFunc(func() { close(b.gates[0]) })
	b.releaseEarly = sync.OnceFunc(func() { close(b.gates[1]) })
	b.releaseLate = sync.OnceFunc(func() { close(b.gates[2]) })
	return b
}

// activate holds the claims sent from now on, the first early of them (the leader
// among them) in the early group.
func (b *barrier) activate(early int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active, b.early = true, early
}

// stop lets every claim go, now and later.
func (b *barrier) stop() {
	b.mu.Lock()
	b.active = false
	b.mu.Unlock()
	b.releaseLeader()
	b.releaseEarly()
	b.releaseLate()
}

// held is how many claims arrived, and how many of them are late.
func (b *barrier) held() (arrived, late int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.arrived, max(0, b.arrived-b.early)
}

func (b *barrier) arrive(sql string) {
	if !strings.Contains(sql, "pg_try_advisory_xact_lock") {
		return
	}
	b.mu.Lock()
	if !b.active {
		b.mu.Unlock()
		return
	}
	b.arrived++
	gate := b.gates[0]
	switch {
	case b.arrived > b.early:
		gate = b.gates[2]
	case b.arrived > 1:
		gate = b.gates[1]
	}
	b.mu.Unlock()
	select {
	case <-gate:
	case <-b.ctx.Done():
	}
}
