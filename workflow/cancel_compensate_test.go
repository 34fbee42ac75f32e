package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// xfer is a flow with a compensation, on tables of the test's own: debit (tx) writes a
// move, send (call) may fail, settle (tx) answers. Its compensation, undo, deletes the
// debit's move and records an undo, each exactly once or it fails.
type xfer struct {
	b       *bundle
	mu      sync.Mutex
	sendErr error // send fails with it when set
	// send and settle, when set, pause those phases (settle after its write, before
	// its commit): a paused executor that holds the key.
	sendGate, settleGate *phaseGate
	// undoHold pauses the compensation after its delete; undoPID gets its backend.
	undoHold    chan struct{}
	undoEntered chan int
	undoFail    error // the compensation fails with it, after its delete
	undoPanic   bool
	// seen records each compensation run: the recovery point, the body, the slot.
	seen []string
}

// phaseGate pauses a phase: entered is closed when it gets there, and it waits for let.
type phaseGate struct{ entered, let chan struct{} }

func newPhaseGate() *phaseGate {
	return &phaseGate{entered: make(chan struct{}), let: make(chan struct{})}
}

func (g *phaseGate) pass() {
	if g != nil {
		close(g.entered)
		<-g.let
	}
}

var moveSlot = phases.NewSlot[string]("move")

const xferSchema = `CREATE TABLE x_moves (scope text, key text, what text);
CREATE TABLE x_undos (scope text, key text, reached text);`

func newXfer(t *testing.T, comp bool) *xfer {
	t.Helper()
	b := setup(t, setupOpts{})
	_, err := b.db.Pool.Exec(context.Background(), xferSchema)
	require.NoError(t, err)
	x := &xfer{b: b}
	require.NoError(t, b.engine.Register(x.flow(comp)))
	return x
}

func (x *xfer) flow(comp bool) phases.Flow {
	f := phases.Flow{Name: "xfer", Phases: []phases.Phase{
		phases.Tx("debit", x.debit),
		phases.Call("send", x.send),
		phases.Tx("settle", x.settle),
	}}
	if comp {
		f.Compensation = phases.Compensate("undo", x.undo)
	}
	return f
}

func (x *xfer) debit(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO x_moves VALUES ($1, $2, 'debit')`, run.Scope(), run.Key()); err != nil {
		return nil, err
	}
	return nil, moveSlot.Set(run, "mv_"+run.ID())
}

func (x *xfer) send(context.Context, *phases.Run) (*phases.Response, error) {
	x.sendGate.pass()
	return nil, x.sendErr
}

func (x *xfer) settle(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO x_moves VALUES ($1, $2, 'settle')`, run.Scope(), run.Key()); err != nil {
		return nil, err
	}
	x.settleGate.pass()
	return &phases.Response{Status: 201, Body: []byte(`{"sent":true}`)}, nil
}

func (x *xfer) undo(ctx context.Context, tx phases.DBTX, run *phases.Run, reached string) error {
	mv, _, err := moveSlot.Lookup(run)
	if err != nil {
		return err
	}
	x.mu.Lock()
	x.seen = append(x.seen, fmt.Sprintf("%s %s %s %s", reached, run.Phase(), run.Body(), mv))
	x.mu.Unlock()
	if reached == phases.Started {
		return nil // debit did not commit: nothing to undo
	}
	tag, err := tx.Exec(ctx, `DELETE FROM x_moves WHERE scope = $1 AND key = $2 AND what = 'debit'`, run.Scope(), run.Key())
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("undo: %d debits", tag.RowsAffected())
	}
	if x.undoHold != nil {
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		x.undoEntered <- pid
		<-x.undoHold
	}
	if x.undoPanic {
		panic("undo panics")
	}
	if x.undoFail != nil {
		return x.undoFail
	}
	_, err = tx.Exec(ctx, `INSERT INTO x_undos VALUES ($1, $2, $3)`, run.Scope(), run.Key(), reached)
	return err
}

func xreq(key string) workflow.Request {
	return workflow.Request{Scope: "s", Key: key, Flow: "xfer", Method: "POST", Route: "/xfer", Body: []byte(`{"amount":3}`)}
}

// rows counts the key's moves (debit, settle) and undos.
func (x *xfer) rows(t *testing.T, key string) (debits, undos int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, x.b.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM x_moves WHERE key = $1),
		(SELECT count(*) FROM x_undos WHERE key = $1)`, key).Scan(&debits, &undos))
	return debits, undos
}

// stuckAtDebit leaves key in progress at debit: send failed.
func (x *xfer) stuckAtDebit(t *testing.T, key string) {
	t.Helper()
	x.sendErr = errors.New("provider down")
	_, err := x.b.engine.Do(context.Background(), xreq(key))
	require.ErrorIs(t, err, workflow.ErrTransient)
	x.sendErr = nil
	require.Equal(t, "debit", state(t, x.b.db, "s", key).RecoveryPoint)
}

var cancelAnswer = workflow.CancelOptions{Status: 409, Header: map[string][]string{"Content-Type": {"application/json"}},
	Body: []byte(`{"error":"cancelled"}`), Force: true}

// cancelEntries counts the key's history entries of a cancel, and the phases they ran.
func cancelEntries(t *testing.T, e *workflow.Engine, key string) (n int, ran []string) {
	t.Helper()
	info, err := e.InspectKey(context.Background(), "s", key)
	require.NoError(t, err)
	for _, a := range info.History {
		if a.Outcome == workflow.OutcomeOperatorCancelled {
			n++
			ran = append(ran, a.Phases...)
		}
	}
	return n, ran
}

// TestCancelCompensates: a key stuck after debit committed is cancelled: the preview
// names the compensation and its recovery point, the compensation gets the key as its
// phases see it (the recovery point, its own name, the request body, the phase data),
// its undo commits with the cancel, the answer is replayed, and a second cancel is
// refused without running the compensation again.
func TestCancelCompensates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x := newXfer(t, true)
	e := x.b.engine
	x.stuckAtDebit(t, "k")
	require.Equal(t, [2]int{1, 0}, pair(x.rows(t, "k")))

	p, err := e.PreviewCancel(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, "undo", p.Compensation)
	require.Equal(t, "debit", p.RecoveryPoint)
	require.NotNil(t, p.Refused, "send may have run")
	require.Equal(t, `will run compensation "undo" of flow "xfer" from recovery point "debit", in the cancel's transaction`, p.Effect(false))
	require.Contains(t, p.Effect(true), "skipped")

	noForce := cancelAnswer
	noForce.Force = false
	require.ErrorIs(t, e.CancelKey(ctx, "s", "k", noForce), workflow.ErrCallMayHaveRun)
	require.Empty(t, x.seen, "a refused cancel runs nothing")

	id := state(t, x.b.db, "s", "k")
	require.NoError(t, e.CancelKey(ctx, "s", "k", cancelAnswer))
	require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")), "the debit undone, once")
	info, err := e.InspectKey(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, []string{`debit undo {"amount":3} mv_` + info.ID}, x.seen)
	st := state(t, x.b.db, "s", "k")
	require.Equal(t, "finished", st.Status)
	require.Equal(t, id.LockVersion+1, st.LockVersion)
	n, ran := cancelEntries(t, e, "k")
	require.Equal(t, 1, n)
	require.Equal(t, []string{"undo"}, ran, "the history names the compensation")

	res, err := e.Do(ctx, xreq("k"))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 409, res.Response.Status)
	require.Equal(t, cancelAnswer.Body, res.Response.Body)
	require.ErrorIs(t, e.CancelKey(ctx, "s", "k", cancelAnswer), workflow.ErrWrongStatus)
	_, err = e.PreviewCancel(ctx, "s", "k")
	require.ErrorIs(t, err, workflow.ErrWrongStatus)
	sweepable(t, x.b.db)
	require.Empty(t, sweepOnce(t, e, 5))
	require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")), "nothing ran twice")
	require.Len(t, x.seen, 1)
}

func pair(a, b int) [2]int { return [2]int{a, b} }

// TestCancelCompensationFails: a compensation that fails (an error, a panic) after
// its delete leaves every row as it was, the key's included, and the key not
// cancelled; the error names the compensation and matches ErrCompensationFailed. A
// later cancel, once it works, undoes once.
func TestCancelCompensationFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x := newXfer(t, true)
	e := x.b.engine
	x.stuckAtDebit(t, "k")
	before := keyRow(t, x.b.db, "s", "k")

	x.undoFail = errors.New("ledger closed")
	err := e.CancelKey(ctx, "s", "k", cancelAnswer)
	require.ErrorIs(t, err, workflow.ErrCompensationFailed)
	var ce *workflow.CompensationError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, "undo", ce.Compensation)
	require.Equal(t, "debit", ce.RecoveryPoint)
	require.ErrorIs(t, err, x.undoFail)
	require.Contains(t, err.Error(), `compensation "undo" of flow "xfer" from recovery point "debit"`)
	require.Contains(t, err.Error(), "not cancelled")
	require.Equal(t, before, keyRow(t, x.b.db, "s", "k"), "the key row as it was")
	require.Equal(t, [2]int{1, 0}, pair(x.rows(t, "k")), "the delete rolled back")

	x.undoFail, x.undoPanic = nil, true
	err = e.CancelKey(ctx, "s", "k", cancelAnswer)
	var pe *phases.PanicError
	require.True(t, errors.As(err, &pe), "%v", err)
	require.ErrorIs(t, err, workflow.ErrCompensationFailed)
	require.Equal(t, before, keyRow(t, x.b.db, "s", "k"))
	require.Equal(t, [2]int{1, 0}, pair(x.rows(t, "k")))

	x.undoPanic = false
	require.NoError(t, e.CancelKey(ctx, "s", "k", cancelAnswer))
	require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")))
	n, _ := cancelEntries(t, e, "k")
	require.Equal(t, 1, n)
}

// TestCancelFencesStaleExecutor: an executor that holds the key (its lease live) and
// is paused, in send after debit committed or in settle's open transaction after its
// write, cannot commit after the cancel: the cancel's compensation ran from the
// recovery point the row had (debit either way: send's result commits with settle),
// and the holder's later commit is refused with nothing of it kept.
func TestCancelFencesStaleExecutor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, at string }{{"InSend", "debit"}, {"InSettle", "debit"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			x := newXfer(t, true)
			g := newPhaseGate()
			if tc.name == "InSend" {
				x.sendGate = g
			} else {
				x.settleGate = g
			}
			done := make(chan error, 1)
			go func() { _, err := x.b.engine.Do(ctx, xreq("k")); done <- err }()
			<-g.entered
			let := sync.OnceFunc(func() { close(g.let) })
			t.Cleanup(let) // a failure below must not leave the holder paused
			require.Equal(t, tc.at, state(t, x.b.db, "s", "k").RecoveryPoint)
			require.NoError(t, x.b.engine.CancelKey(ctx, "s", "k", cancelAnswer))
			require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")))
			cancelled := keyRow(t, x.b.db, "s", "k")
			let()
			require.ErrorIs(t, <-done, workflow.ErrLeaseLost, "the holder's settle is fenced")
			require.Equal(t, cancelled, keyRow(t, x.b.db, "s", "k"), "nothing of the holder committed")
			require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")), "its settle's write rolled back")
			require.Equal(t, []string{tc.at}, reached(x.seen))
		})
	}
}

// reached is the recovery point of each compensation run seen.
func reached(seen []string) []string {
	var out []string
	for _, s := range seen {
		out = append(out, strings.Fields(s)[0])
	}
	return out
}

// TestCancelRacesACommit: while the compensation runs (from debit), the holder
// commits settle and finishes the key with its answer. The cancel's fenced write then
// misses, so the compensation's undo rolls back with it: the key keeps the holder's
// answer and its debit, and the cancel is refused as finished.
func TestCancelRacesACommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x := newXfer(t, true)
	x.sendGate = newPhaseGate()
	hold := make(chan struct{})
	let := sync.OnceFunc(func() { close(hold) })
	letSend := sync.OnceFunc(func() { close(x.sendGate.let) })
	t.Cleanup(func() { letSend(); let() }) // a failure below must leave nothing paused
	x.undoHold, x.undoEntered = hold, make(chan int, 1)
	held := make(chan error, 1)
	go func() { _, err := x.b.engine.Do(ctx, xreq("k")); held <- err }()
	<-x.sendGate.entered
	cancelled := make(chan error, 1)
	go func() { cancelled <- x.b.engine.CancelKey(ctx, "s", "k", cancelAnswer) }()
	<-x.undoEntered // the compensation deleted the debit, uncommitted
	letSend()
	require.NoError(t, <-held, "the holder's settle commits: the cancel has not written the key row yet")
	let()
	err := <-cancelled
	require.ErrorIs(t, err, workflow.ErrWrongStatus, "read again, the key is finished")
	require.Equal(t, [2]int{2, 0}, pair(x.rows(t, "k")), "the undo rolled back with the cancel's write: debit and settle stay")
	res, err := x.b.engine.Do(ctx, xreq("k"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status, "the holder's answer")
	n, _ := cancelEntries(t, x.b.engine, "k")
	require.Zero(t, n)
}

// TestCancelCompensationCrash: the compensation's backend is terminated in the middle
// of it (after its delete, before its insert and the cancel's commit): nothing
// commits, the key stays as it was; a sweeper leaves it unfinished until a second
// cancel, which runs the compensation again: the debit is undone exactly once and
// the key is cancelled once.
func TestCancelCompensationCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x := newXfer(t, true)
	e := x.b.engine
	x.stuckAtDebit(t, "k")
	before := keyRow(t, x.b.db, "s", "k")
	hold := make(chan struct{})
	let := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(let) // a failure below must not leave the compensation paused
	x.undoHold, x.undoEntered = hold, make(chan int, 1)
	cancelled := make(chan error, 1)
	go func() { cancelled <- e.CancelKey(ctx, "s", "k", cancelAnswer) }()
	pid := <-x.undoEntered
	terminate(t, x.b.db, pid)
	let()
	err := <-cancelled
	require.Error(t, err)
	require.ErrorIs(t, err, workflow.ErrCompensationFailed, "%v", err)
	require.Equal(t, before, keyRow(t, x.b.db, "s", "k"), "the key as it was")
	require.Equal(t, [2]int{1, 0}, pair(x.rows(t, "k")), "the delete died with its backend")

	x.undoHold = nil
	require.NoError(t, e.CancelKey(ctx, "s", "k", cancelAnswer))
	require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")), "undone exactly once")
	n, ran := cancelEntries(t, e, "k")
	require.Equal(t, 1, n, "cancelled once")
	require.Equal(t, []string{"undo"}, ran)
	require.Len(t, x.seen, 2, "the compensation ran twice, committed once")
	require.ErrorIs(t, e.CancelKey(ctx, "s", "k", cancelAnswer), workflow.ErrWrongStatus)
	require.Equal(t, [2]int{0, 1}, pair(x.rows(t, "k")))
}

// terminate ends the backend pid and waits until it is gone.
func terminate(t *testing.T, db *pgtest.DB, pid int) {
	t.Helper()
	var gone bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1::int, 60000::bigint)`, pid).Scan(&gone))
	require.True(t, gone)
}

// TestCancelWhereTheFlowIsUnknown: an engine that does not register the flow (as the
// CLI's) cannot tell whether it declares a compensation: a forced cancel is refused
// with ErrCompensationUnknown, changing nothing, until the compensation is skipped
// explicitly; the committed debit then stays. A flow without a compensation says so.
func TestCancelWhereTheFlowIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x := newXfer(t, true)
	x.stuckAtDebit(t, "k")
	before := keyRow(t, x.b.db, "s", "k")
	bare, err := workflow.New(x.b.db.Pool, nil)
	require.NoError(t, err)

	p, err := bare.PreviewCancel(ctx, "s", "k")
	require.NoError(t, err)
	require.True(t, p.FlowUnknown)
	require.Empty(t, p.Compensation)
	require.Contains(t, p.Effect(false), `flow "xfer" is not registered here`)
	err = bare.CancelKey(ctx, "s", "k", cancelAnswer)
	require.ErrorIs(t, err, workflow.ErrCompensationUnknown)
	require.Contains(t, err.Error(), "skip the compensation")
	require.Equal(t, before, keyRow(t, x.b.db, "s", "k"))

	skip := cancelAnswer
	skip.SkipCompensation = true
	require.NoError(t, bare.CancelKey(ctx, "s", "k", skip))
	require.Equal(t, [2]int{1, 0}, pair(x.rows(t, "k")), "skipped: the debit stays")
	require.Empty(t, x.seen)
	n, ran := cancelEntries(t, x.b.engine, "k")
	require.Equal(t, 1, n)
	require.Empty(t, ran)

	plain := newXfer(t, false)
	plain.stuckAtDebit(t, "k")
	p, err = plain.b.engine.PreviewCancel(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, `no compensation: flow "xfer" declares none; the writes of the phases committed up to recovery point "debit" stay`, p.Effect(false))
	require.NoError(t, plain.b.engine.CancelKey(ctx, "s", "k", cancelAnswer))
	require.Equal(t, [2]int{1, 0}, pair(plain.rows(t, "k")), "no compensation: the debit stays")
}
