package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The history checker. Every client operation is recorded with its invocation and
// answer times and, when its answer says the key is done (a final answer or a
// replay), the key's state read right afterwards; every tx phase an engine of this
// process committed is recorded with the lock version it committed under (the
// PhaseEnd hook). The checker then requires that the answers fit one serial execution
// per key:
//
//   - at most one fresh (not replayed) final answer per key, and every final answer
//     equal, status and body bytes, to every other and to the stored one;
//   - no 422 for an identical request (every experiment sends one request per key);
//   - no 5xx stored, final or replayed: a transient failure is never the answer;
//   - no answer claiming the key done for work that never committed: the state read
//     after a final answer or a replay is finished, with the same bytes;
//   - no replay before the effect committed: a replay ended after the fresh answer's
//     operation began (when both ran in this process);
//   - each tx phase of a key committed at most once, whatever the executor: a second
//     commit means an executor committed without owning the key (a missed fence).

// op is one client operation.
type op struct {
	answer
	Start, End time.Time // Start is zero when unknown (a child's answer)
	After      *afterState
}

// afterState is the key's state read right after an operation.
type afterState struct {
	Finished    bool
	Status      int
	Body        []byte
	LockVersion int64
	Err         string // the read failed
}

// commitRec is one tx phase commit an engine of this process reported.
type commitRec struct {
	Phase       string
	LockVersion int64
	Executor    string
}

// history is every operation and commit of an experiment, by key.
type history struct {
	mu      sync.Mutex
	ops     map[[2]string][]op
	commits map[[2]string][]commitRec
}

func newHistory() *history {
	return &history{ops: map[[2]string][]op{}, commits: map[[2]string][]commitRec{}}
}

// observe records the answer a of one operation on (scope, key) (answers.record calls
// it), reading the key's state when the answer says the key is done.
func (e *env) observe(scope, key string, a answer) {
	o := op{answer: a, Start: a.Start, End: time.Now()}
	if a.Replayed || !a.Retryable && a.Err == "" {
		o.After = e.readAfter(scope, key)
	}
	k := [2]string{scope, key}
	e.history.mu.Lock()
	e.history.ops[k] = append(e.history.ops[k], o)
	e.history.mu.Unlock()
}

// readAfter reads the key's state, retrying while the database is unavailable (a
// restart) for up to 30 s.
func (e *env) readAfter(scope, key string) *afterState {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pause := 10 * time.Millisecond
	for {
		var s afterState
		var status string
		var code *int
		err := e.db.Pool.QueryRow(ctx, `SELECT status, response_status::int, response_body, lock_version
			FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&status, &code, &s.Body, &s.LockVersion)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return &s
		case err == nil:
			s.Finished = status == "finished"
			if code != nil {
				s.Status = *code
			}
			return &s
		}
		t := time.NewTimer(pause) // the database restarts: back off, as a client would
		select {
		case <-ctx.Done():
			t.Stop()
			return &afterState{Err: err.Error()}
		case <-t.C:
		}
		pause = min(pause*2, 200*time.Millisecond)
	}
}

// historyHooks returns h with the PhaseEnd hook also recording every committed tx
// phase.
func (e *env) historyHooks(h workflow.Hooks) workflow.Hooks {
	next := h.PhaseEnd
	h.PhaseEnd = func(ctx context.Context, ev workflow.PhaseEvent, err error) {
		if err == nil && ev.Kind == phases.KindTx {
			k := [2]string{ev.Scope, ev.Key}
			e.history.mu.Lock()
			e.history.commits[k] = append(e.history.commits[k], commitRec{Phase: ev.Phase, LockVersion: ev.LockVersion, Executor: fmt.Sprint(ev.Executor)})
			e.history.mu.Unlock()
		}
		if next != nil {
			next(ctx, ev, err)
		}
	}
	return h
}

// historyReport is what the history checker counted.
type historyReport struct {
	Ops, Final, Fresh, Replays, Commits, Violations int
}

func (h historyReport) String() string {
	return fmt.Sprintf("ops=%d final=%d fresh=%d replays=%d commits=%d history_violations=%d",
		h.Ops, h.Final, h.Fresh, h.Replays, h.Commits, h.Violations)
}

// checkHistory runs the history checker against the key rows the checker read.
func (e *env) checkHistory(t testing.TB, r *report, keys map[[2]string]*keyRow) {
	t.Helper()
	e.history.mu.Lock()
	defer e.history.mu.Unlock()
	var h historyReport
	bad := func(format string, args ...any) {
		h.Violations++
		r.violate("history: "+format, args...)
	}
	for sk, k := range keys {
		if k.status == "finished" && k.respStatus != nil && *k.respStatus >= 500 {
			bad("key %s/%s: a %d is stored as its answer", sk[0], sk[1], *k.respStatus)
		}
	}
	for sk, ops := range e.history.ops {
		var fresh *op
		var first *op
		for i := range ops {
			o := &ops[i]
			h.Ops++
			if o.Status == http.StatusUnprocessableEntity {
				bad("key %s/%s: 422 for an identical request (%s via %s)", sk[0], sk[1], o.Err, o.Via)
			}
			if o.Replayed {
				h.Replays++
				if o.Status >= 500 {
					bad("key %s/%s: a %d was replayed: a transient answer was stored", sk[0], sk[1], o.Status)
				}
			}
			if o.Retryable && !o.Replayed || o.Err != "" {
				continue
			}
			h.Final++
			if !o.Replayed {
				h.Fresh++
				if fresh != nil {
					bad("key %s/%s: two fresh answers, %d %q and %d %q: two executions", sk[0], sk[1], fresh.Status, fresh.Body, o.Status, o.Body)
				}
				fresh = o
			}
			if first == nil {
				first = o
			} else if o.Status != first.Status || !bytes.Equal(o.Body, first.Body) {
				bad("key %s/%s: two different answers, %d %q and %d %q", sk[0], sk[1], first.Status, first.Body, o.Status, o.Body)
			}
			switch a := o.After; {
			case a == nil || a.Err != "":
			case !a.Finished:
				bad("key %s/%s: answered %d (%s, replayed %v) but the key read right after is not finished", sk[0], sk[1], o.Status, o.Via, o.Replayed)
			case a.Status != o.Status || !bytes.Equal(a.Body, o.Body):
				bad("key %s/%s: answered %d %q, the key read right after stores %d %q", sk[0], sk[1], o.Status, o.Body, a.Status, a.Body)
			}
		}
		if fresh != nil && !fresh.Start.IsZero() {
			for _, o := range ops {
				if o.Replayed && !o.End.After(fresh.Start) {
					bad("key %s/%s: a replay ended before the operation that stored the answer began", sk[0], sk[1])
				}
			}
		}
	}
	for sk, cs := range e.history.commits {
		seen := map[string]commitRec{}
		for _, c := range cs {
			h.Commits++
			if prev, dup := seen[c.Phase]; dup {
				bad("key %s/%s: phase %s committed twice, under lock versions %d (%s) and %d (%s): an executor committed without owning the key",
					sk[0], sk[1], c.Phase, prev.LockVersion, prev.Executor, c.LockVersion, c.Executor)
			}
			seen[c.Phase] = c
		}
	}
	r.History = &h
	t.Logf("history: %s", h)
}

// TestZombieInProcess pauses an executor of this process in the two-call flow right
// before the commit of reserve (its transaction open, the order row written), moves the
// database clock past its lease, lets a second executor take the key over, commit
// reserve and stop before its capture call, and then lets the first one go: its commit
// must be fenced off (it answers 409, commits nothing), and the second finishes the
// key. The history checker sees every commit of both executors, so an engine whose
// fence let the zombie commit shows reserve committed twice. Backs invariants 2 and 1.
func TestZombieInProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	zombieGate, ownerGate := &phaseGate{phase: phaseReserve}, &phaseGate{phase: phaseCapture}
	zombie := env.engine(env.pool(poolOpts{}), &workflow.Config{Hooks: workflow.Hooks{
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) { zombieGate.hold(ev) },
	}})
	owner := env.engine(env.pool(poolOpts{}), &workflow.Config{Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context { ownerGate.hold(ev); return ctx },
	}})
	var keys [][2]string
	paused, fenced := 0, 0
	for trial := range scale(2, 20, 200) {
		key := fmt.Sprintf("zombie-inproc|%d", trial)
		req := request("acct", key, twoCallFlow, int64(500+trial))
		keys = append(keys, [2]string{"acct", key})
		zg, og := zombieGate.arm(key), ownerGate.arm(key)
		zdone := make(chan error, 1)
		go func() { _, err := env.do(ctx, zombie, req); zdone <- err }()
		awaitWithin(t, zg.reached, key+": the zombie reached reserve's commit")
		paused++
		env.expireLease(t, "acct", key)
		odone := make(chan error, 1)
		go func() { _, err := env.do(ctx, owner, req); odone <- err }()
		awaitWithin(t, og.reached, key+": the new owner committed reserve and reached capture")
		close(zg.release)
		var zerr error
		select {
		case zerr = <-zdone:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the zombie did not return", key)
		}
		if errors.Is(zerr, workflow.ErrLeaseLost) || errors.Is(zerr, workflow.ErrInProgress) {
			fenced++
		}
		close(og.release)
		select {
		case err := <-odone:
			_ = err // judged by the checker, with the zombie's answer
		case <-time.After(time.Minute):
			t.Fatalf("%s: the new owner did not return", key)
		}
	}
	r := env.check(t, checkOpts{keys: keys})
	require.Positive(t, paused)
	require.Equal(t, paused, fenced, "every zombie was fenced off")
	t.Logf("zombie in process: trials=%d paused=%d fenced=%d duplicates=%d unfinished=%d %s",
		len(keys), paused, fenced, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished, r.History)
}

// phaseGate holds, once a trial, an attempt of the key it was armed for at phase's
// hook, until the test releases it.
type phaseGate struct {
	phase string
	mu    sync.Mutex
	cur   *phaseGateTrial
}

// phaseGateTrial is one arming of a phaseGate: reached is closed when the attempt is
// held, release lets it go.
type phaseGateTrial struct {
	key              string
	reached, release chan struct{}
}

func (g *phaseGate) arm(key string) *phaseGateTrial {
	cur := &phaseGateTrial{key: key, reached: make(chan struct{}), release: make(chan struct{})}
	g.mu.Lock()
	g.cur = cur
	g.mu.Unlock()
	return cur
}

func (g *phaseGate) hold(ev workflow.PhaseEvent) {
	g.mu.Lock()
	cur := g.cur
	if cur == nil || ev.Phase != g.phase || ev.Key != cur.key {
		g.mu.Unlock()
		return
	}
	g.cur = nil // once a trial
	g.mu.Unlock()
	close(cur.reached)
	<-cur.release
}

// awaitWithin fails t unless ch is closed within a minute.
func awaitWithin(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("not within a minute: %s", what)
	}
}
