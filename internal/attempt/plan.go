package attempt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/pgpipe"
	"github.com/idemflow/idemflow/internal/vocab"
)

// A tx phase's transaction is a head, a body, one write of the key row and a tail:
//
//   - the head decides whether this attempt may run the phase: a new key's claim, an
//     existing key's fence, or nothing (a transaction of the engine's own, or a
//     Go-code phase that sent no statement, whose fenced write is its check);
//   - the body is the phase's work: its Go code, which runs statement by statement
//     while the transaction is open (phaseTx), or its queued statements
//     (phases.Pipelined), sent whole;
//   - the write moves the key row to the phase (or finishes the key), built by plan
//     as one keytable.KeyWrite;
//   - the tail is COMMIT, or, for a pipelined phase sent in one round trip, the end of
//     the implicit transaction the server runs it as.
//
// The Go-code and pipelined phases differ only in the body. What goes in the round
// trip that ends the transaction is a plan, built by one function (Exec.plan) and
// sent by one sender (phaseTx.send); a head that went before (with the Go-code
// phase's first statement, or with a pipelined phase's statements whose results are
// read before the commit) is phaseTx.head's.

// keyWrite is what a commit writes to the key row: the recovery point it moves to and
// the phase data, and, when it finishes the key, the response.
type keyWrite struct {
	target string
	data   []byte
	resp   *keytable.StoredResponse
	// beforeCall: a call phase runs right after this commit, so the commit must be
	// durable before it is answered whatever synchronous_commit says
	// (keytable.KeyWrite.Flushed). The commit that stores the answer needs no such care:
	// losing it only makes the retry redo the work that was lost with it.
	beforeCall bool
}

// plan is the round trip that ends a transaction: BEGIN unless it was sent or the
// transaction is implicit, the head and the body when they go now, the key row's
// write and the tail.
type plan struct {
	// headed: head opens the transaction in this round trip, ahead of body, the
	// phase's statements. The write goes right after the head when the head is the
	// claim lock alone (InsertFollows), else last.
	headed bool
	head   keytable.Head
	body   *pipeline
	write  keytable.KeyWrite
	// implicit: neither BEGIN nor COMMIT: the server runs the round trip as one
	// implicit transaction, which commits when the protocol's Sync (or the end of the
	// simple protocol's query string) finds no error, and otherwise rolls back whole.
	implicit bool
}

// plan builds the round trip that ends tx with the key row's write w, carrying the
// pipelined phase's whole transaction when one is set.
//
// The write is a plain insert or update when tx holds the key (its claim, or its
// row's lock) or will by the head of this round trip; otherwise the insert claims the
// key in the same statement and the update is fenced. A row the claim inserted at
// once (insertedAtClaim) is updated, fenced.
//
// A pipelined phase sent whole starts with its claim or its fence, which locks the
// row. On a key table known to be plain, a new key's claim is the claim lock alone
// with the insert of the key row right after it, which raises on the primary key when
// the row exists; the lock then carries the durable commit before a call phase
// (Head.Flushed). Such a round trip goes as an implicit transaction, unless a
// statement needs a transaction block (sqlShape.blockOnly) or the Store learnt the
// session's isolation level is not READ COMMITTED (keytable.ErrNotReadCommitted) or
// has not learnt that the database lacks Citus (keytable.Store.SendExplicit).
func (x *Exec) plan(tx *phaseTx, w keyWrite, one *pipeline) plan {
	p := plan{body: one, write: keytable.KeyWrite{
		Claim: x.claim, Fence: x.fence, Held: tx.held,
		RecoveryPoint: w.target, Data: w.data, Lease: x.env.Lease, Response: w.resp,
		Flushed: w.beforeCall,
	}}
	if x.claim != nil {
		// The row the claim inserted (insertedAtClaim), or the transaction's start, which
		// the claim lock read and the held insert takes as its created_at: known, the
		// insert returns none. Zero otherwise: the held insert returns it.
		p.write.Fence.CreatedAt = tx.createdAt
	}
	if tx.insertedAtClaim {
		p.write.Claim = nil
	}
	if one == nil {
		return p
	}
	p.headed, p.write.Held = true, true
	p.head = keytable.Head{Claim: x.claim, Fence: x.fence, Lock: true}
	if x.claim != nil && x.env.Store.KnownUnpartitioned() {
		p.head.InsertFollows, p.head.Flushed = true, w.beforeCall
		p.write.Flushed = false
	}
	p.implicit = !one.explicit && !x.env.Store.SendExplicit()
	return p
}

// commit sends the round trip that ends tx with the key row's write w (plan), after
// the phase's statements one when they go with it, and settles what a failure means:
// a commit whose outcome is unknown (the connection broke after COMMIT may have been
// sent) is resolved by reading the key row again before anything else is decided.
//
// The commit that carries a new key's claim is sent only if the caller still waits
// and no drain gave the attempt up; once sent, it is detached from the caller.
//
// A round trip sent as an implicit transaction that finds the session's isolation
// level is not READ COMMITTED raised before anything of it ran, and one with a
// statement that needs a transaction block the check missed was refused whole by the
// server (needsBlock): either is sent again with BEGIN.
func (x *Exec) commit(ctx context.Context, tx *phaseTx, w keyWrite, one *pipeline) error {
	if x.claim != nil {
		cctx, done, err := x.claiming(ctx)
		if err != nil {
			return err
		}
		defer done()
		ctx = cctx
	}
	p := x.plan(tx, w, one)
	err := tx.send(ctx, &p)
	if p.implicit && (errors.Is(err, keytable.ErrNotReadCommitted) || needsBlock(err)) {
		p.implicit = false
		err = tx.send(ctx, &p)
	}
	if err == nil {
		if !tx.createdAt.IsZero() {
			x.fence.CreatedAt = tx.createdAt // the row the claim inserted, or the fence read
		}
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
		return err // nothing committed; ErrNotSent: nothing reached the server
	case errors.Is(err, keytable.ErrLeaseLost):
		x.lostAtCommit = true
		return err
	case errors.Is(err, keytable.ErrUnavailable), ctx.Err() != nil:
		return x.unknownCommit(ctx, w, err)
	}
	return err
}

// commitAlone commits a transaction of the engine's own statements, bounded by the
// lease like a tx phase: BEGIN, the key row's write (the insert that claims, if the
// claim is still pending) and COMMIT, in one round trip. Its connection is back in the
// pool when it returns.
func (x *Exec) commitAlone(ctx context.Context, w keyWrite) error {
	ctx, cancel := context.WithTimeoutCause(ctx, x.env.Lease, vocab.ErrLeaseExpired)
	defer cancel()
	tx, err := x.open(ctx, "")
	if err != nil {
		return leaseNamed(ctx, err)
	}
	defer tx.done(ctx)
	return x.commit(ctx, tx, w, nil)
}

// send sends p on t's connection and reads its answer: nil once the transaction
// committed. A head or a write that refuses aborts the transaction and the server
// skips the rest (COMMIT included); a head's refusal also keeps the server from acting
// on the statements after it, not even a Parse (which takes locks on the user's
// tables), so a loser never waits for a lock (pgpipe.SendGuarded).
//
// Once the lease that bounds ctx ran out (ErrLeaseExpired as its cause) nothing is
// sent, and a commit that fails after it ran out says so.
func (t *phaseTx) send(ctx context.Context, p *plan) (err error) {
	if cause := context.Cause(ctx); errors.Is(cause, vocab.ErrLeaseExpired) {
		return fmt.Errorf("commit: %w: %w", cause, keytable.ErrNotSent)
	}
	defer func() {
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, vocab.ErrLeaseExpired) && !errors.Is(err, vocab.ErrLeaseExpired) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}()
	implicit := p.implicit && !t.begun
	b := &pgx.Batch{}
	opened := !t.begun && !implicit
	if opened {
		b.Queue(t.begin)
		t.begun = true
	}
	var head, write keytable.Queued
	guard := 0
	if p.headed {
		head = t.store.QueueHead(b, p.head)
		if p.head.InsertFollows {
			write = t.store.QueueKeyWrite(b, p.write)
		}
		guard = len(b.QueuedQueries) // BEGIN, if sent, comes first
		p.body.queue(b)
	}
	if !p.head.InsertFollows {
		write = t.store.QueueKeyWrite(b, p.write)
	}
	if !implicit {
		b.Queue("COMMIT")
	}
	if !t.conn.IsClosed() { // every plan commits: a Go-code phase's COMMIT as much as a pipelined one
		defer func() { err = lostAnswer(err) }()
	}
	br := pgpipe.SendGuarded(ctx, t.conn, b, guard)
	defer br.Close()
	if opened {
		if err := readBegin(br); err != nil {
			return err
		}
	}
	switch rerr := t.read(br, p, head, write); {
	case rerr == nil:
	case !implicit && errors.Is(rerr, keytable.ErrClaimBusy):
		return t.endBusy(br, rerr)
	default:
		return rerr
	}
	if implicit {
		return t.implicitCommitted(br)
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("commit: %w", keytable.Classify(err))
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("commit: %w", keytable.Classify(err))
	}
	if !isCommitted(tag) {
		return fmt.Errorf("commit: server answered %q: %w", tag.String(), keytable.ErrConflict)
	}
	t.begun = false
	return nil
}

// read reads the results of p's head, body and write, in the order send queued them,
// keeping the created_at of the key row that one of them returned. A statement of the
// body that failed comes back as a pipeFailure.
func (t *phaseTx) read(br pgx.BatchResults, p *plan, head, write keytable.Queued) error {
	if p.headed {
		at, err := head.Read(br)
		if err == nil && p.head.InsertFollows {
			at, err = write.Read(br)
		}
		if err != nil {
			return err
		}
		t.keepCreated(at)
		if v := p.body.readStatements(br); v.kind != goOn {
			return pipeFailure{v}
		}
		if p.head.InsertFollows {
			return nil
		}
	}
	at, err := write.Read(br)
	t.keepCreated(at)
	return err
}

// keepCreated keeps at, the created_at a statement returned for the key row, unless
// it is zero (the statement returns none).
func (t *phaseTx) keepCreated(at time.Time) {
	if !at.IsZero() {
		t.createdAt = at
	}
}

// endBusy ends the transaction of a claim at commit that found the key's claim lock
// held by another attempt, and returns busy: the attempt lost the claim, whatever the
// COMMIT's answer. Nothing was written either way. The plain claim's insert wrote and
// aborted nothing, so its COMMIT ends an empty transaction; the checked claim's lock
// (a partitioned key table, or a layout not learnt yet) raised, so the server skipped
// the COMMIT, whose result is that error, and done rolls the transaction back.
func (t *phaseTx) endBusy(br pgx.BatchResults, busy error) error {
	if tag, err := br.Exec(); err == nil && isCommitted(tag) {
		t.begun = false
	}
	return busy
}

// lostAnswer is err, unless it says that a batch sent on an open connection never
// reached the server. pgx before v5.13 said so of a connection lost while a batch's
// answer was read in the exec and simple-protocol query exec modes ("conn closed",
// safe to retry), though the batch was written and may have committed; v5.13, the
// module's floor, reports it as not safe to retry, which Classify reads as
// ErrUnavailable. This stays as a guard: a driver's word that a written batch was not
// sent is never taken for a commit's outcome. Such an error becomes ErrUnavailable
// alone: an outcome to resolve. It applies to every batch that carries a COMMIT or is
// an implicit transaction (send); what only opens a transaction (claim, head) commits
// nothing, and the server rolls it back when the connection dies.
func lostAnswer(err error) error {
	if err == nil || !errors.Is(err, keytable.ErrNotSent) {
		return err
	}
	return fmt.Errorf("%w: the batch was written, its answer lost (%v)", keytable.ErrUnavailable, err)
}

// implicitCommitted reads the end of an implicit transaction whose statements all
// succeeded: the server commits it at the Sync, and says it did with ReadyForQuery
// outside any transaction block. An error there (the commit failed, or the connection
// died: the outcome is then unknown) comes back translated.
func (t *phaseTx) implicitCommitted(br pgx.BatchResults) error {
	if err := br.Close(); err != nil {
		return fmt.Errorf("commit: %w", keytable.Classify(err))
	}
	if st := t.conn.PgConn().TxStatus(); st != 'I' {
		// A statement of the phase opened a transaction block, which nothing commits.
		t.begun = true // done rolls it back
		return fmt.Errorf("commit: a statement of the phase left a transaction block open (status %q)", st)
	}
	return nil
}

// isCommitted reports whether a batch ending in COMMIT committed, given its tag.
func isCommitted(tag pgconn.CommandTag) bool { return tag.String() == "COMMIT" }

// needsBlock reports whether err is a statement's refusal to run outside a
// transaction block (25P01: LOCK, DECLARE without HOLD), which an implicit transaction
// is not: the server rolled the whole batch back, and it is sent again with BEGIN.
func needsBlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25P01"
}

// committed records that the key row's write up to target committed: the key stands
// there now and, for the commit that carried a new key's claim, the claim is durable,
// which is the key's OutcomeClaimed event.
func (x *Exec) committed(ctx context.Context, target string) {
	x.stored = target
	if x.claim != nil {
		x.claim = nil
		x.env.keyEvent(ctx, vocab.KeyEvent{Kind: vocab.OutcomeClaimed, Flow: x.flow.Name, Scope: x.fence.Scope, Key: x.fence.Key, RecoveryPoint: target})
	}
}

// claimLost reports whether err means that a new key's claim did not give this attempt
// the key: another attempt is claiming it, or its row exists.
func claimLost(err error) bool {
	return errors.Is(err, keytable.ErrClaimBusy) || errors.Is(err, keytable.ErrClaimExists)
}

// unknownCommit resolves a commit whose outcome is unknown by reading the key row.
func (x *Exec) unknownCommit(ctx context.Context, w keyWrite, err error) error {
	committed, rerr := x.resolve(ctx, w.target, w.resp != nil)
	if rerr != nil {
		// Neither outcome can be ruled out, so nothing may be released or redone here:
		// the lease runs out and the next attempt reads the truth.
		return &vocab.TransientError{Phase: w.target, RetryAfter: max(time.Until(x.leaseEnd), time.Second), Err: errors.Join(err, rerr)}
	}
	if committed {
		x.stored = w.target
		x.claim = nil
		return nil
	}
	return err
}

// resolve reads the key row to learn whether a commit with an unknown outcome took
// effect.
func (x *Exec) resolve(ctx context.Context, target string, finish bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	row, err := x.env.Store.Lookup(ctx, x.env.Pool, x.fence.Scope, x.fence.Key)
	if errors.Is(err, keytable.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("re-read key after unknown commit outcome: %w", err)
	}
	if row.ID != x.fence.ID || row.LockVersion != x.fence.LockVersion {
		return false, nil
	}
	x.fence.CreatedAt = row.CreatedAt // the claim's commit, if it was one, inserted it
	if finish {
		return row.Status == keytable.StatusFinished, nil
	}
	return row.RecoveryPoint == target, nil
}

// emptyData is the phase data of a key no phase has written to.
var emptyData = []byte("{}")
