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
//	br := pgpipe.Send(ctx, conn, b)
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
// trip of its own, as pgx does. The registry forgets a statement the server says
// cannot run as prepared (class 0A, such as "cached plan must not change result
// type", or class 42, or 08P01 when a stale description's result formats no longer
// match the columns) and forgets all of them when the server lost a name (26000,
// after DISCARD ALL or a pooler's reset); they are prepared again on their next use.
// The error itself reaches the caller, as with pgx. Any other error — a claim that
// lost, a constraint, a callback's error — changes nothing.
//
// Everything else goes to conn.SendBatch unchanged: the other exec modes (they keep
// nothing per statement, so they have nothing to lose), a disabled cache, a batch
// whose arguments start with a QueryExecMode, a QueryRewriter (named arguments) or a
// result-format option, and a statement that is a bare name (a statement prepared by
// name with Conn.Prepare). A context that ends or a connection that breaks is handled
// by pgconn's pipeline as in pgx: the connection is closed, never used half-read. The
// connection's tracer sees the batch if it is a pgx.BatchTracer (a prepare round trip
// is not traced, as in pgx). BatchResults.Tx is always nil: a batch begun with
// Batch.BeginTx must go to conn.SendBatch.
//
// It imports none of idemflow's packages.
package pgpipe
