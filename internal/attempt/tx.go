package attempt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/pgpipe"
	"github.com/idemflow/idemflow/phases"
)

// phaseTx is the transaction a tx phase runs in. BEGIN is not sent on its own: it rides
// in the same round trip as the phase's first statement, or, for a new key, as the
// claim; the engine's own write of the key row rides with COMMIT. For a key whose row
// exists, the check of the executor's fence rides with BEGIN too, ahead of the phase's
// first statement (head), and so may a new key's claim (fold). It implements
// phases.DBTX.
//
// The phase's code reaches the connection only through this value and the views it
// hands out (savepoints, rows, batch results), from whatever goroutine it gives them
// to. Each of their calls is admitted by enter and ends with leave; when the phase
// function returns, end seals them all, and from then on they refuse with
// phases.ErrTxDone and only the engine uses the connection (to commit or roll back),
// until done gives it back to the pool.
type phaseTx struct {
	pc    *pgxpool.Conn // nil once done
	conn  *pgx.Conn
	store *keytable.Store
	begin string // BEGIN with the phase's isolation level
	// oneSnapshot: every statement of the transaction reads the snapshot of its first
	// (REPEATABLE READ, SERIALIZABLE).
	oneSnapshot bool

	begun bool // BEGIN was sent: the transaction must end with COMMIT or ROLLBACK
	// held: the transaction holds the key: claim gave it the key, or its head came
	// back with the claim or with the lock on the key row. The commit's write of the
	// key row is then a plain insert or update (Exec.plan).
	held bool
	// insertedAtClaim: claim also inserted the key row; the commit updates it instead.
	insertedAtClaim bool
	// createdAt is the created_at of the key row this transaction inserts (or
	// inserted, or locked): read by the claim, the head's fence or the insert
	// (keytable.Fence).
	createdAt time.Time
	// headed: the transaction starts with opening, sent with BEGIN (head) ahead of the phase's
	// first statement: the check of the existing key row's fence (a Go-code phase: it
	// locks nothing), its locking fence (a pipelined phase whose statements' results
	// are read before the commit), or a new key's claim (fold, or such a pipelined
	// phase), so that an attempt that may not run the phase runs none of its
	// statements. onHeld, if set, runs once a claim came back held.
	headed      bool
	opening     keytable.Head
	openingRead keytable.Queued
	onHeld      func()

	savepoints int // savepoints opened with Begin, for their names
	// lost: the fence's check or the folded claim refused (or could not be read): the
	// phase fails with it, whatever its code made of the error its statement got.
	lost error

	mu sync.Mutex // guards the fields below, shared with the phase's goroutines
	// refused: the phase's code called Commit or Rollback, or sent a statement that
	// would end or open the transaction (checkSQL): the phase fails.
	refused error
	sealed  bool // the phase is over: every view refuses with phases.ErrTxDone
	uses    int  // calls of the phase's code on the connection in progress
	// stray: the phase ended while a call was in progress. That call's goroutine is
	// the last to use the connection: it closes it (leave); the pool never gets it back.
	stray bool
	// exposed: Conn handed out the connection itself, which nothing can take back, so
	// it is closed rather than given back to the pool.
	exposed bool
}

var (
	_ phases.DBTX = (*phaseTx)(nil)
	_ pgx.Tx      = (*phaseTx)(nil)
)

// newPhaseTx returns a transaction on pc, which it owns until done. An empty iso means
// READ COMMITTED, sent explicitly: the claim relies on each statement reading a fresh
// snapshot, whatever the server's default.
func newPhaseTx(pc *pgxpool.Conn, st *keytable.Store, iso pgx.TxIsoLevel) *phaseTx {
	if iso == "" {
		iso = pgx.ReadCommitted
	}
	return &phaseTx{
		pc: pc, conn: pc.Conn(), store: st,
		begin:       beginSQL(iso),
		oneSnapshot: iso != pgx.ReadCommitted && iso != pgx.ReadUncommitted,
	}
}

// beginSQL is the BEGIN of a transaction at iso, one string per level.
func beginSQL(iso pgx.TxIsoLevel) string {
	switch iso {
	case pgx.ReadCommitted:
		return "BEGIN ISOLATION LEVEL " + string(pgx.ReadCommitted)
	case pgx.RepeatableRead:
		return "BEGIN ISOLATION LEVEL " + string(pgx.RepeatableRead)
	case pgx.Serializable:
		return "BEGIN ISOLATION LEVEL " + string(pgx.Serializable)
	}
	return "BEGIN ISOLATION LEVEL " + string(iso)
}

// done ends the transaction if one may be open and gives the connection back to the
// pool. It is idempotent, and must run before the executor uses the pool again (to
// re-read the key, release it, or finish it in another transaction): with a small
// pool, an executor holding one connection while waiting for another waits for itself.
//
// A connection the phase's code may still reach never goes back to the pool: one that
// Conn handed out is closed, and one a call of the phase's code was still using when
// the phase ended is closed by that call when it returns (leave). Either way the pool
// opens a new one when it needs it.
func (t *phaseTx) done(ctx context.Context) {
	if t.pc == nil {
		return
	}
	pc := t.pc
	t.pc = nil
	t.mu.Lock()
	t.sealed = true
	stray, exposed := t.stray, t.exposed
	t.mu.Unlock()
	switch {
	case stray:
		pc.Hijack() // the stray call closes it
	case exposed:
		closeConn(ctx, pc.Hijack())
	default:
		t.rollback(ctx)
		pc.Release()
	}
}

// enter admits a call of the phase's code on the connection, or refuses it with
// phases.ErrTxDone once the phase is over. Every call it admits ends with leave. Calls
// may nest (a batch's callbacks run inside its Close), and pgx itself answers a call
// made while the connection is busy.
func (t *phaseTx) enter() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sealed {
		return phases.ErrTxDone
	}
	t.uses++
	return nil
}

// leave ends a call admitted by enter. The last call of a phase that ended while it
// ran closes the connection, which done took from the pool.
func (t *phaseTx) leave() {
	t.mu.Lock()
	t.uses--
	last := t.stray && t.uses == 0
	t.mu.Unlock()
	if last {
		closeConn(context.Background(), t.conn)
	}
}

// errTxInUse fails a phase that returned while its code was still using the
// transaction from another goroutine: what that call does cannot be part of the
// commit, nor be left out of it for sure.
var errTxInUse = errors.New("the phase returned while its transaction was still in use by another goroutine: nothing of the phase is committed")

// end seals the transaction when the phase function returns and turns the verdict
// into a failure if the phase's code was still using the transaction, if the fence's
// check refused (the failure is then the check's), or if the code called its Commit or
// Rollback: nothing it wrote may then commit.
func (t *phaseTx) end(v verdict) verdict {
	t.mu.Lock()
	t.sealed = true
	t.stray = t.uses > 0
	stray, lost, refused := t.stray, t.lost, t.refused
	t.mu.Unlock()
	if stray {
		return verdict{kind: fail, err: errTxInUse}
	}
	if lost != nil {
		return verdict{kind: fail, err: lost}
	}
	if refused != nil && (v.kind == goOn || v.kind == respond) {
		return verdict{kind: fail, err: refused}
	}
	return v
}

// closeConn closes a connection taken from the pool, within a bound even when ctx is
// done: the server rolls back what it had open.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// claimed is the outcome of a claim.
type claimed int

const (
	claimOwned  claimed = iota // this attempt owns the key
	claimBusy                  // another attempt is claiming it: its first transaction runs
	claimExists                // the key row exists (found is set if it was read)
)

// claim opens the transaction of a new key's first tx phase and claims the key, in one
// round trip, before any of the phase's code runs: BEGIN, the claim lock (a
// transaction-scoped advisory lock on the key, taken without waiting) and a look-up of
// the key row in a fresh snapshot, taken after the lock. The key row itself is
// inserted when the transaction commits. Under REPEATABLE READ and SERIALIZABLE all
// statements read one snapshot, taken before the lock, so a claim that committed in
// between would be missed: there the row is inserted right away, with the lock, and a
// committed row makes the insert fail on the primary key.
//
// An attempt that does not own the key leaves the transaction to done, which rolls
// it back; nothing of the flow has run.
func (t *phaseTx) claim(ctx context.Context, c *keytable.Claim) (claimed, *keytable.Row, error) {
	b := &pgx.Batch{}
	b.Queue(t.begin)
	t.begun = true
	var insert keytable.Queued
	var look keytable.ClaimLook
	if t.oneSnapshot {
		insert = t.store.QueueKeyWrite(b, keytable.KeyWrite{Claim: c, RecoveryPoint: phases.Started, Data: emptyData})
	} else {
		look = t.store.QueueClaimLook(b, *c)
	}
	br := pgpipe.Send(ctx, t.conn, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return 0, nil, fmt.Errorf("begin: %w", keytable.Classify(err))
	}
	if t.oneSnapshot {
		at, err := insert.Read(br)
		switch {
		case errors.Is(err, keytable.ErrClaimBusy):
			return claimBusy, nil, nil
		case errors.Is(err, keytable.ErrClaimExists):
			return claimExists, nil, nil
		case err != nil:
			return 0, nil, err
		}
		t.held, t.insertedAtClaim, t.createdAt = true, true, at
		return claimOwned, nil, br.Close()
	}
	locked, at, row, err := look.Read(br)
	t.createdAt = at
	switch {
	case errors.Is(err, keytable.ErrNotFound) && locked:
		t.held = true
		return claimOwned, nil, br.Close()
	case errors.Is(err, keytable.ErrNotFound):
		return claimBusy, nil, nil
	case err != nil:
		return 0, nil, err
	}
	return claimExists, row, nil
}

// fold makes c, a new key's claim, ride at the head of the transaction (head), in the
// round trip of the phase's first statement, instead of a round trip of its own before
// the phase function runs (claim). Only at READ COMMITTED: the claim's check that no
// row exists must read a snapshot taken after its lock. held runs once the claim came
// back, before the statement's result reaches the phase's code. A phase that sends no
// statement claims with its commit (the claim and the insert in one statement, as a
// transaction of the engine's own).
func (t *phaseTx) fold(c *keytable.Claim, held func()) {
	t.headed, t.opening, t.onHeld = true, keytable.Head{Claim: c}, held
}

// plainArgs reports whether a statement can share a pipeline: pgx sends statements
// without arguments (possibly several, separated by semicolons) with the simple
// protocol, and arguments may start with a query-mode option.
func plainArgs(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// flush sends BEGIN (and the fence's check or the folded claim, if any) on its own,
// before a statement that cannot share its round trip.
func (t *phaseTx) flush(ctx context.Context) error {
	if t.begun {
		return nil
	}
	if !t.headed {
		t.begun = true
		if _, err := t.conn.Exec(ctx, t.begin); err != nil {
			return fmt.Errorf("begin: %w", keytable.Classify(err))
		}
		return nil
	}
	b := &pgx.Batch{}
	t.head(b)
	br := pgpipe.Send(ctx, t.conn, b)
	if err := t.readHead(br); err != nil {
		br.Close()
		return err
	}
	return br.Close()
}

// startWith makes h the opening of the transaction (headed), sent with BEGIN.
func (t *phaseTx) startWith(h keytable.Head) {
	t.headed, t.opening = true, h
}

// head queues the start of the transaction at the head of b, in the round trip of the
// phase's first statement: BEGIN and the head, if any (headed). A fence's check
// locks nothing (the phase's Go code runs while the transaction is open, and a
// takeover must never wait for it) and raises when the fence is stale; a locking fence
// raises too when another transaction holds the row's lock; a claim raises when
// another transaction holds the key's claim lock or the key row exists. Either way the
// server runs nothing queued after it. It returns the number of statements it queued
// when they include a head (the guard of pgpipe.SendGuarded), else 0.
func (t *phaseTx) head(b *pgx.Batch) (guard int) {
	b.Queue(t.begin)
	t.begun = true
	if !t.headed {
		return 0
	}
	t.openingRead = t.store.QueueHead(b, t.opening)
	return len(b.QueuedQueries)
}

// recheck is how many statements of the head are sent again ahead of the phase's
// first statement when that statement waits for the head's round trip (a connection
// that has not prepared it: pgpipe.SendRechecked): the fence's check, which locks
// nothing, so that a takeover in that round trip (the key released by an operator or
// its lease ended, taken over and run on by another executor) stops the statement as
// it would have stopped it in one round trip. A claim or a locking fence holds what
// it found until the transaction ends: nothing to send again.
func (t *phaseTx) recheck() int {
	if t.headed && t.opening.Claim == nil && !t.opening.Lock {
		return 1
	}
	return 0
}

// rechecked is err, the phase's first statement's, or, when it is the error of the
// fence's check sent again ahead of it (pgpipe.RecheckError: the statement never
// ran), the phase's loss, as readHead makes it.
func (t *phaseTx) rechecked(err error) error {
	var re *pgpipe.RecheckError
	if !errors.As(err, &re) {
		return err
	}
	err = t.openingRead.Rechecked(re.Err)
	t.lose(err)
	return err
}

// lose records err as the reason the phase may commit nothing, unless one is already.
func (t *phaseTx) lose(err error) {
	t.mu.Lock()
	if t.lost == nil {
		t.lost = err
	}
	t.mu.Unlock()
}

// readHead reads the results of head. A head that refused, or whose answer is
// unknown, fails the phase (lost): nothing of it may commit. A claim or a locking
// fence that came back makes this transaction the key's holder (held); a claim also
// runs onHeld, once the statements behind it are on their way.
func (t *phaseTx) readHead(br pgx.BatchResults) error {
	if err := readBegin(br); err != nil {
		return err
	}
	if !t.headed {
		return nil
	}
	at, err := t.openingRead.Read(br)
	switch {
	case err != nil:
	case t.opening.Claim != nil:
		t.held = true
		pgpipe.Proceed(br) // the statements behind the claim go before the hook runs
		if t.onHeld != nil {
			t.onHeld()
		}
	case t.opening.Lock:
		t.held = true
		t.keepCreated(at)
	}
	if err != nil {
		t.lose(err)
	}
	return err
}

// readBegin reads the result of a BEGIN queued at the head of a batch.
func readBegin(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin: %w", keytable.Classify(err))
	}
	return nil
}

// Exec implements phases.DBTX. A text that would end or open the transaction is
// refused and fails the phase (checkSQL).
func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer t.leave()
	sql, args, err := t.checked(ctx, sql, args, false)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.begun || !plainArgs(args) {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.conn.Exec(ctx, sql, args...)
	}
	br, err := t.sendFirst(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	err = t.rechecked(err)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query implements phases.DBTX; its text is checked as Exec's.
func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r := &txRows{tx: t}
	err := t.query(ctx, r, sql, args)
	if r.rows == nil {
		return nil, err
	}
	return r, err
}

// query runs Query's statement, into r.
func (t *phaseTx) query(ctx context.Context, r *txRows, sql string, args []any) (err error) {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.leave()
	sql, args, err = t.checked(ctx, sql, args, true)
	if err != nil {
		return err
	}
	if t.begun || !plainArgs(args) {
		if err := t.flush(ctx); err != nil {
			return err
		}
		r.rows, err = t.conn.Query(ctx, sql, args...)
		return err
	}
	br, err := t.sendFirst(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	if err != nil {
		return err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return t.rechecked(err)
	}
	r.rows, r.br = rows, br
	return nil
}

// QueryRow implements phases.DBTX; its text is checked as Exec's.
func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r := &row{rows: txRows{tx: t}}
	r.err = t.query(ctx, &r.rows, sql, args)
	return r
}

// SendBatch implements phases.DBTX. Each queued text is checked as Exec's, before
// anything is sent. As the phase's first statements, the batch goes behind BEGIN (and
// the fence's check or the folded claim) in one pipeline, unless pgpipe cannot keep it
// behind them (pgpipe.Guardable: an exec mode or result formats among its arguments, a
// statement prepared by name): BEGIN then goes first in its own round trip.
func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.enter(); err != nil {
		return &errBatch{err: err}
	}
	defer t.leave()
	if err := t.checkBatch(ctx, b); err != nil {
		return &errBatch{err: err}
	}
	if !t.begun && pgpipe.Guardable(b) {
		br, err := t.sendFirst(ctx, b.QueuedQueries...)
		if err != nil {
			return &errBatch{err: err}
		}
		return &txBatch{tx: t, br: br}
	}
	if err := t.flush(ctx); err != nil {
		return &errBatch{err: err}
	}
	return &txBatch{tx: t, br: t.conn.SendBatch(ctx, b)}
}

// sendFirst sends qs, the phase's first statements, behind the start of the
// transaction (head) in one pipeline, and reads the head's results: the batch's
// results are then those of qs. The head's error, if any, ends the batch.
func (t *phaseTx) sendFirst(ctx context.Context, qs ...*pgx.QueuedQuery) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	guard := t.head(b)
	b.QueuedQueries = append(b.QueuedQueries, qs...)
	br := pgpipe.SendRechecked(ctx, t.conn, b, guard, t.recheck())
	if err := t.readHead(br); err != nil {
		br.Close()
		return nil, err
	}
	return br, nil
}

// CopyFrom implements phases.DBTX. BEGIN (with the fence's check) goes first in its
// own round trip.
func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.enter(); err != nil {
		return 0, err
	}
	defer t.leave()
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// rollback ends the transaction if one may be open. It runs even when ctx is done; a
// connection it cannot clean is discarded by the pool on release.
func (t *phaseTx) rollback(ctx context.Context) {
	if !t.begun || t.conn.IsClosed() {
		return
	}
	t.begun = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = t.conn.Exec(ctx, "ROLLBACK")
}

// txRows are the rows of a statement of a phase's transaction. Like the transaction
// they refuse once the phase is over: Next returns false, Err, Scan and Values return
// phases.ErrTxDone, and nothing touches the connection or the buffers it reads into.
type txRows struct {
	tx   *phaseTx
	rows pgx.Rows
	// br is set for a statement pipelined with BEGIN: closing the rows also reads the
	// rest of the batch.
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *txRows) Next() bool {
	if r.tx.enter() != nil {
		return false
	}
	defer r.tx.leave()
	return r.next()
}

func (r *txRows) next() bool {
	if r.rows.Next() {
		return true
	}
	r.close()
	return false
}

func (r *txRows) Close() {
	if r.tx.enter() != nil {
		return
	}
	defer r.tx.leave()
	r.close()
}

func (r *txRows) close() {
	if r.closed {
		return
	}
	r.closed = true
	r.rows.Close()
	if r.br != nil {
		r.closeErr = r.br.Close()
	}
}

func (r *txRows) Err() error {
	if err := r.tx.enter(); err != nil {
		return err
	}
	defer r.tx.leave()
	return r.err()
}

func (r *txRows) err() error {
	if err := r.rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

func (r *txRows) Scan(dest ...any) error {
	if err := r.tx.enter(); err != nil {
		return err
	}
	defer r.tx.leave()
	return r.rows.Scan(dest...)
}

func (r *txRows) Values() ([]any, error) {
	if err := r.tx.enter(); err != nil {
		return nil, err
	}
	defer r.tx.leave()
	return r.rows.Values()
}

// RawValues returns nil once the phase is over.
func (r *txRows) RawValues() [][]byte {
	if r.tx.enter() != nil {
		return nil
	}
	defer r.tx.leave()
	return r.rows.RawValues()
}

// CommandTag returns the zero tag once the phase is over.
func (r *txRows) CommandTag() pgconn.CommandTag {
	if r.tx.enter() != nil {
		return pgconn.CommandTag{}
	}
	defer r.tx.leave()
	return r.rows.CommandTag()
}

// FieldDescriptions returns nil once the phase is over.
func (r *txRows) FieldDescriptions() []pgconn.FieldDescription {
	if r.tx.enter() != nil {
		return nil
	}
	defer r.tx.leave()
	return r.rows.FieldDescriptions()
}

// TypeMap returns nil once the phase is over: the map is the connection's.
func (r *txRows) TypeMap() *pgtype.Map {
	if r.tx.enter() != nil {
		return nil
	}
	defer r.tx.leave()
	return r.rows.TypeMap()
}

// Conn is the transaction's Conn.
func (r *txRows) Conn() *pgx.Conn { return r.tx.Conn() }

// row is QueryRow's result over Query.
type row struct {
	rows txRows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	if err := r.rows.tx.enter(); err != nil {
		return err
	}
	defer r.rows.tx.leave()
	defer r.rows.close()
	if !r.rows.next() {
		if err := r.rows.err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.close()
	return r.rows.err()
}

// txBatch is the BatchResults of a batch sent in a phase's transaction. Like the
// transaction it refuses once the phase is over, with phases.ErrTxDone.
type txBatch struct {
	tx *phaseTx
	br pgx.BatchResults
}

func (b *txBatch) Exec() (pgconn.CommandTag, error) {
	if err := b.tx.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer b.tx.leave()
	tag, err := b.br.Exec()
	return tag, b.tx.rechecked(err)
}

func (b *txBatch) Query() (pgx.Rows, error) {
	r := &txRows{tx: b.tx}
	err := b.query(r)
	if r.rows == nil {
		return nil, err
	}
	return r, err
}

func (b *txBatch) query(r *txRows) (err error) {
	if err := b.tx.enter(); err != nil {
		return err
	}
	defer b.tx.leave()
	r.rows, err = b.br.Query()
	return b.tx.rechecked(err)
}

func (b *txBatch) QueryRow() pgx.Row {
	r := &row{rows: txRows{tx: b.tx}}
	if err := b.query(&r.rows); r.rows.rows == nil {
		r.err = err
	}
	return r
}

// Tx returns nil unless the batch was queued with pgx.Batch.BeginTx; then, as no
// batch can begin a transaction inside the phase's, the phase's own (whose Commit and
// Rollback are refused, see phases.ErrTxManaged).
func (b *txBatch) Tx() pgx.Tx {
	if b.br.Tx() == nil {
		return nil
	}
	return b.tx
}

func (b *txBatch) Close() error {
	if err := b.tx.enter(); err != nil {
		return err
	}
	defer b.tx.leave()
	return b.br.Close()
}

// errBatch is the BatchResults of a batch that could not be sent.
type errBatch struct{ err error }

func (b *errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b *errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b *errBatch) QueryRow() pgx.Row                { return &row{err: b.err} }
func (b *errBatch) Close() error                     { return b.err }
func (b *errBatch) Tx() pgx.Tx                       { return nil }
