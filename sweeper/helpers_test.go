package sweeper_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// The pay-first flow (testflow.PayFirst) starts with a call, so its keys can be stuck
// at the "started" recovery point.
const (
	payFirst       = testflow.PayFirstName
	payFirstCharge = testflow.PayFirstCharge
	payFirstRecord = testflow.PayFirstRecord
)

// failures injects transient failures: while a rule for (key, phase) is set, the phase
// fails before doing anything.
type failures struct {
	mu    sync.Mutex
	rules map[[2]string]bool
	all   func(key, phase string) bool // optional rule for every key
}

func (f *failures) set(key, phase string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules == nil {
		f.rules = map[[2]string]bool{}
	}
	if on {
		f.rules[[2]string{key, phase}] = true
	} else {
		delete(f.rules, [2]string{key, phase})
	}
}

func (f *failures) setAll(rule func(key, phase string) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.all = rule
}

func (f *failures) check(run *phases.Run) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules[[2]string{run.Key(), run.Phase()}] || (f.all != nil && f.all(run.Key(), run.Phase())) {
		return fmt.Errorf("%w at %s", testflow.ErrInjected, run.Phase())
	}
	return nil
}

type bundle struct {
	db       *pgtest.DB
	provider *idemflowtest.Remote
	engine   *workflow.Engine
	fail     *failures
}

type setupOpts struct {
	engine *workflow.Config
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	db := pgtest.New(t)
	require.NoError(t, testflow.CreateTables(context.Background(), db.Pool))
	p := idemflowtest.NewRemote(t, nil)
	b := &bundle{db: db, provider: p, fail: &failures{}}
	cfg := o.engine.WithDefaults()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	e, err := workflow.New(db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, registerFlows(e, p.URL, b.fail.check))
	b.engine = e
	return b
}

// registerFlows registers charge3 and payfirst on e. check, if set, runs at the start of
// every phase and may fail it.
func registerFlows(e *workflow.Engine, providerURL string, check func(*phases.Run) error) error {
	before := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if check == nil {
			return nil
		}
		return check(run)
	}
	if err := e.Register(testflow.Flow(testflow.Options{ProviderURL: providerURL, Before: before})); err != nil {
		return err
	}
	return e.Register(testflow.PayFirst(testflow.Options{ProviderURL: providerURL, Before: before}))
}

// engineSweeper is an engine's sweeper with the settings a test gave it: RunOnce is
// one pass (Engine.Sweep), Start and Stop are the engine's.
type engineSweeper struct {
	engine *workflow.Engine
	cfg    *sweeper.Config
}

func (s *engineSweeper) RunOnce(ctx context.Context) (sweeper.Stats, error) {
	return s.engine.Sweep(ctx, s.cfg)
}
func (s *engineSweeper) Start(ctx context.Context) error { return s.engine.Start(ctx, s.cfg) }
func (s *engineSweeper) Stop(ctx context.Context) error  { return s.engine.Stop(ctx) }

// sweeperOf is e's sweeper with cfg, stopped at the end of the test.
func sweeperOf(t *testing.T, e *workflow.Engine, cfg *sweeper.Config) *engineSweeper {
	t.Helper()
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	return &engineSweeper{engine: e, cfg: cfg}
}

// newSweeper is the bundle's engine's sweeper with cfg.
func (b *bundle) newSweeper(t *testing.T, cfg *sweeper.Config) *engineSweeper {
	t.Helper()
	return sweeperOf(t, b.engine, cfg)
}

func chargeReq(key string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(`{"amount":250}`)}
}

func payFirstReq(key string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: payFirst, Method: "POST", Route: "/payfirst", Body: []byte(`{"amount":1}`)}
}

// stuck runs req with a transient failure injected at phase, leaving the key released
// at the phase before it. The key is not yet due for a sweeper: see makeDue.
func (b *bundle) stuck(t *testing.T, req workflow.Request, phase string) {
	t.Helper()
	b.fail.set(req.Key, phase, true)
	defer b.fail.set(req.Key, phase, false)
	_, err := b.engine.Do(context.Background(), req)
	require.ErrorIs(t, err, workflow.ErrTransient)
}

// makeDue moves a key's claim, backoff and lease (if any) into the past: the
// database-clock equivalent of waiting out the grace period, the backoff and the lease.
func makeDue(t *testing.T, db *pgtest.DB, key string) {
	t.Helper()
	tag, err := db.Pool.Exec(context.Background(), `
		UPDATE idemflow_keys
		SET created_at = statement_timestamp() - interval '1 hour',
			next_attempt_at = statement_timestamp() - interval '1 millisecond',
			locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END
		WHERE scope = 'acct' AND idempotency_key = $1`, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "no key %q", key)
}

// keyRow is the whole key row as text, to compare before and after; "" if there is none.
func keyRow(t *testing.T, db *pgtest.DB, key string) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(),
		`SELECT coalesce((SELECT to_jsonb(k)::text FROM idemflow_keys k WHERE scope = 'acct' AND idempotency_key = $1), '')`,
		key).Scan(&s)
	require.NoError(t, err)
	return s
}

type keyState struct {
	Status        string
	RecoveryPoint string
	LockVersion   int64
	Leased        bool
	Due           bool // next_attempt_at has passed
	Attempts      int
	LastError     string
	// BackoffMillis is next_attempt_at - updated_at: the delay the last release set.
	BackoffMillis int64
}

func state(t *testing.T, db *pgtest.DB, key string) keyState {
	t.Helper()
	var s keyState
	err := db.Pool.QueryRow(context.Background(), `
		SELECT status, recovery_point, lock_version, locked_until IS NOT NULL,
			next_attempt_at <= statement_timestamp(), attempts, coalesce(last_error, ''),
			(extract(epoch FROM next_attempt_at - updated_at) * 1000)::bigint
		FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).
		Scan(&s.Status, &s.RecoveryPoint, &s.LockVersion, &s.Leased, &s.Due, &s.Attempts, &s.LastError, &s.BackoffMillis)
	require.NoError(t, err)
	return s
}

func effects(t *testing.T, db *pgtest.DB, key string) testflow.Effects {
	t.Helper()
	e, err := testflow.CountEffects(context.Background(), db.Pool, "acct", key)
	require.NoError(t, err)
	return e
}

func keyID(t *testing.T, db *pgtest.DB, key string) string {
	t.Helper()
	var id string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT id::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&id))
	return id
}

// requireOneEffect checks that a key has exactly one of each effect, locally and at
// the provider (one payment under the derived key of its pay phase).
func requireOneEffect(t *testing.T, b *bundle, key, payPhase string) {
	t.Helper()
	require.Equal(t, testflow.Effects{Ledger: 1, Settled: 1, Settlements: 1}, effects(t, b.db, key))
	_, paid := b.provider.Effect(keyID(t, b.db, key) + ":" + payPhase)
	require.True(t, paid, "no provider payment for the key's derived key")
}

// events records the engine's key events.
type events struct {
	mu   sync.Mutex
	seen []workflow.KeyEvent
}

func (ev *events) hook(_ context.Context, e workflow.KeyEvent) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.seen = append(ev.seen, e)
}

func (ev *events) count(kind workflow.Outcome) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, e := range ev.seen {
		if e.Kind == kind {
			n++
		}
	}
	return n
}
