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

// phaseTx is the transaction a tx phase runs in. BEGIN is not sent on its own: it rides
// in the same round trip as the phase's first statement, or, for a new key, as the
// claim; the engine's own write of the key row rides with COMMIT. It implements
// phases.DBTX.
type phaseTx struct {
	pc    *pgxpool.Conn // nil once released
	conn  *pgx.Conn
	store *store.Store
	begin string // BEGIN with the phase's isolation level
	// oneSnapshot: every statement of the transaction reads the snapshot of its first
	// (REPEATABLE READ, SERIALIZABLE).
	oneSnapshot bool

	begun bool // BEGIN was sent: the transaction must end with COMMIT or ROLLBACK
	// held: claim gave this transaction the key; the commit inserts the key row.
	held bool
	// insertedAtClaim: claim also inserted the key row; the commit updates it instead.
	insertedAtClaim bool

	savepoints int   // savepoints opened with Begin, for their names
	refused    error // the phase's code called Commit or Rollback: the phase fails
}

var (
	_ phases.DBTX = (*phaseTx)(nil)
	_ pgx.Tx      = (*phaseTx)(nil)
)

// newPhaseTx returns a transaction on pc, which it owns until done. An empty iso means
// READ COMMITTED, sent explicitly: the claim relies on each statement reading a fresh
// snapshot, whatever the server's default.
func newPhaseTx(pc *pgxpool.Conn, st *store.Store, iso pgx.TxIsoLevel) *phaseTx {
	if iso == "" {
		iso = pgx.ReadCommitted
	}
	return &phaseTx{
		pc: pc, conn: pc.Conn(), store: st,
		begin:       "BEGIN ISOLATION LEVEL " + string(iso),
		oneSnapshot: iso != pgx.ReadCommitted && iso != pgx.ReadUncommitted,
	}
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
func (t *phaseTx) claim(ctx context.Context, c *store.Claim) (claimed, *store.Row, error) {
	b := &pgx.Batch{}
	b.Queue(t.begin)
	t.begun = true
	if t.oneSnapshot {
		t.store.QueueClaimInsert(b, *c, phases.Started, emptyData)
	} else {
		t.store.QueueClaimLock(b, *c)
		t.store.QueueLookup(b, c.Scope, c.Key)
	}
	br := t.conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return 0, nil, fmt.Errorf("begin: %w", store.Classify(err))
	}
	if t.oneSnapshot {
		switch err := t.store.ReadClaimInsert(br); {
		case errors.Is(err, store.ErrClaimBusy):
			return claimBusy, nil, nil
		case errors.Is(err, store.ErrClaimExists):
			return claimExists, nil, nil
		case err != nil:
			return 0, nil, err
		}
		t.held, t.insertedAtClaim = true, true
		return claimOwned, nil, br.Close()
	}
	locked, err := t.store.ReadClaimLock(br)
	if err != nil {
		return 0, nil, err
	}
	row, err := t.store.ReadLookup(br)
	switch {
	case errors.Is(err, store.ErrNotFound) && locked:
		t.held = true
		return claimOwned, nil, br.Close()
	case errors.Is(err, store.ErrNotFound):
		return claimBusy, nil, nil
	case err != nil:
		return 0, nil, err
	}
	return claimExists, row, nil
}

// emptyData is the phase data of a key no phase has written to.
var emptyData = []byte("{}")

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

// flush sends BEGIN on its own, before a statement that cannot share its round trip.
func (t *phaseTx) flush(ctx context.Context) error {
	if t.begun {
		return nil
	}
	t.begun = true
	if _, err := t.conn.Exec(ctx, t.begin); err != nil {
		return fmt.Errorf("begin: %w", store.Classify(err))
	}
	return nil
}

// readBegin reads the result of a BEGIN queued at the head of a batch.
func readBegin(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin: %w", store.Classify(err))
	}
	return nil
}

// Exec implements phases.DBTX.
func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.begun || !plainArgs(args) {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.conn.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(t.begin)
	t.begun = true
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if err := readBegin(br); err != nil {
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
	if t.begun || !plainArgs(args) {
		if err := t.flush(ctx); err != nil {
			return nil, err
		}
		return t.conn.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(t.begin)
	t.begun = true
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if err := readBegin(br); err != nil {
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

// SendBatch implements phases.DBTX. BEGIN goes first in its own round trip.
func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return &errBatch{err: err}
	}
	return t.conn.SendBatch(ctx, b)
}

// CopyFrom implements phases.DBTX. BEGIN goes first in its own round trip.
func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// commit sends, in one round trip, BEGIN if it is still unsent, the engine's write of
// the key row (queued by write, read by read) and COMMIT. If the write does not apply
// (a fence that misses, a row that exists), it aborts the transaction and the COMMIT
// is skipped.
func (t *phaseTx) commit(ctx context.Context, write func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	b := &pgx.Batch{}
	opened := !t.begun
	if opened {
		b.Queue(t.begin)
		t.begun = true
	}
	write(b)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	defer br.Close()
	if opened {
		if err := readBegin(br); err != nil {
			return err
		}
	}
	// A claim that found the key busy wrote nothing and aborted nothing: its COMMIT
	// ends an empty transaction.
	rerr := read(br)
	if rerr != nil && !errors.Is(rerr, store.ErrClaimBusy) {
		return rerr
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
	return rerr
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
