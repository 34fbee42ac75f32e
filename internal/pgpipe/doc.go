// Package pgpipe sends a pgx batch as one pipeline whose prepared statements it names
// and keeps itself, so that a statement of the batch that fails leaves the
// connection's statements prepared.
//
// pgx's own Conn.SendBatch, in its statement-cache exec modes, forgets the prepared
// statement (or the cached description) of every statement of a batch that returned
// an error; the next request on that connection deallocates and prepares them again,
// a round trip or two more. The engine's batches fail on purpose: a claim or a fence
// that loses raises, so that the server skips the rest of the batch. Send keeps those
// losing batches free of after-effects.
//
//	br := pgpipe.Send(ctx, conn, b) // or SendGuarded(ctx, conn, b, guard)
//	defer br.Close()
//	tag, err := br.Exec()
//
// How it works. Each connection gets a registry, kept in its pgconn's CustomData:
//
//   - QueryExecModeCacheStatement (pgx's default): statements prepared under names of
//     this package's own ("idemflow_<n>", never reused on a connection), up to the
//     connection's StatementCacheCapacity (pgx's default 512); the least recently used
//     are closed (the protocol's DEALLOCATE) in the next round trip that prepares.
//   - QueryExecModeCacheDescribe: descriptions only, up to DescriptionCacheCapacity;
//     statements go unnamed, as pgx sends them, so they work behind a pooler in
//     transaction mode that keeps no prepared statements.
//
// A statement seen for the first time on a connection is described first, in a round
// trip of its own, as pgx does — but not in a guarded batch (SendGuarded), whose first
// statements decide whether the rest may run (the engine's claim or fence, which
// raises when it says no). A Parse takes the locks of the tables its statement names,
// so a rest described ahead of its guard would wait for a lock its guard was meant to
// spare it. There the guard's statements go first (one seen for the first time as
// pgx's exec mode sends it: the unnamed statement, its arguments' types from their Go
// values), then the Parse and Describe of every new statement, then a Flush: the
// server answers without ending the transaction, and after a guard that raised it
// skips every message up to the next Sync, Parse included. The rest is sent, with
// Sync, once the guard came back: the same two round trips on a new connection, one
// once it prepared the batch's statements. A guard whose statements only check
// something another transaction may change can have them sent again at the head of
// that second round trip (SendRechecked), so that what they found holds as near to
// the rest as in one round trip. pgx's describe-exec mode, which describes
// every statement on every use, goes the same way for a guarded batch (two round
// trips, as in pgx). pgx's exec mode (one pipeline) and simple protocol (one query
// string, each statement parsed and analysed only once the one before it ran) need
// nothing: they go to pgx. The registry forgets a statement the server says
// cannot run as prepared (class 0A, such as "cached plan must not change result
// type", or class 42, or 08P01 when a stale description's result formats no longer
// match the columns) and forgets all of them when the server lost a name (26000,
// after DISCARD ALL or a pooler's reset); they are prepared again on their next use.
// The error itself reaches the caller, as with pgx. Any other error — a claim that
// lost, a constraint, a callback's error — changes nothing.
//
// Everything else goes to conn.SendBatch unchanged: the other exec modes (they keep
// nothing per statement, so they have nothing to lose; describe-exec but for a guarded
// batch), a disabled cache, a batch whose arguments start with a QueryExecMode, a
// QueryRewriter (named arguments, but in a guarded batch, which rewrites them as pgx
// does) or a result-format option, and a statement that is a bare name (a statement
// prepared by name with Conn.Prepare; such a guarded batch gets no guarantee). A context that ends or a connection that breaks is handled
// by pgconn's pipeline as in pgx: the connection is closed, never used half-read. The
// connection's tracer sees the batch if it is a pgx.BatchTracer (a prepare round trip
// is not traced, as in pgx). BatchResults.Tx is always nil: a batch begun with
// Batch.BeginTx must go to conn.SendBatch.
//
// It imports none of idemflow's packages.
package pgpipe
