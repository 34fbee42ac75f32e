package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemflow/idemflow/testkit/faultproxy"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// long reports whether the long tier runs (IDEMFLOW_LONG=1); the nightly tier is a
// long tier too.
func long() bool { return os.Getenv("IDEMFLOW_LONG") == "1" || nightly() }

// nightly reports whether the nightly tier runs (IDEMFLOW_NIGHTLY=1): every experiment
// at scale.
func nightly() bool { return os.Getenv("IDEMFLOW_NIGHTLY") == "1" }

// tier picks the quick or the long figure (the long one also in the nightly tier).
func tier(quick, full int) int {
	if long() {
		return full
	}
	return quick
}

// scale picks the quick, the long or the nightly figure.
func scale(quick, full, night int) int {
	if nightly() {
		return night
	}
	return tier(quick, full)
}

// env is one experiment's world: a schema with the key table, the effect tables and the
// audit trigger, a recording provider, and the answers clients got.
type env struct {
	t        testing.TB
	db       *pgtest.DB
	provider *provider
	answers  *answers
	client   *http.Client // the flows' client to the provider, in this process
	appName  string       // application_name of the engine pools this env opens
	side     *sideEnv     // the side channels of the ledger flow (withSide), or nil
	sideRun  *sideRun     // this process's handle on them
	history  *history     // every client operation and every committed tx phase
	// shape is the shape of the flows' tx phases (registerFlows), in this process and
	// in its children.
	shape flowShape
}

// newEnv prepares db (a fresh migrated schema) for an experiment.
func newEnv(t testing.TB, db *pgtest.DB) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := db.Pool.Exec(ctx, effectsSchemaV1)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, auditSQL(db.Schema))
	require.NoError(t, err)
	p := newProvider(t)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	e := &env{
		t: t, db: db, provider: p, answers: newAnswers(), history: newHistory(),
		client:  &http.Client{Transport: tr, Timeout: 10 * time.Second},
		appName: "rel_" + db.Schema,
	}
	if db.Schema == "public" { // a database of its own (pgtest.NewDatabase): name the env by it
		cc, err := pgx.ParseConfig(db.URL)
		require.NoError(t, err)
		e.appName = "rel_" + cc.Database
	}
	e.answers.observe = e.observe
	return e
}

// poolOpts shape an engine pool.
type poolOpts struct {
	maxConns int
	// via routes the pool through a fault proxy.
	via *faultproxy.Proxy
	// params are run-time parameters, such as statement_timeout.
	params map[string]string
	// connectTimeout defaults to 5s.
	connectTimeout time.Duration
	// deadlines, if set, records the deadline of every wait on the pool.
	deadlines *deadlines
}

// pool opens an engine pool on the env's schema, tagged with env.appName so that
// experiments can find (and terminate) its backends. It is closed when the test ends.
func (e *env) pool(o poolOpts) *pgxpool.Pool {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	require.NoError(e.t, err)
	if o.maxConns > 0 {
		cfg.MaxConns = int32(o.maxConns)
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if o.connectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = o.connectTimeout
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = e.appName
	for k, v := range o.params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	if o.deadlines != nil {
		cfg.ConnConfig.Tracer = o.deadlines
	}
	if o.via != nil {
		host, port, err := net.SplitHostPort(o.via.Addr())
		require.NoError(e.t, err)
		n, _ := strconv.Atoi(port)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
		cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil // the proxy reads plain protocol
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(p.Close)
	return p
}

// proxy starts a fault proxy in front of the env's server, closed when the test ends.
func (e *env) proxy() *faultproxy.Proxy {
	e.t.Helper()
	cfg, err := pgx.ParseConfig(e.db.URL)
	require.NoError(e.t, err)
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = p.Close() })
	return p
}

// engine returns an engine on pool with both flows registered.
func (e *env) engine(pool workflow.Pool, cfg *workflow.Config) *workflow.Engine {
	e.t.Helper()
	return e.engineWith(pool, cfg, nil)
}

// engineWith is engine with first as the prologue of the flows' first tx phase (see
// withFirstTxPrologue).
func (e *env) engineWith(pool workflow.Pool, cfg *workflow.Config, first txPrologue) *workflow.Engine {
	e.t.Helper()
	c := workflow.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Hooks = e.historyHooks(c.Hooks)
	c.ClaimWithFirstStatement = c.ClaimWithFirstStatement || e.shape.FoldedClaim
	if c.Logger == nil {
		// The experiments provoke the failures the engine logs; the checker judges.
		c.Logger = slog.New(slog.DiscardHandler)
	}
	en, err := workflow.New(pool, &c)
	require.NoError(e.t, err)
	require.NoError(e.t, registerFlows(en, e.provider.URL, e.client, first, e.sideRun, e.shape))
	return en
}

// sweeperOn is an engine's sweeper with the settings an experiment gave it.
type sweeperOn struct {
	en  *workflow.Engine
	cfg *workflow.SweeperConfig
}

// RunOnce runs one pass (Engine.Sweep).
func (s *sweeperOn) RunOnce(ctx context.Context) (workflow.SweepStats, error) {
	return s.en.Sweep(ctx, s.cfg)
}

// Start starts the engine's sweeper (Engine.Start).
func (s *sweeperOn) Start(ctx context.Context) error { return s.en.Start(ctx, s.cfg) }

// Stop stops the engine's sweeper (Engine.Stop).
func (s *sweeperOn) Stop(ctx context.Context) error { return s.en.Stop(ctx) }

// sweeper returns en's sweeper with no grace (experiments decide when keys are due);
// Start and RunOnce refuse invalid settings.
func (e *env) sweeper(en *workflow.Engine, cfg *workflow.SweeperConfig) *sweeperOn {
	e.t.Helper()
	c := workflow.SweeperConfig{Grace: -1}
	if cfg != nil {
		c = *cfg
		if c.Grace == 0 {
			c.Grace = -1
		}
	}
	return &sweeperOn{en: en, cfg: &c}
}

// do runs one attempt and records the answer.
func (e *env) do(ctx context.Context, en *workflow.Engine, req workflow.Request) (*workflow.Result, error) {
	start := time.Now()
	res, err := en.Do(ctx, req)
	a := fromDo(res, err, "engine")
	a.Start = start
	e.answers.record(req.Scope, req.Key, a)
	return res, err
}

// expireLease moves the database clock past the lease of an unfinished key and past its
// backoff: a takeover or a sweep may take it at once.
func (e *env) expireLease(t testing.TB, scope, key string) {
	t.Helper()
	_, err := e.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys
		SET locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END,
			next_attempt_at = statement_timestamp() - interval '1 millisecond'
		WHERE scope = $1 AND idempotency_key = $2 AND status = 'in_progress'`, scope, key)
	require.NoError(t, err)
}

// expireAll moves the database clock past every unfinished key's lease and backoff.
func (e *env) expireAll(t testing.TB) int64 {
	t.Helper()
	tag, err := e.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys
		SET locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END,
			next_attempt_at = statement_timestamp() - interval '1 millisecond'
		WHERE status = 'in_progress'`)
	require.NoError(t, err)
	return tag.RowsAffected()
}

// keyState is what the database says about a key.
type keyState struct {
	Exists        bool
	Status        string
	RecoveryPoint string
	LockVersion   int64
	Leased        bool
	Due           bool
}

func (e *env) state(t testing.TB, scope, key string) keyState {
	t.Helper()
	var s keyState
	err := e.db.Pool.QueryRow(context.Background(), `SELECT status, recovery_point, lock_version,
			coalesce(locked_until > statement_timestamp(), false), next_attempt_at <= statement_timestamp()
		FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).
		Scan(&s.Status, &s.RecoveryPoint, &s.LockVersion, &s.Leased, &s.Due)
	if errors.Is(err, pgx.ErrNoRows) {
		return s
	}
	require.NoError(t, err)
	s.Exists = true
	return s
}

// rowSnapshot is a key row as text, to tell whether anything changed.
func (e *env) rowSnapshot(t testing.TB, scope, key string) string {
	t.Helper()
	var s string
	err := e.db.Pool.QueryRow(context.Background(), `SELECT coalesce((SELECT k::text FROM idemflow_keys k
		WHERE scope = $1 AND idempotency_key = $2), '')`, scope, key).Scan(&s)
	require.NoError(t, err)
	return s
}

// terminate terminates up to n random backends of the env's engine pools and returns
// how many it terminated.
func (e *env) terminate(ctx context.Context, n int) (int, error) {
	var killed int
	err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
			SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()
			ORDER BY random() LIMIT $2) x`, e.appName, n).Scan(&killed)
	return killed, err
}

// answer is what a client got from one attempt.
type answer struct {
	Via       string // engine, http, child
	Status    int    // 0 when the client got no answer at all (connection cut)
	Body      []byte
	Replayed  bool
	Retryable bool   // a 409, a 5xx or no answer: the client must retry
	Err       string // the error, if any
	Dead      bool   // the key was dead-lettered (a 500)
	// Start is when the operation began, in this process (zero for a child's).
	Start time.Time `json:"-"`
}

// answers are all the answers clients got, by key.
type answers struct {
	mu    sync.Mutex
	byKey map[[2]string][]answer
	// observe, if set, also gets every answer (the history checker's record).
	observe func(scope, key string, a answer)
}

func newAnswers() *answers { return &answers{byKey: map[[2]string][]answer{}} }

func (a *answers) record(scope, key string, ans answer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := [2]string{scope, key}
	a.byKey[k] = append(a.byKey[k], ans)
	if a.observe != nil {
		a.mu.Unlock()
		a.observe(scope, key, ans)
		a.mu.Lock()
	}
}

func (a *answers) all() map[[2]string][]answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[[2]string][]answer, len(a.byKey))
	for k, v := range a.byKey {
		out[k] = append([]answer(nil), v...)
	}
	return out
}

// fromDo turns the outcome of Engine.Do into the answer the HTTP layer would give: the
// response, or 409 (in progress, lease lost), 503 (transient, database unavailable,
// deadline, turned away before the claim) or a non-retryable error.
func fromDo(res *workflow.Result, err error, via string) answer {
	if err == nil {
		if res == nil || res.Response == nil {
			return answer{Via: via, Err: "no response"}
		}
		return answer{Via: via, Status: res.Response.Status, Body: res.Response.Body, Replayed: res.Replayed,
			Retryable: res.Response.Status >= 500}
	}
	a := answer{Via: via, Err: err.Error()}
	var te *workflow.TransientError
	switch {
	case errors.Is(err, workflow.ErrInProgress), errors.Is(err, workflow.ErrLeaseLost):
		a.Status, a.Retryable = http.StatusConflict, true
	case errors.As(err, &te) && te.Response != nil && te.Response.Status >= 500:
		a.Status, a.Retryable = te.Response.Status, true
	case errors.Is(err, workflow.ErrTransient), errors.Is(err, workflow.ErrUnavailable), errors.Is(err, workflow.ErrConflict),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, new(*workflow.ShedError)): // turned away before the claim: idemhttp answers 503
		a.Status, a.Retryable = http.StatusServiceUnavailable, true
	case errors.Is(err, workflow.ErrDeadLettered):
		a.Status, a.Dead = http.StatusInternalServerError, true
	default:
		a.Status = -1 // not an answer a client may get: the checker reports it
	}
	return a
}

// retryUntilFinal retries req until it gets a non-retryable answer or ctx ends,
// honouring nothing but a short pause between attempts (the experiments measure how
// fast keys drain, not how patient clients are). It returns the final answer.
func (e *env) retryUntilFinal(ctx context.Context, en *workflow.Engine, req workflow.Request, attemptTimeout time.Duration) (answer, error) {
	pause := 20 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		start := time.Now()
		res, err := en.Do(actx, req)
		cancel()
		a := fromDo(res, err, "engine")
		a.Start = start
		if ctx.Err() != nil && a.Retryable {
			return a, fmt.Errorf("key %s/%s: no final answer before the deadline; last: %s", req.Scope, req.Key, a.Err)
		}
		e.answers.record(req.Scope, req.Key, a)
		if !a.Retryable {
			return a, nil
		}
		t := time.NewTimer(pause) // a client's back-off, not synchronisation
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		pause = min(pause*2, 200*time.Millisecond)
	}
}

// effects counts a key's effect rows (the flow's charges or orders rows).
func (e *env) effects(t testing.TB, flow, scope, key string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(n), 0)::bigint FROM (`+effectCounts[flow]+`) e(scope, key, n)
		WHERE scope = $1 AND key = $2`, scope, key).Scan(&n))
	return n
}

// claimLockHolders are the backends of sessions named app that hold an advisory lock
// (the claim lock is the engine's only one).
func (e *env) claimLockHolders(t testing.TB, app string) []int32 {
	t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 ORDER BY l.pid`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// waitUntil polls the server's view (no hook exists for it) on a ticker until cond
// holds, and fails the test if it does not within limit.
func waitUntil(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("not within %s: %s", limit, what)
		case <-tick.C:
		}
	}
}

// waitSessionsGone waits until no session named app is left: the server has ended the
// backends of a killed process (and with them their transactions and claim locks).
func (e *env) waitSessionsGone(t testing.TB, app string) {
	t.Helper()
	waitUntil(t, 30*time.Second, "the sessions of "+app+" ended", func() bool {
		var n int
		require.NoError(t, e.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		return n == 0
	})
}
