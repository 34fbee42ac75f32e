package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The model: what each key of the charges flow should be after every step.
type mstate int

const (
	mAbsent   mstate = iota // no row
	mLeased                 // in progress, lease live
	mFree                   // in progress, lease expired or released
	mFinished               // response stored
)

func (s mstate) String() string { return [...]string{"absent", "leased", "free", "finished"}[s] }

type mkey struct {
	req  workflow.Request
	st   mstate
	due  bool   // for mFree: the sweeper may take it
	rp   string // for mLeased and mFree
	body []byte // for mFinished: the stored answer
	code int
}

// modelPoints are where a crash child may die, in flow order ("taken-over" comes first
// on a resumed key).
var modelPoints = []string{
	"taken-over",
	"create_charge/before-commit", "claimed", "create_charge/after-commit",
	"provider_charge/before-call", "provider_charge/after-call",
	"finalize/before-commit", "finalize/after-commit",
}

// TestModel drives random sequences of requests, retries, crashes of real processes
// at random points, sweeper passes, terminated backends, provider failures and moves of
// the database clock (leases and backoffs moved into the past with SQL) against a
// simple model of each key, checking every answer and the database after every step,
// and the invariants at the end. A failure prints its seed; IDEMFLOW_SEED=<seed>
// replays it. Backs invariants 1-3, 5, 6 and 8.
func TestModel(t *testing.T) {
	t.Parallel()
	var seeds []uint64
	if s := os.Getenv("IDEMFLOW_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "IDEMFLOW_SEED")
		seeds = []uint64{seed}
	} else {
		for range scale(1, 4, 500) {
			seeds = append(seeds, rand.Uint64())
		}
	}
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			t.Logf("seed %d: replay with IDEMFLOW_SEED=%d go test -run 'TestModel' ./reliability/", seed, seed)
			runModel(t, seed, scale(40, 300, 50), scale(8, 40, 8))
		})
	}
}

type modelRun struct {
	t        *testing.T
	rng      *rand.Rand
	env      *env
	en       *workflow.Engine
	sw       *sweeperOn
	keys     []*mkey
	armed    int // provider failures armed
	kills    int // backends terminated: a later in-process step may find its connection dead
	unavail  atomic.Int64
	relMu    sync.Mutex
	released []string // causes of the releases of the current step
	step     int
	counts   map[string]int
	lastStep string
}

// trace logs every step of the model test (IDEMFLOW_MODEL_TRACE=1).
var trace = os.Getenv("IDEMFLOW_MODEL_TRACE") == "1"

func runModel(t *testing.T, seed uint64, steps, nkeys int) {
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	// Long leases and backoffs: time never ends a lease here, only clock moves do.
	m := &modelRun{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), env: env, counts: map[string]int{}}
	cfg := &workflow.Config{Lease: 5 * time.Minute, BackoffBase: time.Hour, BackoffMax: time.Hour,
		Hooks: workflow.Hooks{Key: func(ctx context.Context, ev workflow.KeyEvent) {
			if ev.Kind == workflow.OutcomeReleased {
				if errors.Is(ev.Err, workflow.ErrUnavailable) {
					m.unavail.Add(1)
				}
				m.relMu.Lock()
				m.released = append(m.released, fmt.Sprintf("%s: %v", ev.Key, ev.Err))
				m.relMu.Unlock()
			}
		}}}
	// A failed attempt whose release failed too is logged, not reported through hooks.
	cfg.Logger = slog.New(&releaseFailures{unavail: &m.unavail})
	m.en = env.engine(env.pool(poolOpts{}), cfg)
	m.sw = env.sweeper(m.en, &workflow.SweeperConfig{MaxAttempts: 1 << 20})
	en := m.en
	for i := range nkeys {
		amount := int64(100 + i)
		m.keys = append(m.keys, &mkey{req: request("acct", fmt.Sprintf("m%d", i), chargeflow.FlowName, amount)})
	}
	for m.step = 0; m.step < steps; m.step++ {
		k := m.pick()
		switch x := m.rng.IntN(100); {
		case x < 30:
			m.do(ctx, k)
		case x < 45:
			m.crash(k, modelPoints[m.rng.IntN(len(modelPoints))])
		case x < 60:
			m.sweep(ctx)
		case x < 75:
			m.clock(k, m.rng.IntN(3) == 0)
		case x < 85:
			m.kill(ctx)
		default:
			m.arm()
		}
		if trace {
			t.Logf("step %d: %s", m.step, m.lastStep)
		}
		m.verify()
	}
	// Quiesce: no more failures, every lease and backoff over, sweep until done.
	env.provider.FailNext(0)
	m.armed = 0
	for range 10 {
		env.expireAll(t)
		if _, err := m.sw.RunOnce(ctx); err != nil {
			t.Logf("sweep while quiescing: %v", err)
		}
	}
	var keys [][2]string
	for _, k := range m.keys {
		if k.st == mAbsent && env.state(t, "acct", k.req.Key).Exists == false {
			// Never claimed: send it now, so that every key is checked.
			a, err := env.retryUntilFinal(ctx, en, k.req, 10*time.Second)
			require.NoError(t, err)
			require.False(t, a.Retryable)
		}
		keys = append(keys, [2]string{"acct", k.req.Key})
	}
	r := env.check(t, checkOpts{keys: keys})
	t.Logf("model seed %d: steps=%d keys=%d actions=%v duplicates=%d unfinished=%d", seed, steps, len(keys), m.counts,
		r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}

// pick chooses a key, an unfinished one most of the time: finished keys only replay.
func (m *modelRun) pick() *mkey {
	var open []*mkey
	for _, k := range m.keys {
		if k.st != mFinished {
			open = append(open, k)
		}
	}
	if len(open) > 0 && m.rng.IntN(10) < 7 {
		return open[m.rng.IntN(len(open))]
	}
	return m.keys[m.rng.IntN(len(m.keys))]
}

func (m *modelRun) failf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("step %d (%s): %s", m.step, m.lastStep, fmt.Sprintf(format, args...))
}

// outcome is what the model predicts for an attempt that runs the flow on k.
func (m *modelRun) runs(k *mkey) (reaches []string) {
	switch k.st {
	case mAbsent:
		return modelPoints[1:]
	case mFree:
		if k.rp == chargeflow.PhaseProvider { // released after the call, with its result
			return []string{"taken-over", "finalize/before-commit", "finalize/after-commit"}
		}
		return []string{"taken-over", "provider_charge/before-call", "provider_charge/after-call", "finalize/before-commit", "finalize/after-commit"}
	}
	return nil
}

// settle records the final answer a of k, or checks it against the stored one.
func (m *modelRun) final(k *mkey, a answer) {
	m.t.Helper()
	if k.st == mFinished {
		if a.Status != k.code || !bytes.Equal(a.Body, k.body) {
			m.failf("key %s: got %d %q, stored %d %q", k.req.Key, a.Status, a.Body, k.code, k.body)
		}
		return
	}
	k.st, k.code, k.body = mFinished, a.Status, a.Body
}

// do sends an attempt from this process.
func (m *modelRun) do(ctx context.Context, k *mkey) {
	m.t.Helper()
	m.lastStep = "do " + k.req.Key + " " + k.st.String()
	m.counts["do"]++
	m.unavail.Store(0)
	res, err := m.en.Do(ctx, k.req)
	a := fromDo(res, err, "engine")
	m.env.answers.record("acct", k.req.Key, a)
	if m.kills > 0 && (errors.Is(err, workflow.ErrUnavailable) || m.unavail.Load() > 0) {
		// A connection whose backend was terminated: the attempt failed somewhere.
		m.counts["attempts_hit_dead_connection"]++
		m.resync()
		return
	}
	switch k.st {
	case mFinished:
		if !a.Replayed {
			m.failf("key %s finished: want a replay, got %+v", k.req.Key, a)
		}
		m.final(k, a)
	case mLeased:
		if a.Status != 409 {
			m.failf("key %s leased: want 409, got %+v", k.req.Key, a)
		}
	case mAbsent, mFree:
		if m.armed > 0 && slices.Contains(m.runs(k), "provider_charge/after-call") {
			if a.Status != 503 {
				m.failf("key %s: the provider fails: want 503, got %+v", k.req.Key, a)
			}
			m.armed--
			k.st, k.due, k.rp = mFree, false, chargeflow.PhaseCreate
			m.hold(k)
			return
		}
		if a.Retryable || a.Replayed {
			m.failf("key %s %s: want a fresh final answer, got %+v", k.req.Key, k.st, a)
		}
		m.final(k, a)
	}
}

// crash runs the attempt in a child process that SIGKILLs itself at point.
func (m *modelRun) crash(k *mkey, point string) {
	m.t.Helper()
	m.lastStep = "crash " + k.req.Key + " " + k.st.String() + " at " + point
	m.counts["crash_child"]++
	reaches := m.runs(k)
	// The provider's armed failure stops the run at the call, before later points.
	failsFirst := m.armed > 0 && slices.Contains(reaches, "provider_charge/after-call") &&
		(!slices.Contains(reaches, point) || slices.Index(reaches, point) >= slices.Index(reaches, "provider_charge/after-call"))
	wantCrash := slices.Contains(reaches, point) && !failsFirst
	c := m.env.startChild(m.t, childConfig{Mode: "do", Point: point, Action: "kill", Lease: 5 * time.Minute, Requests: []workflow.Request{k.req}})
	killed, lines := c.killed(m.t)
	m.env.recordChildAnswers("acct", lines)
	if killed != wantCrash {
		m.failf("key %s: crash at %s: want killed=%v, got killed=%v (%+v)", k.req.Key, point, wantCrash, killed, lines)
	}
	if killed {
		m.counts["crashes"]++
		// Until the server has ended the dead child's sessions, a claim lock it held
		// turns the key's next attempt away with 409; the model's next step expects
		// the key as the crash left it in the table.
		m.env.waitSessionsGone(m.t, m.env.childApp())
	}
	if !killed {
		var a *answer
		for _, l := range lines {
			if l.Event == "answer" {
				a = l.Answer
			}
		}
		if a == nil {
			m.failf("key %s: the child gave no answer", k.req.Key)
		}
		switch {
		case k.st == mLeased:
			if a.Status != 409 {
				m.failf("key %s leased: child want 409, got %+v", k.req.Key, a)
			}
		case k.st == mFinished:
			m.final(k, *a)
		case failsFirst:
			if a.Status != 503 {
				m.failf("key %s: the provider fails: child want 503, got %+v", k.req.Key, a)
			}
			m.armed--
			k.st, k.due, k.rp = mFree, false, chargeflow.PhaseCreate
			m.hold(k)
		default: // the point is not on this run's path: the child finished the key
			if a.Retryable || a.Replayed {
				m.failf("key %s %s: child want a fresh final answer, got %+v", k.req.Key, k.st, a)
			}
			m.final(k, *a)
		}
		return
	}
	switch point {
	case "create_charge/before-commit":
		// k was absent: nothing committed.
	case "finalize/after-commit":
		k.st = mFinished
		m.loadStored(k)
	default:
		if k.st == mAbsent {
			k.rp = chargeflow.PhaseCreate
		} // a resumed key keeps the recovery point it had: the crash came before any commit
		k.st = mLeased
	}
}

// loadStored reads k's stored answer, which no client saw.
func (m *modelRun) loadStored(k *mkey) {
	m.t.Helper()
	err := m.env.db.Pool.QueryRow(context.Background(), `SELECT response_status::int, response_body FROM idemflow_keys
		WHERE scope = 'acct' AND idempotency_key = $1 AND status = 'finished'`, k.req.Key).Scan(&k.code, &k.body)
	if err != nil {
		m.failf("key %s: read stored answer: %v", k.req.Key, err)
	}
}

// sweep runs one sweeper pass.
func (m *modelRun) sweep(ctx context.Context) {
	m.t.Helper()
	m.lastStep = "sweep"
	m.counts["sweep"]++
	var due []*mkey
	for _, k := range m.keys {
		if k.st == mFree && k.due {
			due = append(due, k)
		}
	}
	m.unavail.Store(0)
	m.relMu.Lock()
	m.released = nil
	m.relMu.Unlock()
	st, err := m.sw.RunOnce(ctx)
	if m.kills > 0 && (m.unavail.Load() > 0 || errors.Is(err, workflow.ErrUnavailable)) {
		m.counts["sweeps_hit_dead_connection"]++
		m.resync()
		return
	}
	if err != nil {
		m.failf("sweep: %v", err)
	}
	paying := 0 // due keys whose run calls the provider
	for _, k := range due {
		if slices.Contains(m.runs(k), "provider_charge/after-call") {
			paying++
		}
	}
	fails := min(m.armed, paying)
	if st.Taken != len(due) || st.Finished != len(due)-fails || st.Released != fails {
		m.relMu.Lock()
		causes := m.released
		m.relMu.Unlock()
		m.failf("sweep: want taken=%d finished=%d released=%d, got %+v; releases: %q", len(due), len(due)-fails, fails, st, causes)
	}
	m.armed -= fails
	if fails > 0 {
		m.resync() // which of them failed is up to the sweeper's workers
		return
	}
	for _, k := range due {
		k.st = mFinished
		m.loadStored(k)
	}
}

// clock moves the database clock past k's lease and backoff (or every key's).
func (m *modelRun) clock(k *mkey, all bool) {
	m.t.Helper()
	m.counts["clock_move"]++
	targets := []*mkey{k}
	if all {
		m.lastStep = "clock all"
		m.env.expireAll(m.t)
		targets = m.keys
	} else {
		m.lastStep = "clock " + k.req.Key
		m.env.expireLease(m.t, "acct", k.req.Key)
	}
	for _, k := range targets {
		if k.st == mLeased || k.st == mFree {
			k.st, k.due = mFree, true
		}
	}
}

// kill terminates one backend of the engine's pool.
func (m *modelRun) kill(ctx context.Context) {
	m.t.Helper()
	m.lastStep = "kill backend"
	n, err := m.env.terminate(ctx, 1)
	if err != nil {
		m.failf("terminate: %v", err)
	}
	if n > 0 {
		m.counts["backend_kills"]++
		m.kills++
	}
}

// arm makes the provider fail its next request.
func (m *modelRun) arm() {
	m.lastStep = "arm provider failure"
	if m.armed >= 2 {
		return
	}
	m.counts["provider_failures_armed"]++
	m.armed++
	m.env.provider.FailNext(m.armed)
}

// hold keeps a key released after a failure from being due until a clock move: the
// flow asks for a retry after 1s of real time, the model moves time only on purpose.
func (m *modelRun) hold(k *mkey) {
	m.t.Helper()
	_, err := m.env.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() + interval '1 hour'
		WHERE scope = 'acct' AND idempotency_key = $1 AND status = 'in_progress' AND locked_until IS NULL`, k.req.Key)
	if err != nil {
		m.failf("hold: %v", err)
	}
}

// resync reads every key from the database after a step whose outcome the model could
// not predict exactly (a killed backend, which of several keys a failure hit).
func (m *modelRun) resync() {
	m.t.Helper()
	m.armed = m.env.provider.Armed()
	for _, k := range m.keys {
		s := m.env.state(m.t, "acct", k.req.Key)
		switch {
		case !s.Exists:
			k.st = mAbsent
		case s.Status == "finished":
			if k.st != mFinished {
				k.st = mFinished
				m.loadStored(k)
			}
		case s.Leased:
			k.st, k.rp = mLeased, s.RecoveryPoint
		default:
			if k.st != mFree || !k.due || !s.Due {
				k.st, k.due, k.rp = mFree, false, s.RecoveryPoint
				m.hold(k)
			}
		}
	}
}

// verify compares the model with the database.
func (m *modelRun) verify() {
	m.t.Helper()
	for _, k := range m.keys {
		s := m.env.state(m.t, "acct", k.req.Key)
		var got mstate
		switch {
		case !s.Exists:
			got = mAbsent
		case s.Status == "finished":
			got = mFinished
		case s.Status != "in_progress":
			m.failf("key %s is %s", k.req.Key, s.Status)
		case s.Leased:
			got = mLeased
		default:
			got = mFree
		}
		if got != k.st {
			m.failf("key %s: model says %s, database says %s (%+v)", k.req.Key, k.st, got, s)
		}
		if got == mFree && s.Due != k.due {
			m.failf("key %s: model says due=%v, database says %v", k.req.Key, k.due, s.Due)
		}
		if (got == mFree || got == mLeased) && s.RecoveryPoint != k.rp {
			m.failf("key %s: model says recovery point %s, database says %s", k.req.Key, k.rp, s.RecoveryPoint)
		}
	}
}

// releaseFailures counts the engine's "release after transient failure failed" logs
// whose error is the database being unavailable (a dead connection).
type releaseFailures struct{ unavail *atomic.Int64 }

func (h *releaseFailures) Enabled(context.Context, slog.Level) bool { return true }
func (h *releaseFailures) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *releaseFailures) WithGroup(string) slog.Handler            { return h }
func (h *releaseFailures) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "err" && errors.Is(err, workflow.ErrUnavailable) {
			h.unavail.Add(1)
		}
		return true
	})
	return nil
}
