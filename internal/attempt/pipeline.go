package attempt

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/pgpipe"
	"github.com/idemflow/idemflow/internal/pipestate"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// A pipelined tx phase (phases.Pipelined) declares its statements before any is sent,
// so its transaction goes out whole: BEGIN, the claim of a new key or the fence of an
// existing one, the phase's statements, the write of the key row and COMMIT, in one
// round trip. A phase whose statements have result callbacks, or whose answer is
// decided by a Then function, takes two: BEGIN, the claim or fence and the statements;
// then, once the callbacks and Then have run, the key row's write and COMMIT.
//
// The claim or the fence goes first and raises only when this attempt may not run the
// phase (internal/keytable/pipeline.go): the server then skips everything after it, so a loser runs
// none of the phase's statements and never waits for a lock.
//
// A phase that goes in one round trip is sent without BEGIN and COMMIT, as one
// implicit transaction (plan.implicit), and on a plain key table a new
// key's row is inserted right after the claim lock, the insert's primary key doing
// the claim's check (Exec.plan): a fresh key's phase is then the claim lock, the
// insert and the phase's statements.

// pipeline is one run of a pipelined phase's builder.
type pipeline struct {
	p     phases.Pipeline
	stmts []*pgx.QueuedQuery
	then  func(*phases.Run) (*phases.Response, error)
	// results: a statement has a callback or the answer has a Then function, so the
	// statements' results are read before the commit, in a round trip of their own.
	results bool
	// explicit: a statement needs the transaction block BEGIN opens
	// (sqlShape.blockOnly), so the phase never goes as an implicit transaction.
	explicit bool
}

// build runs the phase's builder, turning a panic into a transient error.
func build(p phases.Phase, run *phases.Run) (pl *pipeline, v verdict) {
	pl = &pipeline{}
	defer func() {
		if r := recover(); r != nil {
			v = verdict{kind: fail, err: &phases.PanicError{Value: r, Stack: debug.Stack()}}
		}
	}()
	v = decide(p.Pipeline(run, &pl.p))
	st := (*pipestate.Pipeline[*phases.Run, *phases.Response])(&pl.p)
	pl.stmts, pl.then = st.Statements(), st.Then()
	pl.results = pl.then != nil
	for _, q := range pl.stmts {
		pl.results = pl.results || q.Fn != nil
	}
	for i, q := range pl.stmts {
		block, why, err := checkStatement(q.SQL)
		pl.explicit = pl.explicit || block
		if v.kind != fail && why != "" { // refused before anything is sent
			v = verdict{kind: fail, err: &statementError{phase: p.Name, index: i, sql: q.SQL, why: why, err: err}}
		}
	}
	if pl.then != nil && v.kind != goOn && v.kind != fail {
		v = verdict{kind: fail, err: fmt.Errorf("pipelined phase %q registered Then and also answered", p.Name)}
	}
	return pl, v
}

// queue adds the phase's statements to b, without their callbacks: the engine reads
// their results itself (readStatements), so that pgx never runs a callback on its own.
// A statement with no callback is added as it is, without a copy.
func (pl *pipeline) queue(b *pgx.Batch) {
	for _, q := range pl.stmts {
		if q.Fn == nil {
			b.QueuedQueries = append(b.QueuedQueries, q)
			continue
		}
		b.Queue(q.SQL, q.Arguments...)
	}
}

// readStatements reads the results of the phase's statements, in order, running their
// callbacks. It returns the verdict of the first that failed (a statement's error, a
// callback's error or panic), or goOn.
func (pl *pipeline) readStatements(br pgx.BatchResults) verdict {
	for _, q := range pl.stmts {
		if err := readOne(q, br); err != nil {
			return decide(nil, err)
		}
	}
	return verdict{kind: goOn}
}

// readOne reads one statement's result, through its callback if it has one.
func readOne(q *pgx.QueuedQuery, br pgx.BatchResults) (err error) {
	if q.Fn == nil {
		_, err = br.Exec()
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			err = &phases.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return q.Fn(br)
}

// runThen runs the phase's Then function, turning a panic into a transient error.
func (pl *pipeline) runThen(run *phases.Run) (v verdict) {
	defer func() {
		if r := recover(); r != nil {
			v = verdict{kind: fail, err: &phases.PanicError{Value: r, Stack: debug.Stack()}}
		}
	}()
	return decide(pl.then(run))
}

// pipeBody is a pipelined phase's body: pl's statements, already built with verdict
// v. A phase that needs no result before its end sends nothing here: its whole
// transaction goes in the round trip of the commit (one is pl). Otherwise a first round
// trip sends BEGIN, the claim or fence and the statements, and reads their results
// through the callbacks (pipeStatements); then the phase's Then function decides its
// answer. ok is false when the phase stops there; st then says why.
func (x *Exec) pipeBody(ctx context.Context, tx *phaseTx, pl *pipeline, v verdict, ev vocab.PhaseEvent) (_ verdict, one *pipeline, st step, ok bool) {
	if !pl.results {
		return v, pl, step{}, true
	}
	if st, ok := x.pipeStatements(ctx, tx, pl, ev); !ok {
		return v, nil, st, false
	}
	if pl.then != nil {
		v = pl.runThen(x.run)
	}
	return v, nil, step{}, true
}

// pipeFailure carries the verdict of a phase's statement that failed inside the round
// trip that also carries the commit.
type pipeFailure struct{ v verdict }

func (f pipeFailure) Error() string { return f.v.err.Error() }
func (f pipeFailure) Unwrap() error { return f.v.err }

// pipeStatements sends the first round trip of a two-round-trip phase: BEGIN, the
// claim or the locking fence (phaseTx.head) and the phase's statements, and reads
// their results through the callbacks. It reports whether the phase may go on; if
// not, the step says why.
func (x *Exec) pipeStatements(ctx context.Context, tx *phaseTx, pl *pipeline, ev vocab.PhaseEvent) (step, bool) {
	if x.claim != nil {
		tx.startWith(keytable.Head{Claim: x.claim})
	} else {
		tx.startWith(keytable.Head{Fence: x.fence, Lock: true})
	}
	b := &pgx.Batch{}
	guard := tx.head(b)
	pl.queue(b)
	br := pgpipe.SendGuarded(ctx, tx.conn, b, guard)
	defer br.Close()
	if err := tx.readHead(br); err != nil {
		return x.headLost(err), false
	}
	if x.claim != nil { // the statements behind the claim are on their way (readHead)
		x.env.claimHeld(ctx, ev)
	}
	if v := pl.readStatements(br); v.kind != goOn {
		return x.verdictStep(v), false
	}
	if err := br.Close(); err != nil {
		return x.failed(keytable.Classify(err)), false
	}
	return step{}, true
}

// headLost is the step of a claim or fence that refused this attempt.
func (x *Exec) headLost(err error) step {
	switch {
	case errors.Is(err, keytable.ErrClaimBusy):
		return step{kind: stepLost, lost: claimBusy, err: err}
	case errors.Is(err, keytable.ErrClaimExists):
		return step{kind: stepLost, lost: claimExists, err: err}
	case errors.Is(err, keytable.ErrLeaseLost):
		x.lostAtCommit = true // the fence is the commit's check, sent first: reported as lost
	}
	return x.failed(err)
}
