package phases

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrTxManaged is what Commit and Rollback of a tx phase's own transaction return,
// seen as a pgx.Tx (see DBTX), and what a statement sent through it returns when the
// text ends or begins the transaction (COMMIT, END, ROLLBACK without TO, ABORT, BEGIN,
// START TRANSACTION, PREPARE TRANSACTION, behind comments or after other statements):
// the engine owns that transaction, and such a statement is refused before it is sent. It commits when the
// phase function returns success, together with the key's recovery point, and rolls
// back when the phase fails. A refused Commit, Rollback or statement changes nothing in the
// database, but the phase fails with this error whatever it returns, so that work its
// code meant to undo (or believed durable) is never committed by surprise. Savepoints
// opened with Begin commit and roll back as usual.
var ErrTxManaged = errors.New("the engine owns the phase's transaction: return from the phase to commit it, fail the phase to roll it back, or Begin a savepoint")

// ErrTxDone is what a tx phase's transaction answers once the phase is over: once its
// function returned (for an idemhttp TxMiddleware, once the handler returned), every
// method of every view of it fails with ErrTxDone and sends nothing: the DBTX, its
// pgx.Tx view, savepoints opened with Begin, rows and batch results still held, and
// the pgx.Row of QueryRow. Conn and Rows.Conn return nil. Code that keeps the
// transaction past the phase (a goroutine, a closure, a client holding the pgx.Tx)
// gets this error instead of running its statement on a connection that has since
// gone back to the pool and on to other work.
//
// errors.Is(ErrTxDone, pgx.ErrTxClosed) is true, so code written for pgx sees a
// closed transaction.
var ErrTxDone error = txDoneError{}

type txDoneError struct{}

func (txDoneError) Error() string {
	return "the phase's transaction is over: its phase returned, and nothing more can be sent on it"
}

// Is makes errors.Is(ErrTxDone, pgx.ErrTxClosed) true.
func (txDoneError) Is(target error) bool { return target == pgx.ErrTxClosed }
