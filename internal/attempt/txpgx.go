package attempt

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/phases"
)

// This file is the pgx.Tx side of a tx phase's transaction (see phases.DBTX), for code
// that takes a pgx.Tx, such as River's InsertTx: savepoints, the refused Commit and
// Rollback, Conn, Prepare and LargeObjects.

// Begin implements pgx.Tx: it opens a savepoint in the phase's transaction, as pgx's
// own Begin on a transaction does. The savepoint commits (RELEASE SAVEPOINT) or rolls
// back (ROLLBACK TO SAVEPOINT) on its own; the phase's transaction goes on either way.
// A savepoint opened before the phase's first statement rides in BEGIN's round trip
// (after the fence's check, see head).
func (t *phaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer t.leave()
	t.savepoints++
	sp := &savepoint{root: t, name: "idemflow_sp_" + strconv.Itoa(t.savepoints)}
	if t.begun {
		if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
			return nil, fmt.Errorf("savepoint: %w", err)
		}
		return sp, nil
	}
	b := &pgx.Batch{}
	t.head(b)
	b.Queue("SAVEPOINT " + sp.name)
	br := t.conn.SendBatch(ctx, b)
	defer br.Close()
	if err := t.readHead(br); err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	return sp, br.Close()
}

// Commit implements pgx.Tx by refusing: the engine commits the phase's transaction
// when the phase function returns. The phase then fails (see phases.ErrTxManaged).
func (t *phaseTx) Commit(context.Context) error { return t.refuse("commit") }

// Rollback implements pgx.Tx by refusing: the engine rolls the phase's transaction
// back when the phase fails. The phase then fails (see phases.ErrTxManaged), so the
// writes its code meant to undo are rolled back all the same.
func (t *phaseTx) Rollback(context.Context) error { return t.refuse("rollback") }

func (t *phaseTx) refuse(op string) error {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.leave()
	return t.refuseWith(fmt.Errorf("%s of the phase's transaction refused: %w", op, phases.ErrTxManaged))
}

// refuseWith makes err the phase's failure (end), unless an earlier refusal is, and
// returns it.
func (t *phaseTx) refuseWith(err error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refused == nil {
		t.refused = err
	}
	return err
}

// checkSQL refuses sql, a statement text the phase's code sends, if one of its
// statements would end or open the phase's transaction (topTxControl): a COMMIT would
// commit the phase's writes apart from the advance of its recovery point, and the
// engine's statements after it would run outside any transaction. Nothing is sent, and
// the phase fails as after a refused Commit, its writes rolled back. Savepoints'
// statements are allowed. A text with a backslash is also read as the server reads it
// with standard_conforming_strings off, which the phase's code may have set; both
// readings must find no transaction control.
func (t *phaseTx) checkSQL(sql string) error {
	at := goTxControl(sql)
	if at < 0 {
		return nil
	}
	return t.refuseWith(fmt.Errorf("statement %.80q refused before anything was sent: it would end or open the phase's transaction: %w", sql[at:], phases.ErrTxManaged))
}

// goTxControl is topTxControl with standard_conforming_strings either on or off: the
// first statement that is transaction control in either reading, or -1.
func goTxControl(sql string) int {
	at := topTxControl(sql, false)
	if at < 0 && strings.IndexByte(sql, '\\') >= 0 {
		at = topTxControl(sql, true)
	}
	return at
}

// checkBatch is checked for each statement queued on b. A statement queued with a
// pgx.QueryRewriter is rewritten in place, as pgx's SendBatch would.
func (t *phaseTx) checkBatch(ctx context.Context, b *pgx.Batch) error {
	for _, q := range b.QueuedQueries {
		if rw, n := leadingRewriter(q.Arguments); rw != nil {
			sql, args, err := rw.RewriteQuery(ctx, t.conn, q.SQL, q.Arguments[n:])
			if err != nil {
				return fmt.Errorf("rewrite query failed: %w", err)
			}
			q.SQL, q.Arguments = sql, args
		}
		if err := t.checkSQL(q.SQL); err != nil {
			return err
		}
	}
	return nil
}

// leadingRewriter is the last of the query rewriters args start with (the one pgx's
// SendBatch applies), and how many there are.
func leadingRewriter(args []any) (rw pgx.QueryRewriter, n int) {
	for ; n < len(args); n++ {
		a, ok := args[n].(pgx.QueryRewriter)
		if !ok {
			break
		}
		rw = a
	}
	return rw, n
}

// checked is checkSQL on the text the server gets: a pgx.QueryRewriter among the
// leading options of args (the last, as pgx takes it) rewrites sql and the arguments
// after the options first, here rather than in pgx, and the rewritten statement goes
// on with the other options. query: the options of Query (result formats too), else
// of Exec.
func (t *phaseTx) checked(ctx context.Context, sql string, args []any, query bool) (string, []any, error) {
	n, rw := 0, pgx.QueryRewriter(nil)
options:
	for ; n < len(args); n++ {
		switch a := args[n].(type) {
		case pgx.QueryExecMode:
		case pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			if !query {
				break options
			}
		case pgx.QueryRewriter:
			rw = a
		default:
			break options
		}
	}
	if rw != nil {
		rewritten, rest, err := rw.RewriteQuery(ctx, t.conn, sql, args[n:])
		if err != nil {
			return "", nil, fmt.Errorf("rewrite query failed: %w", err)
		}
		opts := make([]any, 0, n+len(rest))
		for _, a := range args[:n] {
			if _, ok := a.(pgx.QueryRewriter); !ok {
				opts = append(opts, a)
			}
		}
		sql, args = rewritten, append(opts, rest...)
	}
	return sql, args, t.checkSQL(sql)
}

// Conn implements pgx.Tx. It returns the connection the transaction runs on, or nil
// once the phase is over. Send statements through the transaction, not the
// connection: until the phase's first statement BEGIN may still be unsent, and a
// statement sent on the connection directly would then run outside the transaction.
//
// Conn hands out the connection itself, which no wrapper can take back: once it was
// called, the engine closes the connection when the phase ends rather than give it
// back to the pool, so that a kept *pgx.Conn fails ("conn closed") and never reaches
// other work. That costs the pool a new connection; code that only reads settings can
// use Config instead.
func (t *phaseTx) Conn() *pgx.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sealed {
		return nil
	}
	t.exposed = true
	return t.conn
}

// Config returns a pool configuration whose ConnConfig is a copy of the configuration
// of the transaction's connection; its other fields are zero. It is for code that
// reads connection settings from a transaction without taking its connection (River's
// pgx driver reads the query exec mode this way when it finds Config, and from Conn
// otherwise). It returns nil once the phase is over.
func (t *phaseTx) Config() *pgxpool.Config {
	if t.enter() != nil {
		return nil
	}
	defer t.leave()
	return &pgxpool.Config{ConnConfig: t.conn.Config()}
}

// Prepare implements pgx.Tx. BEGIN goes first in its own round trip.
func (t *phaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer t.leave()
	if err := t.checkSQL(sql); err != nil {
		return nil, err
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.conn.Prepare(ctx, name, sql)
}

// LargeObjects implements pgx.Tx: large objects in the phase's transaction. Every call
// goes through this transaction, so once the phase is over each fails with
// phases.ErrTxDone, like the transaction's other views.
func (t *phaseTx) LargeObjects() pgx.LargeObjects { return boundLargeObjects(t) }

// boundLargeObjects is pgx's LargeObjects on tx. pgx builds one only on a transaction
// it began and gives no constructor, so tx is set in its one (unexported) field by
// reflection: every method of pgx.LargeObjects and of the LargeObject it opens sends
// its statements through that field. Should a pgx version lay the type out otherwise,
// the zero value is returned (its methods panic, which fails the phase as a transient
// failure) and TestTxEndsWithPhase's large-object case fails, so an upgrade of pgx
// cannot change this unseen.
func boundLargeObjects(tx pgx.Tx) pgx.LargeObjects {
	var lo pgx.LargeObjects
	v := reflect.ValueOf(&lo).Elem()
	if v.NumField() != 1 {
		return pgx.LargeObjects{}
	}
	f := v.Field(0)
	if f.Type() != reflect.TypeFor[pgx.Tx]() {
		return pgx.LargeObjects{}
	}
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(&tx).Elem())
	return lo
}

// savepoint is a savepoint in a phase's transaction, opened by Begin. Like pgx's own
// nested transactions it is closed by Commit or Rollback, after which its methods
// return pgx.ErrTxClosed; once the phase is over they return phases.ErrTxDone.
type savepoint struct {
	root   *phaseTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepoint)(nil)

// enter admits a call on the savepoint, as phaseTx.enter does; every call it admits
// ends with s.root.leave.
func (s *savepoint) enter() error {
	if err := s.root.enter(); err != nil {
		return err
	}
	if s.closed {
		s.root.leave()
		return pgx.ErrTxClosed
	}
	return nil
}

// Begin opens a savepoint inside this one.
func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.root.leave()
	return s.root.Begin(ctx)
}

// Commit releases the savepoint: its work stays in the phase's transaction.
func (s *savepoint) Commit(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.root.leave()
	s.closed = true
	_, err := s.root.conn.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

// Rollback undoes the savepoint's work; the phase's transaction goes on, usable again
// even if a statement in the savepoint failed.
func (s *savepoint) Rollback(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.root.leave()
	s.closed = true
	_, err := s.root.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

func (s *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer s.root.leave()
	sql, args, err := s.root.checked(ctx, sql, args, false)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.root.conn.Exec(ctx, sql, args...)
}

func (s *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.root.leave()
	sql, args, err := s.root.checked(ctx, sql, args, true)
	if err != nil {
		return nil, err
	}
	rows, err := s.root.conn.Query(ctx, sql, args...)
	if rows == nil {
		return nil, err
	}
	return &txRows{tx: s.root, rows: rows}, err
}

func (s *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := s.Query(ctx, sql, args...)
	if rows == nil {
		return &row{err: err}
	}
	return &row{rows: *rows.(*txRows)}
}

func (s *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := s.enter(); err != nil {
		return &errBatch{err: err}
	}
	defer s.root.leave()
	if err := s.root.checkBatch(ctx, b); err != nil {
		return &errBatch{err: err}
	}
	return &txBatch{tx: s.root, br: s.root.conn.SendBatch(ctx, b)}
}

func (s *savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.root.leave()
	return s.root.conn.CopyFrom(ctx, table, columns, src)
}

func (s *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.root.leave()
	if err := s.root.checkSQL(sql); err != nil {
		return nil, err
	}
	return s.root.conn.Prepare(ctx, name, sql)
}

// LargeObjects implements pgx.Tx: large objects in the savepoint (see
// phaseTx.LargeObjects).
func (s *savepoint) LargeObjects() pgx.LargeObjects { return boundLargeObjects(s) }

// Conn is the phase transaction's connection; see phaseTx.Conn.
func (s *savepoint) Conn() *pgx.Conn { return s.root.Conn() }

// Config is the phase transaction's; see phaseTx.Config.
func (s *savepoint) Config() *pgxpool.Config { return s.root.Config() }
