// Package keytable is the only code that runs SQL on idemflow's key table. It claims
// keys, looks them up, takes over expired leases, advances recovery points under a
// fence, finishes keys with a response, and releases, parks, gives back or
// dead-letters them, in the words internal/maintenance's takeover defines; it also
// lays out and maintains the partitioned key table.
//
// It is the engine's machinery, internal so that nothing outside this module builds
// on it: its exported names serve the engine (package workflow) and change with it.
// The public driver layer is package store, which exposes the partitioned layout's
// part of this package (SetupPartitioned and the Partition* values) under its own
// names; the errors a user branches on are aliased in workflow (ErrUnavailable,
// ErrConflict, ErrLeaseLost, ErrNotFound, ...) and store (ErrNotPartitioned, ...).
// The SQL is kept for review in files by concern, each holding SQL and nothing else:
// sql_keyrow.go the key row's head (claim, fence) and its one write, expire_sql.go the
// three expiries (single statements and per-key deletes), partition_sql.go the
// partitioned layout's maintenance, sql_operator.go the operator's statements (lists,
// counts, release, purge, bulk actions, cancel, erasure; admin.go, bulk.go and erase.go
// send them) and sql_scan.go the per-key takeover (scan.go). sql.go holds the rest (the
// look-up, the sweeper's single statements, the shared fragments); the Citus set-up is
// in partition_citus.go and the standby wait's statements in standby.go, beside the
// code that sends them.
//
// A Store holds the texts of the statements it sends, built once by New, and its
// methods send only those; the zero Store is not usable. That is the one place where
// what varies between two engines' SQL (a schema-qualified table name, say) is
// applied, once per Store, rather than on every call. What sends no SQL (Classify,
// IsCommitted) is a plain function.
//
// Every statement on one key filters by its scope. The sweeper's statements (TakeDue,
// ExpireFinished) select across scopes by design, but change only rows they locked
// with SKIP LOCKED in the same short statement and re-check every guard on them; no
// transaction spans scopes. Fenced statements match the key row's identity and
// lock version; the ones meant to be pipelined with COMMIT abort the transaction when
// they match no row, so the COMMIT that follows cannot succeed. A new key's row is
// written under its claim lock, a transaction-scoped advisory lock on a hash of the key
// and the table (QueueClaimLook, QueueHead, QueueKeyWrite).
//
// The key row's part of a tx phase's transaction is queued with its reader attached:
// QueueHead (the claim or the fence that opens it) and QueueKeyWrite (the one write of
// the key row, whose fenced, locked-row, claiming and finishing forms are fields of
// KeyWrite) add their statements to a pgx.Batch and return a Queued, whose Read reads
// their results from the batch's results, in order. The few other statements that
// share a round trip still come in QueueXxx/ReadXxx pairs (the claim lock, the
// look-up). The engine owns the batch; this package owns the SQL. A statement with
// more inputs than a fence and a value or two takes them as a struct named as the
// statement (KeyWrite, Release, Park, DeadLetter, TakeDue).
//
// pgx errors are translated into this package's errors (ErrConflict, ErrUnavailable,
// ErrLeaseLost, ...) here and nowhere else (package store runs no SQL of its own); Classify does it for errors that came from
// a caller's own SQL.
//
// Every stored format that can change carries its version (format.go): the engine
// answers a row in a newer format retryable and leaves it alone, and the sweeper's
// statements do not take it.
//
// It may import the standard library, pgx and internal/vocab (the engine's vocabulary,
// whose errors it returns), and none of idemflow's other packages.
package keytable
