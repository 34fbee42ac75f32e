package workflow

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/pgpipe"
	"github.com/idemflow/idemflow/internal/pipestate"
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
// implicit transaction (phaseTx.send's sendImplicit), and on a plain key table a new
// key's row is inserted right after the claim lock, the insert's primary key doing
// the claim's check (pipeBatch): a fresh key's phase is then the claim lock, the
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

// head queues the claim (a new key) or the fence (an existing key) at the head of a
// pipelined phase's transaction.
func (x *exec) head(b *pgx.Batch) {
	if x.claim != nil {
		x.e.store.QueuePipeClaim(b, *x.claim)
		return
	}
	x.e.store.QueuePipeFence(b, x.fence)
}

// readHead reads the result of head.
func (x *exec) readHead(br pgx.BatchResults) error {
	if x.claim != nil {
		return x.e.store.ReadPipeClaim(br)
	}
	created, err := x.e.store.ReadPipeFence(br)
	if err == nil {
		x.fence.CreatedAt = created
	}
	return err
}

// pipeOnce runs one transaction of a pipelined tx phase: the builder, then one round
// trip with everything, or two with the statements' results read in between. Its
// connection is back in the pool when it returns; what else its step needs is for
// settle.
func (x *exec) pipeOnce(ctx context.Context, p phases.Phase, ev PhaseEvent) (st step) {
	ctx, cancel := context.WithTimeoutCause(ctx, x.e.cfg.Lease, ErrLeaseExpired)
	defer cancel()
	x.state().Enter(p.Name)
	defer func() {
		if st.kind != stepNext && st.kind != stepFinished {
			x.state().Revert()
		}
	}()
	pl, v := build(p, x.run)
	if v.kind == respondAlone || v.kind == fail { // nothing was sent
		return x.verdictStep(v)
	}
	tx, err := x.open(ctx, "")
	if err != nil {
		return x.failed(err)
	}
	defer tx.done(ctx)
	one := pl // the whole transaction goes in the round trip of the commit
	if pl.results {
		one = nil
		if st, ok := x.pipeStatements(ctx, tx, pl, ev); !ok {
			return st
		}
		if pl.then != nil {
			if v = pl.runThen(x.run); v.kind == respondAlone || v.kind == fail {
				return x.verdictStep(v)
			}
		}
	}
	return x.pipeFinish(ctx, tx, p.Name, ev, v, one)
}

// verdictStep is the step of a phase that failed before anything of it could commit.
func (x *exec) verdictStep(v verdict) step {
	if v.kind == respondAlone {
		return step{kind: stepAlone, resp: v.resp, err: v.err}
	}
	st := x.failed(keytable.Classify(v.err))
	st.resp = v.resp
	return st
}

// pipeFailure carries the verdict of a phase's statement that failed inside the round
// trip that also carries the commit.
type pipeFailure struct{ v verdict }

func (f pipeFailure) Error() string { return f.v.err.Error() }
func (f pipeFailure) Unwrap() error { return f.v.err }

// pipeStatements sends the first round trip of a two-round-trip phase: BEGIN, the
// claim or fence and the phase's statements, and reads their results through the
// callbacks. It reports whether the phase may go on; if not, the step says why.
func (x *exec) pipeStatements(ctx context.Context, tx *phaseTx, pl *pipeline, ev PhaseEvent) (step, bool) {
	b := &pgx.Batch{}
	b.Queue(tx.begin)
	tx.begun = true
	x.head(b)
	guard := len(b.QueuedQueries)
	pl.queue(b)
	br := pgpipe.SendGuarded(ctx, tx.conn, b, guard)
	defer br.Close()
	if err := readBegin(br); err != nil {
		return x.failed(err), false
	}
	if err := x.readHead(br); err != nil {
		return x.headLost(ctx, err), false
	}
	if x.claim != nil {
		x.e.cfg.Hooks.claimHeld(ctx, ev)
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
func (x *exec) headLost(ctx context.Context, err error) step {
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

// pipeFinish writes the key row as v asks and commits: in the round trip that also
// carries the claim or fence and the statements of one when one is set, or in a
// round trip of its own.
func (x *exec) pipeFinish(ctx context.Context, tx *phaseTx, phase string, ev PhaseEvent, v verdict, one *pipeline) step {
	w := keyWrite{target: phase}
	var err error
	if v.kind == respond {
		var stored keytable.StoredResponse
		stored, w.data, err = x.storable(ctx, v.resp)
		stored.History = x.history(OutcomeFinished, "", nil)
		w.target, w.resp = phases.Finished, &stored
	} else {
		w.data, err = x.data()
		w.beforeCall = x.callNext(phase)
	}
	if err != nil {
		return x.failed(err)
	}
	x.e.cfg.Hooks.beforeCommit(ctx, ev)
	sent := time.Now()
	err = x.pipeCommit(ctx, tx, w, one)
	var pf pipeFailure
	switch {
	case errors.As(err, &pf):
		return x.verdictStep(pf.v)
	case err != nil:
		return x.failed(err)
	case v.kind == respond:
		return step{kind: stepFinished, out: x.finished(v.resp)}
	}
	x.rp = phase
	x.leaseEnd = sent.Add(x.e.cfg.Lease)
	return step{kind: stepNext}
}

// pipeQueue returns how a pipelined phase writes w: the plain insert of a new key's
// row (its claim is held), or the plain update of the row its fence locked.
func (x *exec) pipeQueue(w keyWrite) (func(*pgx.Batch), func(pgx.BatchResults) error) {
	st := x.e.store
	switch c := x.claim; {
	case c != nil && w.resp != nil:
		return func(b *pgx.Batch) { st.QueueInsertFinished(b, *c, *w.resp) }, st.ReadInsert
	case c != nil:
		return func(b *pgx.Batch) { st.QueuePipeInsertKey(b, *c, w.target, w.data) }, func(br pgx.BatchResults) error {
			created, err := st.ReadPipeInsertKey(br)
			x.fence.CreatedAt = created
			return err
		}
	case w.resp != nil:
		return func(b *pgx.Batch) { st.QueuePipeFinish(b, x.fence, *w.resp) }, st.ReadPipeWrite
	}
	return func(b *pgx.Batch) {
		st.QueuePipeAdvance(b, x.fence, keytable.Advance{RecoveryPoint: w.target, Data: w.data, Lease: x.e.cfg.Lease})
	}, st.ReadPipeWrite
}

// pipeCommit sends the key row's write w and COMMIT, after the claim or fence and the
// statements of one when set, and settles what a failure means as commit does for a
// Go-code phase: a commit whose outcome is unknown is resolved by reading the key row
// again, and the commit that carries a new key's claim is sent only if the caller
// still waits and no drain gave the attempt up.
//
// A phase sent whole in one round trip goes as an implicit transaction, without BEGIN
// and COMMIT, unless the session's default isolation level is not READ COMMITTED: the
// first batch to find that out raised before anything of it ran, and is sent again
// with BEGIN (keytable.ErrNotReadCommitted). A phase with a statement that needs a
// transaction block goes with BEGIN from the start (sqlShape.blockOnly); one the check
// missed is refused whole by the server, and sent again with BEGIN (needsBlock).
func (x *exec) pipeCommit(ctx context.Context, tx *phaseTx, w keyWrite, one *pipeline) error {
	if x.claim != nil {
		cctx, done, err := x.claiming(ctx)
		if err != nil {
			return err
		}
		defer done()
		ctx = cctx
	}
	queue, read := x.pipeBatch(w, one)
	tx.flushed = w.beforeCall && !x.insertsAtClaim(one) // else the claim lock carries it
	mode := sendPipelined
	if one != nil && !one.explicit && !x.e.store.SendExplicit() {
		mode = sendImplicit
	}
	err := tx.send(ctx, queue, read, mode)
	if mode == sendImplicit && (errors.Is(err, keytable.ErrNotReadCommitted) || needsBlock(err)) {
		err = tx.send(ctx, queue, read, sendPipelined)
	}
	if err == nil {
		x.committed(ctx, w.target)
		return nil
	}
	broken := tx.conn.IsClosed()
	tx.done(ctx) // before anything else uses the pool
	var pf pipeFailure
	switch {
	case errors.As(err, &pf) && broken:
		// A statement's result was lost with the connection, maybe after the round trip
		// that ends the transaction was sent (on a connection that had not prepared the
		// statements, after the claim's result came back): the outcome is unknown.
		return x.unknownCommit(ctx, w, err)
	case errors.As(err, &pf), claimLost(err), errors.Is(err, keytable.ErrConflict), errors.Is(err, keytable.ErrNotSent):
		return err
	case errors.Is(err, keytable.ErrLeaseLost):
		x.lostAtCommit = true
		return err
	case errors.Is(err, keytable.ErrUnavailable), ctx.Err() != nil:
		return x.unknownCommit(ctx, w, err)
	}
	return err
}

// needsBlock reports whether err is a statement's refusal to run outside a
// transaction block (25P01: LOCK, DECLARE without HOLD), which an implicit transaction
// is not: the server rolled the whole batch back, and it is sent again with BEGIN.
func needsBlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25P01"
}

// pipeBatch returns how the commit's round trip queues and reads the key row's write
// w, after the claim or fence and the statements of one when set; those decide
// whether the phase's statements may run (the queue's guard).
//
// A new key's claim on a plain key table is then the claim lock and, right after it,
// the insert of the row as w leaves it, which raises on the primary key when the row
// exists: the statements come after both, and nothing is written at the end
// (internal/keytable/pipeline.go). Elsewhere the claim (with its check that no row
// exists) or the fence goes first and the write last.
func (x *exec) pipeBatch(w keyWrite, one *pipeline) (queueFunc, func(pgx.BatchResults) error) {
	write, read := x.pipeQueue(w)
	if one == nil {
		return func(b *pgx.Batch) int { write(b); return 0 }, read
	}
	st := x.e.store
	atClaim := x.insertsAtClaim(one)
	queue := func(b *pgx.Batch) int {
		n := len(b.QueuedQueries)
		switch {
		case atClaim && w.beforeCall: // the commit must be durable: the lock says so too
			st.QueuePipeClaimLockFlushed(b, *x.claim)
			write(b)
		case atClaim:
			st.QueuePipeClaimLock(b, *x.claim)
			write(b)
		default:
			x.head(b)
		}
		guard := len(b.QueuedQueries) - n
		one.queue(b)
		if !atClaim {
			write(b)
		}
		return guard
	}
	return queue, func(br pgx.BatchResults) error {
		var err error
		if atClaim {
			if err = st.ReadPipeClaimLock(br); err == nil {
				err = read(br)
			}
		} else {
			err = x.readHead(br)
		}
		if err != nil {
			return err
		}
		if v := one.readStatements(br); v.kind != goOn {
			return pipeFailure{v}
		}
		if !atClaim {
			return read(br)
		}
		return nil
	}
}

// insertsAtClaim reports whether the commit's round trip, which carries the phase's
// statements one when set, claims a new key with the claim lock alone followed at once
// by the key row's insert (pipeBatch).
func (x *exec) insertsAtClaim(one *pipeline) bool {
	return one != nil && x.claim != nil && x.e.store.PipeInsertsAtClaim()
}

// unknownCommit resolves a commit whose outcome is unknown by reading the key row.
func (x *exec) unknownCommit(ctx context.Context, w keyWrite, err error) error {
	committed, rerr := x.resolve(ctx, w.target, w.resp != nil)
	if rerr != nil {
		// Neither outcome can be ruled out, so nothing may be released or redone here:
		// the lease runs out and the next attempt reads the truth.
		return &TransientError{Phase: w.target, RetryAfter: max(time.Until(x.leaseEnd), time.Second), Err: errors.Join(err, rerr)}
	}
	if committed {
		x.stored = w.target
		x.claim = nil
		return nil
	}
	return err
}
