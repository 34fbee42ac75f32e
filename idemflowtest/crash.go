package idemflowtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemflow/idemflow/internal/runstate"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/workflow"
)

// Where a boundary is, relative to its phase (Boundary.At).
const (
	// AfterClaim: a new key's claim lock is held in its first tx phase's transaction;
	// nothing of the key is committed and nothing of the flow has run. Only for a flow
	// that starts with a Go-code tx phase (one that starts with a call commits its claim
	// alone, right before BeforeCall of that call; a pipelined phase sends its claim
	// with its statements).
	AfterClaim = childproc.AfterClaim
	// BeforeCommit: a tx phase's function succeeded; its COMMIT, which carries the key
	// row's write, was not sent. For a pipelined phase that reads its statements'
	// results, this is between its two round trips: the statements ran, uncommitted.
	BeforeCommit = childproc.BeforeCommit
	// AfterCommit: a tx phase committed.
	AfterCommit = childproc.AfterCommit
	// BeforeCall: a call phase is about to run; nothing of it has left the process.
	BeforeCall = childproc.BeforeCall
	// AfterCall: a call phase returned successfully; its result is not durable yet (it
	// rides in the next commit).
	AfterCall = childproc.AfterCall
	// Finished: the response is stored; the attempt has not answered its client yet.
	// Its Boundary has no Phase.
	Finished = childproc.Finished
)

// Boundary is a point of a flow's run where a crash matrix ends an attempt.
type Boundary struct {
	Phase string // the phase; empty for Finished
	At    string // AfterClaim, BeforeCommit, AfterCommit, BeforeCall, AfterCall or Finished
}

// String is "phase/at", or "finished".
func (b Boundary) String() string {
	if b.Phase == "" {
		return b.At
	}
	return b.Phase + "/" + b.At
}

// Boundaries returns a flow's boundaries in the order an attempt reaches them: after
// the claim (for a flow that starts with a Go-code tx phase), before and after each tx phase's
// commit, before and after each call, and after the response is stored. Adding a phase
// adds its boundaries. A phase that answers (stores the response) ends the run there in
// practice; its later boundaries are still listed, and a case whose boundary the
// attempt never reaches fails.
func Boundaries(f phases.Flow) []Boundary {
	var out []Boundary
	for i, p := range f.Phases {
		if p.Kind == phases.KindTx {
			if i == 0 && p.Pipeline == nil { // a pipelined phase claims in its commit's round trip
				out = append(out, Boundary{p.Name, AfterClaim})
			}
			out = append(out, Boundary{p.Name, BeforeCommit}, Boundary{p.Name, AfterCommit})
		} else {
			out = append(out, Boundary{p.Name, BeforeCall}, Boundary{p.Name, AfterCall})
		}
	}
	return append(out, Boundary{At: Finished})
}

// Recovery is how a crash matrix finishes a key after the crash.
type Recovery string

// Recoveries.
const (
	// ByRetry: the client retries with the same key once the dead attempt's lease has
	// run out (ExpireLease), and gets the final answer.
	ByRetry Recovery = "retry"
	// BySweeper: a sweeper pass (workflow.Engine.Sweep) finishes the key once its
	// lease has run out; a key with no row yet (the crash came before the claim
	// committed) is left to the client's retry.
	BySweeper Recovery = "sweeper"
	// BySweeperAfterCrash: a sweeper in another child process takes the key over and is
	// killed at the first boundary it reaches; then, once its lease has run out, a second
	// sweeper finishes the key. Needs child processes (not Crash.InProcess).
	BySweeperAfterCrash Recovery = "sweeper-after-crash"
)

// Crash describes a crash matrix: one request of one flow, ended at every boundary of
// the flow (Boundaries) and then recovered each way asked.
//
// Each case runs the request in a child process, the test binary re-executed to run
// only the calling test: the test function runs again from the top in the child, where
// NewDB and NewRemote hand back the parent's database and remotes (in the order the test
// made them) and the matrix call runs the one attempt, which kills its own process with
// SIGKILL at the boundary. Code before the matrix call therefore runs in every child:
// it should make its database and remotes with NewDB and NewRemote, and write to the
// database only through NewDB's setup statements.
type Crash struct {
	// DB is where the matrix runs: its keys, the flow's tables. Required. Keep other
	// work off it while the matrix runs: its sweeper passes take any key that is due.
	DB *DB
	// Flow is the flow under test. Required; not client-only.
	Flow phases.Flow
	// Request is the request each case sends. Its Flow defaults to Flow.Name, Method
	// to POST and Route to "/"; its Key is a prefix that each case extends with its
	// name (the result must fit in 255 characters).
	Request workflow.Request
	// Config is the engines' configuration, in the parent and the children; nil means
	// defaults. The matrix runs its own hooks before Config.Hooks.
	Config *workflow.Config
	// Recover lists the recoveries to run for each boundary. Defaults to all three
	// (ByRetry and BySweeper when InProcess).
	Recover []Recovery
	// Boundaries, if set, limits the matrix to these boundaries (by String, e.g.
	// "charge/after-call"); each must be one of the flow's.
	Boundaries []string
	// Check runs after each case's recovery, with the key finished and its replay
	// checked: it asserts the flow's effects (one ledger row, one remote effect per
	// derived key, ...). Optional.
	Check func(t testing.TB, c *Case)
	// InProcess abandons each attempt at its boundary in the test's own process, by a
	// panic from an engine hook that the matrix recovers, instead of killing a child:
	// faster, and it leaves the connection and the key as a crash would, except that the
	// transaction open at the boundary is rolled back by the engine rather than by the
	// server noticing a dead connection.
	InProcess bool
}

// Case is one case of a crash matrix, as its Check sees it after the recovery.
type Case struct {
	Boundary Boundary
	Recovery Recovery
	// Request is the request the case sent, with the case's own key.
	Request workflow.Request
	DB      *DB
	// Engine is the parent's engine, with the flow registered.
	Engine *workflow.Engine
	// Left is the key's row as the crash left it, before the recovery; nil when the
	// crash came before the claim committed.
	Left *Key
	// Key is the finished key's row.
	Key Key
	// Answer is the stored answer, as a replay returns it.
	Answer *phases.Response
}

// Name is the case's name: boundary and recovery, e.g. "charge/after-call/retry".
func (c *Case) Name() string { return c.Boundary.String() + "/" + string(c.Recovery) }

// DerivedKey is the derived key that phase's calls were made with for this key: what
// phases.Run.DerivedKey returns in that phase.
func (c *Case) DerivedKey(phase string) string {
	st, err := runstate.New(runstate.Info{Scope: c.Key.Scope, Key: c.Key.Key, ID: c.Key.ID, Flow: c.Key.Flow}, nil)
	if err != nil {
		panic(err) // no phase data to decode: cannot fail
	}
	st.Enter(phase)
	return (*phases.Run)(st).DerivedKey()
}

// CrashMatrix runs the crash matrix c describes, each case (boundary and recovery) as a
// subtest of t named after Case.Name. A case fails if its attempt does not reach its
// boundary, if the recovery does not finish the key, if a replay differs in any byte of
// status, stored headers or body from the answer the recovery got (or from another
// replay), or if c.Check fails.
//
// Each case takes a child process and a few transactions; see the package doc for how
// long a matrix takes.
func CrashMatrix(t *testing.T, c Crash) {
	t.Helper()
	m := newMatrix(t, c)
	if m == nil {
		return
	}
	for _, cs := range m.cases {
		t.Run(cs.name(), func(t *testing.T) { m.run(t, cs) })
	}
}

// Report is what RunMatrix found.
type Report struct {
	// Cases is the number of cases run.
	Cases int
	// Failures are the cases that failed, in the order they ran.
	Failures []Failure
}

// Failure is a case that failed and why.
type Failure struct {
	Boundary Boundary
	Recovery Recovery
	// Messages are what the case reported, in order; the last one ended it.
	Messages []string
}

// Failed reports whether the case at boundary (by String) and recovery failed.
func (r *Report) Failed(boundary string, rec Recovery) (Failure, bool) {
	for _, f := range r.Failures {
		if f.Boundary.String() == boundary && f.Recovery == rec {
			return f, true
		}
	}
	return Failure{}, false
}

// RunMatrix runs the crash matrix c describes like CrashMatrix, but reports the cases'
// failures instead of failing t: for testing a test, such as proving that a broken flow
// is caught at the right boundary. Setting the matrix up still fails t.
func RunMatrix(t *testing.T, c Crash) *Report {
	t.Helper()
	r := &Report{}
	m := newMatrix(t, c)
	if m == nil {
		return r
	}
	for _, cs := range m.cases {
		rec := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			m.run(rec, cs)
		}()
		<-done
		r.Cases++
		if rec.failed {
			r.Failures = append(r.Failures, Failure{Boundary: cs.boundary, Recovery: cs.recovery, Messages: rec.messages})
		}
	}
	return r
}

// recorder is a testing.TB that records failures instead of reporting them.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	failed   bool
	messages []string
}

func (r *recorder) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.record(fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); r.FailNow() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); r.FailNow() }
func (r *recorder) Fail()                             { r.record("") }
func (r *recorder) FailNow()                          { r.Fail(); runtime.Goexit() }
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	if msg != "" {
		r.messages = append(r.messages, msg)
	}
}

// matrix is a crash matrix being run.
type matrix struct {
	c      Crash
	test   string
	call   int
	engine *workflow.Engine // the parent's
	cases  []matrixCase
	seq    int
}

type matrixCase struct {
	boundary Boundary
	recovery Recovery
}

func (mc matrixCase) name() string { return mc.boundary.String() + "/" + string(mc.recovery) }

// newMatrix validates c and returns the matrix to run, or, in a crash child, runs the
// child's case if it belongs to this call (never returning) and returns nil.
func newMatrix(t *testing.T, c Crash) *matrix {
	t.Helper()
	if c.DB == nil {
		t.Fatalf("idemflowtest: Crash.DB is nil")
	}
	if c.Flow.ClientOnly {
		t.Fatalf("idemflowtest: flow %q is client-only: a crash matrix needs a flow the engine can run alone", c.Flow.Name)
	}
	c.Request.Flow = cmpOr(c.Request.Flow, c.Flow.Name)
	c.Request.Method = cmpOr(c.Request.Method, "POST")
	c.Request.Route = cmpOr(c.Request.Route, "/")
	m := &matrix{c: c, test: t.Name(), call: nextCall(t)}
	if child != nil {
		if child.spec.Test == m.test && child.spec.Call == m.call {
			m.runChild(t)
		}
		return nil
	}
	if err := c.Flow.Validate(); err != nil {
		t.Fatalf("idemflowtest: %v", err)
	}
	recs := c.Recover
	if len(recs) == 0 {
		recs = []Recovery{ByRetry, BySweeper, BySweeperAfterCrash}
		if c.InProcess {
			recs = recs[:2]
		}
	}
	all := Boundaries(c.Flow)
	bounds := all
	if len(c.Boundaries) > 0 {
		bounds = nil
		for _, want := range c.Boundaries {
			i := slices.IndexFunc(all, func(b Boundary) bool { return b.String() == want })
			if i < 0 {
				t.Fatalf("idemflowtest: %q is not a boundary of flow %q (%v)", want, c.Flow.Name, all)
			}
			bounds = append(bounds, all[i])
		}
	}
	for _, rec := range recs {
		switch {
		case rec == BySweeperAfterCrash && c.InProcess:
			t.Fatalf("idemflowtest: %s needs child processes; InProcess is set", rec)
		case rec != ByRetry && rec != BySweeper && rec != BySweeperAfterCrash:
			t.Fatalf("idemflowtest: unknown recovery %q", rec)
		}
	}
	for _, b := range bounds {
		for _, rec := range recs {
			m.cases = append(m.cases, matrixCase{b, rec})
		}
	}
	var err error
	if m.engine, err = newEngine(c, c.DB, workflow.Hooks{}); err != nil {
		t.Fatalf("idemflowtest: %v", err)
	}
	return m
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// newEngine is the flow's engine on db, with hooks run before the user's.
func newEngine(c Crash, db *DB, pre workflow.Hooks) (*workflow.Engine, error) {
	cfg := c.Config.WithDefaults()
	cfg.Hooks = workflow.JoinHooks(pre, cfg.Hooks)
	e, err := workflow.New(db.Pool, cfg)
	if err != nil {
		return nil, err
	}
	if err := e.Register(c.Flow); err != nil {
		return nil, err
	}
	return e, nil
}

// key is the idempotency key of a case.
func (m *matrix) key(cs matrixCase) string {
	return m.c.Request.Key + "-" + strings.ReplaceAll(cs.name(), "/", ".")
}

// run runs one case: the attempt ended at the boundary, the recovery, the replay
// checks and the user's Check.
func (m *matrix) run(t testing.TB, cs matrixCase) {
	t.Helper()
	req := m.c.Request
	req.Key = m.key(cs)
	if m.c.InProcess {
		m.abandon(t, cs, req)
	} else {
		m.crash(t, cs, req)
	}
	var left *Key
	if k, ok := LookupKey(t, m.c.DB.Pool, req.Scope, req.Key); ok {
		left = &k
	}
	answer := m.recover(t, cs, req, left)

	ctx := context.Background()
	first, err := m.engine.Do(ctx, req)
	if err != nil {
		t.Fatalf("%s: the replay after the recovery failed: %v", cs.name(), err)
	}
	second, err := m.engine.Do(ctx, req)
	if err != nil {
		t.Fatalf("%s: the second replay failed: %v", cs.name(), err)
	}
	if !first.Replayed || !second.Replayed {
		t.Fatalf("%s: an attempt after the recovery was not a replay", cs.name())
	}
	if d := differs(first.Response, second.Response, true); d != "" {
		t.Errorf("%s: two replays differ: %s", cs.name(), d)
	}
	if answer != nil {
		if d := differs(answer, first.Response, false); d != "" {
			t.Errorf("%s: the replay differs from the answer the recovery got: %s", cs.name(), d)
		}
	}
	k := RequireFinished(t, m.c.DB.Pool, req.Scope, req.Key)
	stored, err := m.storedAnswer(k)
	if err != nil {
		t.Fatalf("%s: %v", cs.name(), err)
	}
	if d := differs(stored, first.Response, true); d != "" {
		t.Errorf("%s: the replay differs from the stored response: %s", cs.name(), d)
	}
	if m.c.Check != nil {
		m.c.Check(t, &Case{Boundary: cs.boundary, Recovery: cs.recovery, Request: req, DB: m.c.DB, Engine: m.engine, Left: left, Key: k, Answer: first.Response})
	}
}

// storedAnswer is the answer stored on the finished key k, opened by the engines'
// Sealer when they have one (a sealed answer's headers carry the format member).
func (m *matrix) storedAnswer(k Key) (*phases.Response, error) {
	stored := &phases.Response{Status: k.ResponseStatus, Header: http.Header{}, Body: k.ResponseBody}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(k.ResponseHeaders, &h); err != nil {
		return nil, fmt.Errorf("stored headers %q: %w", k.ResponseHeaders, err)
	}
	_, sealed := h["idemflow:format"]
	delete(h, "idemflow:format")
	for name, raw := range h {
		var vals []string
		if err := json.Unmarshal(raw, &vals); err != nil {
			return nil, fmt.Errorf("stored header %s %s: %w", name, raw, err)
		}
		stored.Header[name] = vals
	}
	if sealed && m.c.Config != nil && m.c.Config.Sealer != nil {
		body, err := m.c.Config.Sealer.Open(context.Background(), k.Scope, k.Key, k.ResponseBody)
		if err != nil {
			return nil, fmt.Errorf("open the stored answer: %w", err)
		}
		stored.Body = body
	}
	return stored, nil
}

// differs describes how replay differs from want: status, body bytes and, for each
// header the replay carries, its values; all headers when exact (two replays).
func differs(want, replay *phases.Response, exact bool) string {
	switch {
	case want.Status != replay.Status:
		return fmt.Sprintf("status %d, then %d", want.Status, replay.Status)
	case !bytes.Equal(want.Body, replay.Body):
		return fmt.Sprintf("body %q, then %q", want.Body, replay.Body)
	case exact && !maps.EqualFunc(want.Header, replay.Header, slices.Equal):
		return fmt.Sprintf("headers %v, then %v", want.Header, replay.Header)
	}
	for name, vals := range replay.Header {
		if !slices.Equal(want.Header.Values(name), vals) {
			return fmt.Sprintf("header %s: %q, then %q", name, want.Header.Values(name), vals)
		}
	}
	return ""
}

// abandon runs the case's attempt in this process and abandons it at the boundary.
func (m *matrix) abandon(t testing.TB, cs matrixCase, req workflow.Request) {
	t.Helper()
	type abandoned struct{ at string }
	pts := childproc.NewPoints(cs.boundary.String(), 0, func(at string) { panic(abandoned{at}) })
	e, err := newEngine(m.c, m.c.DB, pts.Hooks(workflow.Hooks{}))
	if err != nil {
		t.Fatalf("idemflowtest: %v", err)
	}
	var doErr error
	fired := func() (at string) {
		defer func() {
			if v := recover(); v != nil {
				a, ok := v.(abandoned)
				if !ok {
					panic(v)
				}
				at = a.at
			}
		}()
		_, doErr = e.Do(context.Background(), req)
		return ""
	}()
	if fired == "" {
		t.Fatalf("%s: the attempt never reached %s; Do returned %v", cs.name(), cs.boundary, doErr)
	}
}

// crash runs the case's attempt in a child process, which kills itself at the
// boundary, and waits until the server has ended the child's sessions.
func (m *matrix) crash(t testing.TB, cs matrixCase, req workflow.Request) {
	t.Helper()
	spec := m.spec("request", req.Key)
	spec.Boundary = cs.boundary.String()
	killed, lines := m.startChild(t, spec).Killed(t)
	if !killed {
		t.Fatalf("%s: the child was not killed: it never reached %s", cs.name(), cs.boundary)
	}
	if !firedAt(lines, spec.Boundary) {
		t.Fatalf("%s: the child died without reporting %s", cs.name(), cs.boundary)
	}
	childproc.WaitSessionsGone(t, m.c.DB.Pool, spec.App)
}

func firedAt(lines [][]byte, at string) bool {
	for _, l := range lines {
		var cl childLine
		if json.Unmarshal(l, &cl) == nil && cl.Fired != "" && (at == "" || cl.Fired == at) {
			return true
		}
	}
	return false
}

func (m *matrix) spec(mode, key string) caseSpec {
	m.seq++
	return caseSpec{
		Test: m.test, Call: m.call, Mode: mode, Key: key,
		App:     fmt.Sprintf("idemflowtest-%s-%d", m.c.DB.Schema, m.seq),
		DBs:     shares.of(m.test, shareDB),
		Remotes: shares.of(m.test, shareRemote),
	}
}

func (m *matrix) startChild(t testing.TB, spec caseSpec) *childproc.Child {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatalf("idemflowtest: %v", err)
	}
	return childproc.Start(t, runPattern(m.test), envCrash+"="+string(raw))
}

// recover finishes the key as cs.recovery says and returns the answer a retry got, if
// the recovery was one (nil for a sweeper, and for a replay).
func (m *matrix) recover(t testing.TB, cs matrixCase, req workflow.Request, left *Key) *phases.Response {
	t.Helper()
	ctx := context.Background()
	db := m.c.DB.Pool
	exists := left != nil
	inProgress := exists && left.Status == "in_progress"
	if inProgress {
		ExpireLease(t, db, req.Scope, req.Key)
	}
	if cs.recovery == BySweeperAfterCrash && inProgress {
		m.crashSweeper(t, cs, req)
	}
	if cs.recovery != ByRetry {
		st, err := m.engine.Sweep(ctx, &workflow.SweeperConfig{Grace: -1})
		if err != nil {
			t.Fatalf("%s: sweeper pass: %v", cs.name(), err)
		}
		want := workflow.SweepStats{}
		if inProgress {
			want = workflow.SweepStats{Taken: 1, Finished: 1}
		}
		if st.Taken != want.Taken || st.Finished != want.Finished {
			t.Fatalf("%s: the sweeper pass took %d and finished %d keys, want %d and %d (%+v)",
				cs.name(), st.Taken, st.Finished, want.Taken, want.Finished, st)
		}
		if exists {
			return nil
		}
	}
	if exists && !inProgress {
		return nil // finished already: the replay checks it
	}
	// No row (the claim did not commit), or a retry recovers: the client's attempt
	// claims or takes over the key at once.
	res, err := m.engine.Do(ctx, req)
	if err != nil {
		t.Fatalf("%s: the retry did not finish the key: %v", cs.name(), err)
	}
	if res.Replayed {
		t.Fatalf("%s: the retry replayed an answer no attempt had stored before it", cs.name())
	}
	return res.Response
}

// crashSweeper runs a sweeper pass in a child process that kills itself at the first
// boundary it reaches, and leaves the key due again.
func (m *matrix) crashSweeper(t testing.TB, cs matrixCase, req workflow.Request) {
	t.Helper()
	spec := m.spec("sweep", req.Key)
	killed, lines := m.startChild(t, spec).Killed(t)
	if !killed || !firedAt(lines, "") {
		t.Fatalf("%s: the sweeper child was not killed at a boundary (output %q)", cs.name(), lines)
	}
	childproc.WaitSessionsGone(t, m.c.DB.Pool, spec.App)
	RequireKey(t, m.c.DB.Pool, req.Scope, req.Key)
	ExpireLease(t, m.c.DB.Pool, req.Scope, req.Key)
}

// runChild is a child's whole life: the attempt (or sweeper pass) that kills this
// process at its boundary. It never returns.
func (m *matrix) runChild(t *testing.T) {
	spec := child.spec
	fail := func(format string, args ...any) {
		childproc.Fail("idemflowtest", fmt.Errorf(format, args...))
	}
	pts := childproc.NewPoints(spec.Boundary, 0, func(at string) {
		childproc.Emit(childLine{Fired: at})
		childproc.Kill()
	})
	e, err := newEngine(m.c, m.c.DB, pts.Hooks(workflow.Hooks{}))
	if err != nil {
		fail("engine: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch spec.Mode {
	case "request":
		req := m.c.Request
		req.Key = spec.Key
		_, err := e.Do(ctx, req)
		fail("the attempt never reached %s; Do returned %v", spec.Boundary, err)
	case "sweep":
		st, err := e.Sweep(ctx, &workflow.SweeperConfig{Grace: -1, Concurrency: 1})
		childproc.Emit(childLine{Taken: st.Taken, Finished: st.Finished})
		fail("the sweeper pass reached no boundary (%+v, %v)", st, err)
	}
	fail("unknown mode %q", spec.Mode)
}
