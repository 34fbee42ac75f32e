package phases

import "errors"

// ErrTxManaged is what Commit and Rollback of a tx phase's own transaction return,
// seen as a pgx.Tx (see DBTX): the engine owns that transaction. It commits when the
// phase function returns success, together with the key's recovery point, and rolls
// back when the phase fails. A refused Commit or Rollback changes nothing in the
// database, but the phase fails with this error whatever it returns, so that work its
// code meant to undo (or believed durable) is never committed by surprise. Savepoints
// opened with Begin commit and roll back as usual.
var ErrTxManaged = errors.New("the engine owns the phase's transaction: return from the phase to commit it, fail the phase to roll it back, or Begin a savepoint")
