package pgpipe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errClosed and errNoMore are pgx's messages for the same misuse.
var (
	errClosed = errors.New("batch already closed")
	errNoMore = errors.New("no more results in batch")
)

// batchResults reads a pipeline's results in the batch's order, as pgx's do: the
// first error stops the batch (the server skipped the rest), and Close runs the
// callbacks of the statements not read yet.
type batchResults struct {
	ctx  context.Context
	conn *pgx.Conn
	r    *registry
	b    *pgx.Batch
	sds  []*pgconn.StatementDescription
	// sdsBuf and formatsBuf hold sds and the statements' result formats of a batch
	// of the usual size, in br's own allocation.
	sdsBuf     [12]*pgconn.StatementDescription
	formatsBuf [32]int16
	formats    []int16 // the statements' result formats, in named mode
	pipe       *pgconn.Pipeline
	// rest, when set, is the part of a guarded batch not sent yet (sendGuarded);
	// restErr is sendRest's failure when Proceed sent it: the next statement's.
	rest    *rest
	restErr error
	// rechecks is how many results of guard statements sent again with the rest
	// (SendRechecked), before the rest's first statement's, are not read yet.
	rechecks int
	rows     *rows // the last Query's
	err      error
	idx      int
	closed   bool
	traced   bool // TraceBatchEnd was called
}

var _ pgx.BatchResults = (*batchResults)(nil)

// rest is the part of a guarded batch that waits for the guard's results: the
// statements from from on, preceded by the guard's last recheck statements sent again,
// and the answers to the closing of closing and the preparing of fresh, which the
// server sent after the guard's results.
type rest struct {
	from    int
	recheck int
	fresh   []*pgconn.StatementDescription
	closing []string
}

// early is br for a batch that failed before its results could be read. A pipeline
// with requests not synced yet is closed with its connection, as in pgx: the server
// rolls back what it ran.
func (br *batchResults) early(err error) *batchResults {
	br.err, br.closed = err, true
	if br.pipe != nil {
		br.pipe.Close()
	}
	br.traceEnd()
	return br
}

// sendRest reads the answers to what sendGuarded prepared, once the guard's
// statements came back without error, and sends the rest of the batch with Sync. A
// failed prepare is that of the rest's first statement: the server skips the rest
// until the Sync sent then.
func (br *batchResults) sendRest() error {
	rs := br.rest
	br.rest = nil
	if err := br.r.prepared(br.pipe, rs.fresh, rs.closing); err != nil {
		if serr := br.syncOpen(); serr != nil {
			return serr
		}
		return err
	}
	// The rechecked statements were prepared with the rest (fresh holds every
	// statement of the batch the registry lacked), so they go by name.
	if err := br.queue(rs.from-rs.recheck, len(br.b.QueuedQueries), 0); err != nil {
		// The guard's statements ran and their transaction is open: a Sync would commit
		// them alone. Closing the connection rolls them back, as in pgx.
		br.pipe.Close()
		return err
	}
	br.rechecks = rs.recheck
	return br.pipe.Sync()
}

// readRechecks reads the results of the guard statements sent again ahead of the
// rest, whose first statement is the next; the first that raised is returned as a
// *RecheckError.
func (br *batchResults) readRechecks() error {
	for br.rechecks > 0 {
		i := br.idx - br.rechecks
		br.rechecks--
		got, err := br.pipe.GetResults()
		if err == nil {
			res, ok := got.(*pgconn.ResultReader)
			if !ok {
				return fmt.Errorf("unexpected pipeline result: %T", got)
			}
			_, err = res.Close()
		}
		if err != nil {
			br.r.failed(br.sds[i], err)
			br.rechecks = 0
			return &RecheckError{Index: i, Err: err}
		}
	}
	return nil
}

// endRest ends a guarded batch whose rest was never sent because an error stopped
// it: the server skips until a Sync after its own error, which ends the transaction;
// after any other error (a callback's) the guard's statements may have run, and a Sync
// would commit them alone, so the connection is closed instead.
func (br *batchResults) endRest() {
	br.rest = nil
	var pgErr *pgconn.PgError
	if errors.As(br.err, &pgErr) {
		br.syncOpen()
		return
	}
	br.pipe.Close()
}

// syncOpen sends the pipeline's Sync unless the connection is closed. pgconn closes a
// connection whose read failed in a goroutine of its own that writes Terminate on it
// (asyncClose) while the pipeline stays open: a Sync after that writes beside that
// goroutine, a data race in pgx's frontend (`-race` found it in TestNetworkFaults, a
// reset while the rest's prepares were read), and reaches no server anyway.
func (br *batchResults) syncOpen() error {
	if br.conn.PgConn().IsClosed() {
		return nil
	}
	return br.pipe.Sync()
}

// Proceed sends the rest of a batch sent with SendGuarded now, once the caller has
// read every result of the guard and decided that the rest may run, rather than when
// the next result is asked for. A caller that runs other code in between (the
// engine's ClaimHeld hook) calls it first: until the rest and its Sync arrive, the
// server keeps the guard's transaction open in the state 'active', which
// idle_in_transaction_session_timeout does not end, so a process paused there (SIGSTOP,
// a frozen VM) would hold the guard's locks past that timeout. For any other batch, or
// before the guard's results were all read, or after an error, it does nothing. A
// failure to send is the next statement's result.
func Proceed(b pgx.BatchResults) {
	br, ok := b.(*batchResults)
	if !ok || br.rest == nil || br.idx != br.rest.from || br.err != nil || br.closed ||
		(br.rows != nil && !br.rows.closed) {
		return
	}
	br.restErr = br.sendRest()
}

// next is the result of the next statement, once the last Query's rows are closed.
func (br *batchResults) next() (q *pgx.QueuedQuery, sd *pgconn.StatementDescription, res *pgconn.ResultReader, start time.Time, err error) {
	if err := br.ready(); err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	if br.rest != nil && br.idx == br.rest.from {
		br.restErr = br.sendRest()
	}
	if br.restErr == nil {
		br.restErr = br.readRechecks()
	}
	if err := br.restErr; err != nil {
		br.restErr, br.err = nil, err
		q, sd = br.b.QueuedQueries[br.idx], br.sds[br.idx]
		br.idx++
		return q, sd, nil, time.Now(), err
	}
	q, sd = br.b.QueuedQueries[br.idx], br.sds[br.idx]
	br.idx++
	start = time.Now()
	got, err := br.pipe.GetResults()
	if err == nil {
		var ok bool
		if res, ok = got.(*pgconn.ResultReader); !ok {
			err = fmt.Errorf("unexpected pipeline result: %T", got)
		}
	}
	if err != nil {
		br.err = err
		br.r.failed(sd, err)
	}
	return q, sd, res, start, err
}

// ready reports why no further result can be read, if so.
func (br *batchResults) ready() error {
	if br.err != nil {
		return br.err
	}
	if br.closed {
		return errClosed
	}
	if br.rows != nil {
		br.rows.Close()
		if err := br.rows.Err(); err != nil {
			br.err = err
			return err
		}
	}
	if br.idx >= len(br.b.QueuedQueries) {
		return errNoMore
	}
	return nil
}

// Exec reads the next statement's result as pgx.Conn.Exec would.
func (br *batchResults) Exec() (pgconn.CommandTag, error) {
	q, sd, res, start, err := br.next()
	if q == nil {
		return pgconn.CommandTag{}, err
	}
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = res.Close()
		if err != nil {
			br.err = err
			br.r.failed(sd, err)
		}
	}
	br.traceQuery(q, tag, err, start)
	return tag, err
}

// Query reads the next statement's result as pgx.Conn.Query would.
func (br *batchResults) Query() (pgx.Rows, error) {
	q, sd, res, start, err := br.next()
	rs := &rows{br: br, q: q, sd: sd, start: start, err: err}
	if q == nil || err != nil {
		rs.closed = true
		if q != nil {
			br.traceQuery(q, pgconn.CommandTag{}, err, start)
		}
		return rs, err
	}
	rs.Rows = pgx.RowsFromResultReader(br.conn.TypeMap(), res)
	br.rows = rs
	return rs, nil
}

// QueryRow reads the next statement's result as pgx.Conn.QueryRow would.
func (br *batchResults) QueryRow() pgx.Row {
	rs, _ := br.Query()
	return row{rs.(*rows)}
}

// Close reads what is left, running the callbacks of the statements not read yet
// until one fails, and ends the pipeline. It returns the batch's first error.
func (br *batchResults) Close() error {
	defer br.traceEnd()
	if br.err == nil && br.rows != nil {
		br.rows.Close()
		br.err = br.rows.Err()
	}
	if br.closed {
		return br.err
	}
	for br.err == nil && br.idx < len(br.b.QueuedQueries) {
		if fn := br.b.QueuedQueries[br.idx].Fn; fn != nil {
			if err := fn(br); err != nil && br.err == nil {
				br.err = err
			}
		} else {
			br.Exec()
		}
	}
	br.closed = true
	if br.rest != nil {
		br.endRest()
	}
	if err := br.pipe.Close(); br.err == nil {
		br.err = err
	}
	return br.err
}

// Tx returns nil: a batch begun with Batch.BeginTx goes to pgx (see fits).
func (br *batchResults) Tx() pgx.Tx { return nil }

func (br *batchResults) traceQuery(q *pgx.QueuedQuery, tag pgconn.CommandTag, err error, start time.Time) {
	if br.r.tracer != nil {
		br.r.tracer.TraceBatchQuery(br.ctx, br.conn, pgx.TraceBatchQueryData{
			SQL: q.SQL, Args: q.Arguments, CommandTag: tag, Err: err, ReadStartTime: start,
		})
	}
}

func (br *batchResults) traceEnd() {
	if br.r.tracer != nil && !br.traced {
		br.traced = true
		br.r.tracer.TraceBatchEnd(br.ctx, br.conn, pgx.TraceBatchEndData{Err: br.err})
	}
}

// rows is one statement's rows: pgx's, read from the pipeline, traced and checked by
// the registry when closed.
type rows struct {
	pgx.Rows // nil when the statement failed before its rows
	br       *batchResults
	q        *pgx.QueuedQuery
	sd       *pgconn.StatementDescription
	start    time.Time
	err      error
	closed   bool
}

// Close implements pgx.Rows.
func (rs *rows) Close() {
	if rs.closed {
		return
	}
	rs.closed = true
	rs.Rows.Close()
	rs.err = rs.Rows.Err()
	if rs.err != nil {
		rs.br.r.failed(rs.sd, rs.err)
	}
	rs.br.traceQuery(rs.q, rs.Rows.CommandTag(), rs.err, rs.start)
}

// Err implements pgx.Rows.
func (rs *rows) Err() error {
	if rs.Rows == nil || rs.closed {
		return rs.err
	}
	return rs.Rows.Err()
}

// Next implements pgx.Rows; rows that are read to the end are closed, as pgx's.
func (rs *rows) Next() bool {
	if rs.Rows == nil || rs.closed {
		return false
	}
	if rs.Rows.Next() {
		return true
	}
	rs.Close()
	return false
}

// CommandTag implements pgx.Rows.
func (rs *rows) CommandTag() pgconn.CommandTag {
	if rs.Rows == nil {
		return pgconn.CommandTag{}
	}
	return rs.Rows.CommandTag()
}

// FieldDescriptions implements pgx.Rows.
func (rs *rows) FieldDescriptions() []pgconn.FieldDescription {
	if rs.Rows == nil {
		return nil
	}
	return rs.Rows.FieldDescriptions()
}

// Scan implements pgx.Rows.
func (rs *rows) Scan(dest ...any) error {
	if rs.Rows == nil {
		return rs.err
	}
	return rs.Rows.Scan(dest...)
}

// Values implements pgx.Rows.
func (rs *rows) Values() ([]any, error) {
	if rs.Rows == nil {
		return nil, rs.err
	}
	return rs.Rows.Values()
}

// RawValues implements pgx.Rows.
func (rs *rows) RawValues() [][]byte {
	if rs.Rows == nil {
		return nil
	}
	return rs.Rows.RawValues()
}

// Conn implements pgx.Rows.
func (rs *rows) Conn() *pgx.Conn { return rs.br.conn }

// row is QueryRow's result, read as pgx's.
type row struct{ rs *rows }

// Scan implements pgx.Row.
func (r row) Scan(dest ...any) error {
	rs := r.rs
	if err := rs.Err(); err != nil {
		return err
	}
	if !rs.Next() {
		if err := rs.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rs.Scan(dest...); err != nil {
		rs.Close()
		return err
	}
	rs.Close()
	return rs.Err()
}
