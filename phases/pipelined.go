package phases

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/internal/pipestate"
)

// PipelineFunc builds a pipelined tx phase: it declares the phase's statements on p,
// from what run holds (the key row's identity, scope and key, earlier phases' data, the
// request body), and returns the phase's answer as a tx phase function does: nil to go
// on to the next phase, a response to finish the key with, or an error (phases.Fail
// for a deterministic failure, which stores its response alone; any other error is
// transient). It gets no context and no database: nothing has been sent when it runs,
// and it may run again (after a serialization failure, or on a retry of the key).
//
// Phase data set on run while building commits with the phase, as in a tx phase. When
// the data or the answer depends on the statements' results, register a function with
// Pipeline.Then instead of returning them.
type PipelineFunc func(run *Run, p *Pipeline) (*Response, error)

// Pipelined returns a tx phase whose statements are declared up front by build, so the
// engine can send them with its own in one round trip, as one implicit transaction
// (no BEGIN, no COMMIT; any error rolls all of it back): the claim of a new key or the
// fence of an existing one, the phase's statements and the write of the key row. A
// phase that registers a result callback (Queue(...).QueryRow, .Exec or
// .Query) or a Then function costs two round trips instead: the statements' results
// reach the callbacks and Then before the engine decides what to commit, with the
// transaction open in between (BEGIN first, COMMIT last). Pipelined and Go-code tx
// phases (Tx) mix in one flow.
//
// A pipelined phase runs at READ COMMITTED (Phase.IsoLevel must be left empty),
// whatever the session's default: see docs/PHASES.md.
func Pipelined(name string, build PipelineFunc) Phase {
	return Phase{Name: name, Kind: KindTx, Pipeline: build}
}

// Pipeline is what a pipelined phase declares: its statements, in order, with their
// result callbacks, and the function that decides the phase's answer from them. The
// engine makes one for each run of the builder and reads it (its side is not on
// Pipeline's API); it is used by one goroutine.
type Pipeline pipestate.Pipeline[*Run, *Response]

// Queue adds a statement with its arguments. Its result can be read by a callback set
// on the returned query, as with a pgx.Batch: QueryRow(func(pgx.Row) error),
// Exec(func(pgconn.CommandTag) error) or Query(func(pgx.Rows) error). Callbacks run in
// the order of their statements, inside the phase's transaction, before it commits;
// an error from one fails the phase as an error of a tx phase function would (nothing
// of the phase commits). Without a callback, a statement's failure still fails the
// phase. Arguments are encoded when the statements are sent; pgx query options
// (pgx.QueryExecMode and the like) are not accepted.
//
// sql must be exactly one statement (one trailing semicolon allowed) that neither
// opens nor ends the transaction: the engine refuses any other text before anything
// of the phase is sent, with an error that matches workflow.ErrRefused (see
// docs/PHASES.md).
func (p *Pipeline) Queue(sql string, args ...any) *pgx.QueuedQuery {
	return p.state().Queue(sql, args)
}

// Then registers fn to decide the phase's answer once every statement's result has
// been read (and their callbacks have run), with the transaction still open: its
// return means what a PipelineFunc's does, and phase data it sets on run commits with
// the phase. The PipelineFunc must then return neither a response nor an error.
func (p *Pipeline) Then(fn func(run *Run) (*Response, error)) { p.state().SetThen(fn) }

// Len is the number of statements queued.
func (p *Pipeline) Len() int { return len(p.state().Statements()) }

// state is p as the engine reads it.
func (p *Pipeline) state() *pipestate.Pipeline[*Run, *Response] {
	return (*pipestate.Pipeline[*Run, *Response])(p)
}

// RowsAffected returns an Exec callback that fails the phase unless its statement
// affected exactly n rows: p.Queue(sql, args...).Exec(phases.RowsAffected(1)). The
// failure is transient, like any error of a tx phase; write a callback of your own to
// answer it with phases.Fail.
func RowsAffected(n int64) func(pgconn.CommandTag) error {
	return func(tag pgconn.CommandTag) error {
		if got := tag.RowsAffected(); got != n {
			return fmt.Errorf("%w: %q affected %d rows, want %d", ErrRowsAffected, tag.String(), got, n)
		}
		return nil
	}
}

// ErrRowsAffected is what a RowsAffected callback fails with.
var ErrRowsAffected = errors.New("statement affected an unexpected number of rows")
