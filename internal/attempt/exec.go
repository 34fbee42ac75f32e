package attempt

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/textproto"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/runstate"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// exec drives one key through its phases as the holder of its lease.
type Exec struct {
	env   *Env
	flow  phases.Flow
	fence keytable.Fence
	// rp is the recovery point as this executor knows it. After a call phase it is
	// ahead of the stored one until the next commit carries it.
	rp string
	// stored is the recovery point the key row holds as far as this executor knows:
	// what its last commit (or the takeover) left. A release or dead-letter matches only
	// while the row still holds it.
	stored string
	// claim is the key row still to be inserted: it rides in the first commit.
	claim    *keytable.Claim
	claimRow keytable.Claim // what claim points to for a new key, in x's allocation
	run      *phases.Run
	leaseEnd time.Time // local estimate of when the lease ends
	// maxAttempts, when positive, dead-letters the key instead of releasing it after a
	// failed attempt that was its maxAttempts-th or later (sweeps set it).
	maxAttempts  int
	lostAtCommit bool // a commit found the lease gone

	// For the attempt's history entry: who runs it and since when, the index of the
	// phase it started at and how many phases it completed; and the origin stored
	// with a new key.
	by          vocab.Executor
	began       time.Time
	start, done int
	origin      string

	// For a drain: stop ends the context of the phases after the claim; gate orders
	// the claim's commit against the drain giving the attempt up (abandoned), and
	// durable says whether the key row exists with this executor's fence.
	stop      context.CancelFunc
	detach    bool // a client's attempt: the phases after the claim outlive the caller
	gate      sync.Mutex
	durable   bool
	abandoned bool
}

// Fresh is the executor of a new key's first attempt, a client's: c is the key's row,
// inserted by the attempt's first commit, and body the request body its phases read.
// sealed marks the stored body as sealed in the phase data.
func Fresh(env *Env, f phases.Flow, c keytable.Claim, body []byte, sealed bool) *Exec {
	x := &Exec{
		env:    env,
		flow:   f,
		origin: c.Origin,
		fence:  keytable.Fence{Scope: c.Scope, Key: c.Key, ID: c.ID, LockVersion: 1},
		rp:     phases.Started,
		// no row yet: stored is set by the first commit
		claimRow: c,
		leaseEnd: time.Now().Add(env.Lease),
		began:    time.Now(),
		by:       vocab.ExecutorClient,
		detach:   true,
	}
	x.claim = &x.claimRow
	x.run, _ = newRun(runstate.Info{
		Scope: c.Scope, Key: c.Key, ID: c.ID, Flow: f.Name,
		Method: c.Method, Route: c.Route, Body: body, Attempt: 1,
	}, nil)
	if sealed {
		x.state().SetValue(keytable.FormatMember, sealedMark) // phase data format 2: the body is sealed
	}
	return x
}

// sealedMark is the phase data member that marks a sealed request body.
var sealedMark = json.RawMessage(strconv.Itoa(keytable.PhaseDataSealed))

// Taken is how an executor runs a key whose lease it took over (Take).
type Taken struct {
	// By is who runs it.
	By vocab.Executor
	// MaxAttempts, when positive, dead-letters the key instead of releasing it after a
	// failed attempt that was its MaxAttempts-th or later (sweeps set it).
	MaxAttempts int
	// Detach runs the phases after the takeover under a context detached from the
	// caller's (a client's attempt, Do's).
	Detach bool
}

// Take is the executor of an attempt on row, a key whose lease was taken over at
// started.
func Take(env *Env, f phases.Flow, row *keytable.Row, started time.Time, t Taken) (*Exec, error) {
	run, err := newRun(runstate.Info{
		Scope: row.Scope, Key: row.Key, ID: row.ID, Flow: row.Flow,
		Method: row.Method, Route: row.Route, Body: row.RequestBody, Attempt: row.Attempts,
	}, row.PhaseData)
	if err != nil {
		return nil, err
	}
	return &Exec{
		env:         env,
		flow:        f,
		origin:      row.Origin,
		fence:       row.Fence(),
		rp:          row.RecoveryPoint,
		stored:      row.RecoveryPoint,
		run:         run,
		leaseEnd:    started.Add(row.LeaseLeft()),
		began:       started,
		by:          t.By,
		maxAttempts: t.MaxAttempts,
		detach:      t.Detach,
		durable:     true, // taken over: the row exists with this fence
	}, nil
}

// End is how an attempt ended (Drive).
type End struct {
	// Out is the attempt's result, unless Lost.
	Out vocab.Result
	// Finished: the attempt stored the key's answer.
	Finished bool
	// Lost: a new key's claim did not give the attempt the key, and nothing of the
	// flow ran. Busy: another attempt is claiming it; else its row exists, and Found
	// is the row when the claim read it.
	Lost, Busy bool
	Found      *keytable.Row
}

// Drive runs the phases from index start on, and says how the attempt ended.
func (x *Exec) Drive(ctx context.Context, start int) End {
	st := x.drive(ctx, start)
	return End{Out: st.out, Finished: st.kind == stepFinished, Lost: st.kind == stepLost, Busy: st.lost == claimBusy, Found: st.found}
}

// Keyed is r with what x learnt of its key, where r did not learn it itself.
func (x *Exec) Keyed(r vocab.Result) vocab.Result {
	return vocab.With(r, x.fence.ID, x.flow.Name, x.origin, x.rp, x.run.Attempt())
}

// RecoveryPoint is the key's recovery point as x knows it.
func (x *Exec) RecoveryPoint() string { return x.rp }

// Release releases the key after a failure (cause) at the recovery point, or
// dead-letters it, as after a failed phase, and returns the attempt's result.
func (x *Exec) Release(ctx context.Context, cause error) vocab.Result {
	return x.transient(ctx, x.rp, cause, nil)
}

// stepKind is how one phase of an attempt ended. It is decided once, as a value, and
// acted on after the phase's connection is back in the pool.
type stepKind int

const (
	stepNext      stepKind = iota // the phase's effects are durable: run the next phase
	stepFinished                  // the key finished: out is the attempt's result
	stepAlone                     // a response to store in a transaction of its own (resp)
	stepTransient                 // nothing new is durable: release the key (err the cause, resp a 5xx to pass on)
	stepConflict                  // a serialization failure or deadlock: the transaction may run again
	stepLost                      // a new key's claim did not give this attempt the key; nothing of the flow ran
	stepStop                      // the attempt ends with out, already settled (lease lost, released)
)

// step is the outcome of one phase.
type step struct {
	kind  stepKind
	out   vocab.Result // stepFinished, stepStop: how the attempt ended
	resp  *phases.Response
	err   error
	lost  claimed       // stepLost: claimBusy or claimExists
	found *keytable.Row // stepLost with claimExists: the row, when the claim read it
}

// stop is the step that ends the attempt with out.
func stop(out vocab.Result) step { return step{kind: stepStop, out: out} }

// error is the failure st reports to PhaseEnd: the attempt's for a step that ends it,
// the claim's refusal for a lost claim.
func (st step) error() error {
	if st.kind == stepStop || st.kind == stepFinished {
		return st.out.Err
	}
	return st.err
}

// failed is the step of an error met while running a phase, read once where the
// error comes back from the store: a claim lost to another attempt (an insert that
// found the row, or a claim statement that found the key busy), outcomes that end the
// attempt as they are (turned away by a drain, the lease was lost, or a commit whose
// outcome is unknown left the key to its lease), a conflict that may be retried, or a
// transient failure to settle.
func (x *Exec) failed(err error) step {
	var te *vocab.TransientError
	switch {
	case errors.As(err, new(*vocab.ShedError)):
		return stop(vocab.Failure(err))
	case errors.Is(err, keytable.ErrClaimBusy):
		return step{kind: stepLost, lost: claimBusy, err: err}
	case errors.Is(err, keytable.ErrClaimExists):
		return step{kind: stepLost, lost: claimExists, err: err}
	case errors.Is(err, vocab.ErrLeaseLost):
		return stop(x.leaseLost(err))
	case errors.As(err, &te):
		return stop(vocab.Result{Outcome: vocab.OutcomeReleased, Phase: te.Phase, RetryAfter: te.RetryAfter, Err: err})
	case errors.Is(err, keytable.ErrConflict):
		return step{kind: stepConflict, err: err}
	}
	return step{kind: stepTransient, err: err}
}

// leaseLost is the result of an attempt whose fenced statement found its lease gone:
// recorded as such when a commit found it (the commit is what the lease fenced).
func (x *Exec) leaseLost(err error) vocab.Result {
	return vocab.Noted(vocab.Result{Outcome: vocab.OutcomeLeaseLost, RetryAfter: time.Second, Err: err}, err, x.lostAtCommit)
}

// verdictKind is what a phase function's return asks for.
type verdictKind int

const (
	goOn         verdictKind = iota // no response: move the recovery point past the phase
	respond                         // a response to store: the key finishes with it
	respondAlone                    // a terminal response (phases.Fail): discard the phase's work, store the response
	fail                            // a 5xx or an error: store nothing
)

// verdict is a phase function's return, read once for both kinds of phase.
type verdict struct {
	kind verdictKind
	resp *phases.Response
	err  error
}

func decide(resp *phases.Response, err error) verdict {
	switch {
	case err == nil && resp == nil:
		return verdict{kind: goOn}
	case err == nil && resp.Status < 500:
		return verdict{kind: respond, resp: resp}
	case err == nil: // a 5xx: passed on, never stored
		return verdict{kind: fail, resp: resp, err: fmt.Errorf("phase responded %d", resp.Status)}
	}
	return decideErr(err)
}

// decideErr is decide for an error: its term escapes, so it is not made on the way
// of a phase that went on or responded.
func decideErr(err error) verdict {
	var term *phases.TerminalError
	if errors.As(err, &term) && term.Response != nil && term.Response.Status < 500 {
		return verdict{kind: respondAlone, resp: term.Response, err: err}
	}
	return verdict{kind: fail, err: err}
}

func (x *Exec) event(p phases.Phase) vocab.PhaseEvent {
	return vocab.PhaseEvent{
		Flow: x.flow.Name, Phase: p.Name, Kind: p.Kind,
		Scope: x.fence.Scope, Key: x.fence.Key, ID: x.fence.ID,
		LockVersion: x.fence.LockVersion, Attempt: x.run.Attempt(), Executor: x.by,
	}
}

// drive runs the phases from index start on, and returns the step the attempt ended
// with: stepFinished, stepLost or stepStop.
//
// Until the key's claim is durable the phases run under ctx, the caller's; after it,
// under a context detached from the caller that only a drain's deadline ends.
func (x *Exec) drive(ctx context.Context, start int) step {
	pre, after, release, ok := x.enter(ctx)
	if !ok {
		return x.drained(ctx)
	}
	defer release()
	last := phases.Started
	x.start = start
	for i := start; i < len(x.flow.Phases); i++ {
		p := x.flow.Phases[i]
		last = p.Name
		ctx = after
		if x.claim != nil {
			ctx = pre
		}
		var st step
		if p.Kind == phases.KindTx {
			st = x.txPhase(ctx, p)
		} else {
			st = x.callPhase(ctx, p)
		}
		if st.kind != stepNext {
			return st
		}
		x.done++
	}
	return stop(x.transient(ctx, last, vocab.ErrNoResponse, nil))
}

// settle acts on a step that needs more than the phase itself: a response stored on
// its own, or the release after a transient failure (a conflict that is not retried is
// one). It runs once the phase's connection is back in the pool, and leaves only
// stepNext, stepFinished or stepStop.
func (x *Exec) settle(ctx context.Context, phase string, st step) step {
	switch st.kind {
	case stepAlone:
		return x.finishAlone(ctx, st.resp)
	case stepTransient, stepConflict:
		return stop(x.transient(ctx, phase, st.err, st.resp))
	}
	return st
}

// txPhase runs a tx phase, re-running its whole transaction after a serialization
// failure or deadlock.
func (x *Exec) txPhase(ctx context.Context, p phases.Phase) step {
	ev := x.event(p)
	ctx = x.env.phaseStart(ctx, ev)
	for try := 0; ; try++ {
		st := x.txOnce(ctx, p, ev)
		if st.kind == stepConflict && try < x.env.TxRetries && ctx.Err() == nil && wait(ctx, conflictDelay(try)) == nil {
			continue
		}
		// A phase answered with phases.Fail had its transaction rolled back: its end is
		// reported with that error, even when the answer was stored.
		alone, rolledBack := st.kind == stepAlone, st.err
		st = x.settle(ctx, p.Name, st)
		end := st.error()
		if end == nil && alone {
			end = rolledBack
		}
		x.env.phaseEnd(ctx, ev, end)
		return st
	}
}

// txOnce runs one transaction of a tx phase: its body, and the commit that writes the
// key row (commitPhase). The body is the phase's Go code (goBody) or its queued
// statements (pipeBody); either way the claim of a new key or the fence of an existing
// one opens the transaction, so that an attempt that may not run the phase runs none
// of its statements. Its connection is back in the pool when it returns; what else its
// step needs is for settle.
func (x *Exec) txOnce(ctx context.Context, p phases.Phase, ev vocab.PhaseEvent) (st step) {
	// The lease bounds the transaction: a connection that stops answering (half-open,
	// blackholed) must not hold the executor, and past its lease its commit is likely
	// fenced anyway.
	ctx, cancel := context.WithTimeoutCause(ctx, x.env.Lease, vocab.ErrLeaseExpired)
	defer cancel()
	x.state().Enter(p.Name)
	// Unless the phase's transaction committed, what the phase wrote to the phase data
	// goes with it: a retry of the transaction, a release or a dead-letter must not see
	// it.
	defer func() {
		if st.kind != stepNext && st.kind != stepFinished {
			x.state().Revert()
		}
	}()
	var pl *pipeline
	var v verdict
	if p.Pipeline != nil { // its statements are declared before anything is sent
		if pl, v = build(p, x.run); v.kind == respondAlone || v.kind == fail {
			return x.verdictStep(v)
		}
	}
	tx, err := x.open(ctx, p.IsoLevel)
	if err != nil {
		return x.failed(leaseNamed(ctx, err))
	}
	defer tx.done(ctx)
	var one *pipeline
	var ok bool
	if pl == nil {
		v, st, ok = x.goBody(ctx, tx, p, ev)
	} else {
		v, one, st, ok = x.pipeBody(ctx, tx, pl, v, ev)
	}
	switch {
	case !ok:
		return st
	case v.kind == goOn, v.kind == respond:
		return x.commitPhase(ctx, tx, p.Name, ev, v, one)
	}
	return x.verdictStep(v)
}

// goBody runs a Go-code tx phase's function in tx. A new key's claim goes first
// (claimFirst); for a key whose row exists, the transaction checks the executor's
// fence before the phase's first statement (phaseTx.head): a refusal fails the phase
// as a lost lease, with none of its statements run. ok is false when the attempt
// stops before the phase function runs; st then says why.
func (x *Exec) goBody(ctx context.Context, tx *phaseTx, p phases.Phase, ev vocab.PhaseEvent) (v verdict, st step, ok bool) {
	if x.claim != nil {
		if st, owned := x.claimFirst(ctx, tx, ev); !owned {
			return v, st, false
		}
	} else {
		tx.startWith(keytable.Head{Fence: x.fence})
	}
	v = tx.end(decide(runTx(ctx, p, tx, x.run)))
	if v.kind == fail {
		v.err = leaseNamed(ctx, v.err)
	}
	if v.kind == fail && errors.Is(v.err, keytable.ErrLeaseLost) {
		x.lostAtCommit = true // the check is the commit's fence, sent first: reported as lost
	}
	return v, step{}, true
}

// leaseNamed is err naming the lease when the lease that bounds ctx (txOnce's) ended
// and err does not name it yet: a statement the lease's end cancelled (a phase's, or
// a new key's claim before it), or the wait for the phase's connection, fails with
// "context deadline exceeded" alone. Named, as a commit it stopped is.
func leaseNamed(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, vocab.ErrLeaseExpired) {
		return err
	}
	if cause := context.Cause(ctx); errors.Is(cause, vocab.ErrLeaseExpired) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// commitPhase writes the key row as v asks and commits (commit): the phase went on,
// and the key moves past it, or it answered, and the key finishes with the answer.
// One, when set, is a pipelined phase whose whole transaction goes in the round trip
// of the commit.
func (x *Exec) commitPhase(ctx context.Context, tx *phaseTx, phase string, ev vocab.PhaseEvent, v verdict, one *pipeline) step {
	w := keyWrite{target: phase}
	var err error
	if v.kind == respond {
		var stored keytable.StoredResponse
		stored, w.data, err = x.storable(ctx, v.resp)
		stored.History = x.history(vocab.OutcomeFinished, "", nil)
		w.target, w.resp = phases.Finished, &stored
	} else {
		w.data, err = x.data()
		w.beforeCall = x.callNext(phase)
	}
	if err != nil {
		return x.failed(err)
	}
	x.env.beforeCommit(ctx, ev)
	sent := time.Now()
	if err := x.commit(ctx, tx, w, one); err != nil {
		return x.commitFailed(err)
	}
	if v.kind == respond {
		return step{kind: stepFinished, out: x.finished(v.resp)}
	}
	x.rp = phase
	x.leaseEnd = sent.Add(x.env.Lease)
	return step{kind: stepNext}
}

// commitFailed is the step of a commit that failed: a statement of a pipelined
// phase's (pipeFailure) as that statement's failure, anything else as failed reads it.
func (x *Exec) commitFailed(err error) step {
	var pf pipeFailure
	if errors.As(err, &pf) {
		return x.verdictStep(pf.v)
	}
	return x.failed(err)
}

// verdictStep is the step of a phase that failed before anything of it could commit.
func (x *Exec) verdictStep(v verdict) step {
	if v.kind == respondAlone {
		return step{kind: stepAlone, resp: v.resp, err: v.err}
	}
	st := x.failed(keytable.Classify(v.err))
	st.resp = v.resp
	return st
}

// callPhase runs a call phase with no transaction open. The key row must be durable
// before anything leaves the process, so a claim still pending is committed first.
//
// No call starts once a drain began: the check is the last thing before the call's
// function runs, after the claim's commit, the standby wait and PhaseStart, so that a
// drain that begins during any of them releases the key at the recovery point instead.
// A drain that began before the claim's commit leaves a new key unwritten.
func (x *Exec) callPhase(ctx context.Context, p phases.Phase) step {
	if x.env.Admission.Draining() {
		return x.settle(ctx, p.Name, step{kind: stepTransient, err: errDrainBeforeCall})
	}
	if x.claim != nil {
		sent := time.Now()
		data, err := x.data()
		if err == nil {
			err = x.commitAlone(ctx, keyWrite{target: x.rp, data: data, beforeCall: true})
		}
		if err != nil {
			return x.settle(ctx, p.Name, x.failed(err))
		}
		x.leaseEnd = sent.Add(x.env.Lease)
	}
	if err := x.awaitStandby(ctx); err != nil {
		return x.settle(ctx, p.Name, step{kind: stepTransient, err: err})
	}
	ev := x.event(p)
	ctx = x.env.phaseStart(ctx, ev)
	x.state().Enter(p.Name)
	deadline := x.leaseEnd.Add(-leaseMargin(x.env.Lease))
	var refused error
	switch {
	case !time.Now().Before(deadline):
		refused = errors.New("too little of the lease is left to make the call")
	case x.env.Admission.Draining(): // last: nothing may come between it and the call
		refused = errDrainBeforeCall
	}
	if refused != nil {
		st := x.settle(ctx, p.Name, step{kind: stepTransient, err: refused})
		x.env.phaseEnd(ctx, ev, st.error())
		return st
	}
	callCtx, cancel := context.WithDeadline(ctx, deadline)
	resp, err := runCall(callCtx, p, x.run)
	cancel()
	v := decide(resp, err)
	x.env.phaseEnd(ctx, ev, v.err) // nil only for success and a storable answer
	switch v.kind {
	case goOn:
		x.rp = p.Name
		return step{kind: stepNext}
	case respond:
		return x.settle(ctx, p.Name, step{kind: stepAlone, resp: v.resp})
	case respondAlone:
		x.state().Revert()
		return x.settle(ctx, p.Name, step{kind: stepAlone, resp: v.resp})
	}
	x.state().Revert()
	return x.settle(ctx, p.Name, step{kind: stepTransient, err: v.err, resp: v.resp})
}

// errDrainBeforeCall is why a call phase did not start: a drain began.
var errDrainBeforeCall = fmt.Errorf("%w: no call phase starts once a drain began", vocab.ErrDraining)

// finishAlone stores resp in a transaction of its own: BEGIN, the claim with the
// insert of a finished row if the claim is still pending, else the fenced finish, and
// COMMIT, in one round trip. A failure other than a lost claim or lease is transient:
// the key is released, never left leased.
func (x *Exec) finishAlone(ctx context.Context, resp *phases.Response) step {
	stored, data, err := x.storable(ctx, resp)
	if err == nil {
		stored.History = x.history(vocab.OutcomeFinished, "", nil)
		err = x.commitAlone(ctx, keyWrite{target: phases.Finished, data: data, resp: &stored})
	}
	if err == nil {
		return step{kind: stepFinished, out: x.finished(resp)}
	}
	st := x.failed(err)
	if st.kind == stepTransient || st.kind == stepConflict {
		return stop(x.transient(ctx, x.run.Phase(), err, nil))
	}
	return st
}

// open acquires a connection for one transaction; the transaction owns it until done.
// Before the claim, the wait for the connection is bounded by Config.AdmitWait.
func (x *Exec) open(ctx context.Context, iso pgx.TxIsoLevel) (*phaseTx, error) {
	if x.claim != nil {
		pc, err := x.env.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return newPhaseTx(pc, x.env.Store, iso), nil
	}
	pc, err := x.env.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", keytable.Classify(err))
	}
	return newPhaseTx(pc, x.env.Store, iso), nil
}

// claimFirst starts tx, the transaction of a new key's first tx phase, with the key's
// claim. With Config.ClaimWithFirstStatement, at READ COMMITTED, the claim is folded
// into the round trip of the phase's first statement (phaseTx.fold): owned is then
// true, and a claim that the round trip finds lost fails the phase with the claim's
// error (phaseTx.end), none of its statements run. Otherwise the claim takes its own
// round trip now, before the phase function runs (claimKey). ClaimHeld runs once the
// claim is held either way.
func (x *Exec) claimFirst(ctx context.Context, tx *phaseTx, ev vocab.PhaseEvent) (st step, owned bool) {
	if x.env.ClaimWithFirstStatement && !tx.oneSnapshot {
		tx.fold(x.claim, func() { x.env.claimHeld(ctx, ev) })
		return step{}, true
	}
	if st, owned = x.claimKey(ctx, tx); owned {
		x.env.claimHeld(ctx, ev)
	}
	return st, owned
}

// claimKey claims the new key in tx, before anything of the flow runs, and reports
// whether this attempt owns it; if not, the step says why (with the key row when the
// claim found and read it).
func (x *Exec) claimKey(ctx context.Context, tx *phaseTx) (step, bool) {
	got, row, err := tx.claim(ctx, x.claim)
	switch {
	case err != nil:
		return x.failed(leaseNamed(ctx, err)), false
	case got == claimOwned:
		return step{}, true
	}
	// The hooks see the phase end with the claim's refusal, never as a success.
	cause := fmt.Errorf("claim key: %w", keytable.ErrClaimBusy)
	if got == claimExists {
		cause = fmt.Errorf("claim key: %w", keytable.ErrClaimExists)
	}
	return step{kind: stepLost, lost: got, found: row, err: cause}, false
}

// finished is the result of the attempt that stored resp.
func (x *Exec) finished(resp *phases.Response) vocab.Result {
	x.claim = nil
	x.rp = phases.Finished
	return vocab.Answered(resp, false)
}

// callNext reports whether the phase after the one named phase is a call phase.
func (x *Exec) callNext(phase string) bool {
	ps := x.flow.Phases
	for i := 0; i+1 < len(ps); i++ {
		if ps[i].Name == phase {
			return ps[i+1].Kind == phases.KindCall
		}
	}
	return false
}

// transient releases the key after a failure worth retrying, keeping what is durable,
// and returns the attempt's result: released, with a *TransientError for the caller. A
// permanent refusal (ErrRefused), a failure whose answer cannot be stored
// (ErrUnstorable) and the last attempt a sweep allows dead-letter a key whose row
// exists instead. Released and dead-lettered are recorded (their key event is due)
// only when the statement that says so committed.
func (x *Exec) transient(ctx context.Context, phase string, cause error, resp *phases.Response) vocab.Result {
	if errors.Is(cause, keytable.ErrLeaseLost) {
		return x.leaseLost(cause)
	}
	after := time.Duration(0)
	var te *phases.RetryError
	if errors.As(cause, &te) {
		after = te.After
	}
	if after <= 0 {
		after = x.backoff()
	}
	out := vocab.Noted(vocab.Result{Outcome: vocab.OutcomeReleased, Phase: phase}, cause, false)
	if x.claim == nil { // the key row exists: release it, or give up on it
		dead := errors.Is(cause, vocab.ErrUnstorable) || errors.Is(cause, vocab.ErrRefused) || x.maxAttempts > 0 && x.run.Attempt() >= x.maxAttempts
		derr := x.release(ctx, phase, cause, after, dead)
		switch {
		case errors.Is(derr, keytable.ErrLeaseLost):
			return x.leaseLost(derr)
		case derr != nil:
			x.env.Logger.WarnContext(ctx, "workflow: release after transient failure failed; the lease will expire instead",
				slogKey(x.fence), "phase", phase, "err", derr)
		case dead:
			out.Outcome = vocab.OutcomeDeadLettered
			out = vocab.Noted(out, cause, true)
		default:
			out = vocab.Noted(out, cause, true)
		}
	}
	dead := out.Outcome == vocab.OutcomeDeadLettered
	switch {
	case errors.Is(cause, vocab.ErrRefused): // permanent: not a *vocab.TransientError, whatever became of the key
		out.Phase, out.Err = "", cause
		if !dead {
			out.Outcome = vocab.OutcomeFailed
		}
		return out
	case dead && errors.Is(cause, vocab.ErrUnstorable):
		out.Phase, out.Err = "", fmt.Errorf("%w: %v", vocab.ErrDeadLettered, cause) // as every later attempt is answered
		return out
	}
	retry := time.Second
	if te != nil && te.After > retry {
		retry = te.After
	}
	out.RetryAfter, out.Response = retry, resp
	out.Err = &vocab.TransientError{Phase: phase, RetryAfter: retry, Response: resp, Err: cause}
	return out
}

// release releases the key, or dead-letters it, with the attempt's history entry.
func (x *Exec) release(ctx context.Context, phase string, cause error, after time.Duration, dead bool) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	data, err := x.state().Data()
	switch {
	case err != nil:
		return err
	case dead:
		return x.env.Store.DeadLetter(rctx, x.env.Pool, x.fence, keytable.DeadLetter{RecoveryPoint: x.rp, Stored: x.stored, Data: data, LastError: cause.Error(),
			History: x.history(vocab.OutcomeDeadLettered, phase, cause)})
	}
	return x.env.Store.Release(rctx, x.env.Pool, x.fence, keytable.Release{RecoveryPoint: x.rp, Stored: x.stored, Data: data, LastError: cause.Error(), RetryIn: after,
		History: x.history(vocab.OutcomeReleased, phase, cause)})
}

// backoff is how long a released key waits before the sweeper may take it again.
func (x *Exec) backoff() time.Duration {
	return Backoff(x.env.BackoffBase, x.env.BackoffMax, x.run.Attempt())
}

// data encodes the phase data, enforcing the size limit.
func (x *Exec) data() ([]byte, error) {
	data, err := x.state().Data()
	if err != nil {
		return nil, err
	}
	if len(data) > x.env.MaxPhaseDataBytes {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", vocab.ErrPhaseDataTooLarge, len(data), x.env.MaxPhaseDataBytes)
	}
	return data, nil
}

// storable returns the response as stored (allow-listed headers only) and the phase
// data, or an error if either is too large. Nothing is ever truncated.
func (x *Exec) storable(ctx context.Context, resp *phases.Response) (keytable.StoredResponse, []byte, error) {
	if resp.Status < 200 || resp.Status > 499 { // 1xx is not a final answer
		return keytable.StoredResponse{}, nil, fmt.Errorf("workflow: status %d cannot be stored: %w", resp.Status, vocab.ErrNotFinal)
	}
	if len(resp.Body) > x.env.MaxResponseBytes {
		return keytable.StoredResponse{}, nil, fmt.Errorf("%w: %d bytes, the limit is %d", vocab.ErrResponseTooLarge, len(resp.Body), x.env.MaxResponseBytes)
	}
	headers, err := StoredHeaders(resp.Header, x.env.Keeps)
	if err != nil {
		return keytable.StoredResponse{}, nil, err
	}
	data, err := x.data()
	if err != nil {
		return keytable.StoredResponse{}, nil, err
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	stored, err := x.env.Seal(ctx, x.fence.Scope, x.fence.Key, keytable.StoredResponse{Status: resp.Status, Headers: headers, Body: body})
	return stored, data, err
}

// StoredHeaders is h as a response stores it: the headers keeps keeps, JSON-encoded.
// Names that differ only in case are one header: their values are merged, in the
// order of the names as written, so that what is stored does not depend on map
// iteration. The encoding is byte for byte json.Marshal's of the merged map (names
// sorted, a name without values null), written without its reflection and map: every
// fresh request that answers stores one (a test compares the two). It never fails;
// the error is for the signature's callers.
func StoredHeaders(h map[string][]string, keeps func(canonical string) bool) ([]byte, error) {
	type kept struct{ canonical, name string }
	ks := make([]kept, 0, 8) // on the stack for the usual few headers
	for k := range h {
		if ck := textproto.CanonicalMIMEHeaderKey(k); keeps(ck) {
			ks = append(ks, kept{ck, k})
		}
	}
	slices.SortFunc(ks, func(a, b kept) int {
		return cmp.Or(strings.Compare(a.canonical, b.canonical), strings.Compare(a.name, b.name))
	})
	buf := append(make([]byte, 0, storedHeadersCap), '{')
	for i := 0; i < len(ks); {
		j, values := i, 0
		for ; j < len(ks) && ks[j].canonical == ks[i].canonical; j++ {
			values += len(h[ks[j].name])
		}
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(appendJSONString(buf, ks[i].canonical), ':')
		if values == 0 { // json.Marshal's nil slice: no name had a value
			buf = append(buf, "null"...)
		} else {
			sep := byte('[')
			for _, k := range ks[i:j] {
				for _, v := range h[k.name] {
					buf = appendJSONString(append(buf, sep), v)
					sep = ','
				}
			}
			buf = append(buf, ']')
		}
		i = j
	}
	return append(buf, '}'), nil
}

// storedHeadersCap is room for a usual answer's stored headers (a content type and a
// location).
const storedHeadersCap = 128

// newRun returns the run a phase function gets, with the stored phase data (a JSON
// object, or empty). A phases.Run is a runstate.Run: the engine keeps its state.
func newRun(info runstate.Info, data []byte) (*phases.Run, error) {
	st, err := runstate.New(info, data)
	return (*phases.Run)(st), err
}

// state is the run's state: the phase entered, the phase data and its saved copy.
func (x *Exec) state() *runstate.Run { return (*runstate.Run)(x.run) }

// runTx calls a tx phase's function, turning a panic into a transient error.
func runTx(ctx context.Context, p phases.Phase, tx phases.DBTX, run *phases.Run) (resp *phases.Response, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, &phases.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return p.TxFunc(ctx, tx, run)
}

// runCall calls a call phase's function, turning a panic into a transient error.
func runCall(ctx context.Context, p phases.Phase, run *phases.Run) (resp *phases.Response, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, &phases.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return p.CallFunc(ctx, run)
}

// leaseMargin is how long before the lease ends a call phase's context ends.
func leaseMargin(lease time.Duration) time.Duration {
	return min(max(lease/10, 200*time.Millisecond), 5*time.Second)
}

// conflictDelay spaces out re-runs of a transaction that hit a serialization failure.
func conflictDelay(try int) time.Duration {
	base := time.Duration(1<<min(try, 6)) * time.Millisecond
	return base + rand.N(base)
}

func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
