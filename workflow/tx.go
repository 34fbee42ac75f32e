package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
)

// claimedError reports that a claim found the key already there: another attempt got
// it first. The phase's transaction is rolled back and the row is answered as found.
type claimedError struct{ row *store.Row }

func (e *claimedError) Error() string { return "key already claimed" }

// phaseTx is the transaction a tx phase runs in. BEGIN is not sent on its own: it rides
// in the same round trip as the phase's first statement (and, for a new key, the
// claim), and the engine's fenced update rides with COMMIT. It implements phases.DBTX.
type phaseTx struct {
	pc    *pgxpool.Conn // nil once released
	conn  *pgx.Conn
	store *store.Store
	begin string       // BEGIN with the phase's isolation level
	claim *store.Claim // sent with BEGIN when the key row does not exist yet

	begun bool  // BEGIN was sent: the transaction must end with COMMIT or ROLLBACK
	err   error // sticky: the claim did not give this attempt the key
}

var _ phases.DBTX = (*phaseTx)(nil)

// newPhaseTx returns a transaction on pc, which it owns until done.
func newPhaseTx(pc *pgxpool.Conn, st *store.Store, iso pgx.TxIsoLevel, claim *store.Claim) *phaseTx {
	begin := "BEGIN"
	if iso != "" {
		begin = "BEGIN ISOLATION LEVEL " + string(iso)
	}
	return &phaseTx{pc: pc, conn: pc.Conn(), store: st, begin: begin, claim: claim}
}

// done ends the transaction if one may be open and gives the connection back to the
// pool. It is idempotent, and must run before the executor uses the pool again (to
// re-read the key, release it, or finish it in another transaction): with a small
// pool, an executor holding one connection while waiting for another waits for itself.
func (t *phaseTx) done(ctx context.Context) {
	if t.pc == nil {
		return
	}
	t.rollback(ctx)
	t.pc.Release()
	t.pc = nil
}

// opening queues BEGIN and the claim, if any, at the head of b.
func (t *phaseTx) opening(b *pgx.Batch) {
	b.Queue(t.begin)
	if t.claim != nil {
		t.store.QueueClaim(b, *t.claim)
	}
	t.begun = true
}

// readOpening reads the results of what opening queued.
func (t *phaseTx) readOpening(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		t.err = fmt.Errorf("begin: %w", store.Classify(err))
		return t.err
	}
	if t.claim == nil {
		return nil
	}
	row, err := t.store.ReadClaim(br)
	switch {
	case errors.Is(err, store.ErrClaimRaced):
		t.err = errRaced
	case err != nil:
		t.err = err
	case !row.Inserted:
		t.err = &claimedError{row: row}
	}
	return t.err
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

// flush sends the opening on its own, before a statement that cannot share it.
func (t *phaseTx) flush(ctx context.Context) error {
	if t.err != nil {
		return t.err
	}
	if t.begun {
		return nil
	}
	b := &pgx.Batch{}
	t.opening(b)
	br := t.conn.SendBatch(ctx, b)
	err := t.readOpening(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = store.Classify(cerr)
	}
	return err
}

// Exec implements phases.DBTX.
func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.err != nil {
		return pgconn.CommandTag{}, t.err
	}
	if t.begun || !plainArgs(args) {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.conn.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	t.opening(b)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if err := t.readOpening(br); err != nil {
		br.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query implements phases.DBTX.
func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.err != nil {
		return nil, t.err
	}
	if t.begun || !plainArgs(args) {
		if err := t.flush(ctx); err != nil {
			return nil, err
		}
		return t.conn.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	t.opening(b)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if err := t.readOpening(br); err != nil {
		br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow implements phases.DBTX.
func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

// SendBatch implements phases.DBTX. The opening goes first in its own round trip.
func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return &errBatch{err: err}
	}
	return t.conn.SendBatch(ctx, b)
}

// CopyFrom implements phases.DBTX. The opening goes first in its own round trip.
func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// commit sends, in one round trip, whatever of the opening is still unsent, the fenced
// statement queued by fenced (none when fenced is nil: a claim committed on its own),
// and COMMIT. If the fenced statement does not match, it
// raises, the transaction aborts and the COMMIT is skipped. The error is a claim
// outcome (claimedError, errRaced) or a store error.
func (t *phaseTx) commit(ctx context.Context, fenced func(*pgx.Batch)) error {
	if t.err != nil {
		return t.err
	}
	b := &pgx.Batch{}
	opened := !t.begun
	if opened {
		t.opening(b)
	}
	if fenced != nil {
		fenced(b)
	}
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	defer br.Close()
	if opened {
		if err := t.readOpening(br); err != nil {
			return err
		}
	}
	if fenced != nil {
		if err := t.store.ReadFenced(br); err != nil {
			return err
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("commit: %w", store.Classify(err))
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("commit: %w", store.Classify(err))
	}
	if !store.IsCommitted(tag) {
		return fmt.Errorf("commit: server answered %q: %w", tag.String(), store.ErrConflict)
	}
	t.begun = false
	return nil
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

// batchRows are the rows of a statement pipelined with BEGIN: closing them also reads
// the rest of the batch.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.closeErr = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// row is QueryRow's result over Query.
type row struct {
	rows pgx.Rows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errBatch is the BatchResults of a batch that could not be sent.
type errBatch struct{ err error }

func (b *errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b *errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b *errBatch) QueryRow() pgx.Row                { return &row{err: b.err} }
func (b *errBatch) Close() error                     { return b.err }
func (b *errBatch) Tx() pgx.Tx                       { return nil }
