package keytable

import "fmt"

// The statements of ScanPerKey (scan.go sends them), and nothing else: the sweeper's
// takeover of one due key and the per-key expiries of finished, dead-lettered and
// parked keys. A scan reads candidates across scopes, oldest first, without a lock (a
// multi-shard SELECT on Citus); each takeover names its key by scope and key, and each
// delete its keys by scope and a list of keys: one shard. They take a row only if no
// one else holds it (FOR UPDATE SKIP LOCKED) and re-check the candidate's guard on the
// newest row version. A candidate that changed after the scan is skipped.

// lockedByNoOne is true, and locks the key row $1, $2 created at $7 for the
// statement's transaction, unless another transaction holds it.
const lockedByNoOne = `EXISTS (SELECT 1 FROM idemflow_keys l
		WHERE l.scope = $1 AND l.idempotency_key = $2 AND l.created_at = $7::timestamptz FOR UPDATE SKIP LOCKED)`

// dueGuard matches a key a sweeper may take: unfinished, lease expired or released, due.
const dueGuard = `status = 'in_progress'
	AND next_attempt_at <= statement_timestamp()
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())`

// sqlScanDue lists up to $1 due keys older than $2 ms, of a flow in $3, at a recovery
// point in $4 (knownPoint), with a fingerprint and phase data this release reads
// (knownFormat): scope, key, lock version, created_at.
var sqlScanDue = `SELECT scope, idempotency_key, lock_version, created_at
FROM idemflow_keys
WHERE ` + dueGuard + `
	AND created_at <= statement_timestamp() - $2::bigint * interval '1 millisecond'
	AND flow = ANY($3::text[])
	AND ` + knownPoint("4") + `
	AND ` + knownFormat + `
ORDER BY next_attempt_at
LIMIT $1`

// sqlTakeKey takes over the due key $1, $2 created at $7 (its partition) if its lock
// version is still $3, as sqlTakeDue does for a batch: a lease of $4 ms, history kept
// $5, recovery point in $6 and formats known, re-checked (a release may have moved
// them since the scan).
var sqlTakeKey = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, attempts = attempts + 1, history = ` + historyAbandoned("5") + `,
	locked_until = statement_timestamp() + $4::bigint * interval '1 millisecond',
	updated_at = statement_timestamp()
WHERE scope = $1 AND idempotency_key = $2 AND lock_version = $3 AND created_at = $7::timestamptz
	AND ` + dueGuard + `
	AND ` + knownPoint("6") + `
	AND ` + knownFormat + `
	AND ` + lockedByNoOne + `
RETURNING ` + leasedColumns("4")

// expiryOf returns the scan of up to $2 keys of status whose column is more than $1
// ms old, ordered by order, and the per-key delete of the key $1, $2 if it still is
// (more than $3 ms old).
func expiryOf(status, column, order string) (scan, del string) {
	guard := `status = '` + status + `'
	AND ` + column + ` < statement_timestamp() - $%d::bigint * interval '1 millisecond'`
	scan = `SELECT scope, idempotency_key, lock_version, created_at
FROM idemflow_keys
WHERE ` + fmt.Sprintf(guard, 1) + `
ORDER BY ` + order + `
LIMIT $2`
	return scan, deleteOfScope(fmt.Sprintf(guard, 3))
}

// deleteOfScope is the delete of the keys $2 (an array) of the scope $1, created
// from $4 to $5 (the first and last of their created_at: on a partitioned key table,
// the partitions read; a list of values would prune none when the executor starts),
// that still match guard and that no one else holds: the guard is re-checked on the newest row
// version by FOR UPDATE, and a row another transaction holds is skipped. One scope
// is one shard on Citus.
func deleteOfScope(guard string) string {
	return `WITH c AS (
	SELECT idempotency_key FROM idemflow_keys
	WHERE scope = $1 AND idempotency_key = ANY($2::text[]) AND created_at BETWEEN $4::timestamptz AND $5::timestamptz
		AND ` + guard + `
	FOR UPDATE SKIP LOCKED
)
DELETE FROM idemflow_keys k USING c
WHERE k.scope = $1 AND k.idempotency_key = c.idempotency_key AND k.created_at BETWEEN $4::timestamptz AND $5::timestamptz`
}

// The expiries of finished keys by finish, and of dead-lettered keys by the time
// they were dead-lettered (their last change).
var (
	sqlScanFinished, sqlExpireFinishedKey = expiryOf("finished", "finished_at", "finished_at")
	sqlScanDead, sqlExpireDeadKey         = expiryOf("dead", "updated_at", "created_at")
)

// parkedGuard matches a parked key claimed more than $3 ms ago.
const parkedGuard = `status = 'in_progress'
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())
	AND created_at < statement_timestamp() - $3::bigint * interval '1 millisecond'`

// sqlScanParked lists up to $2 keys of the client-only flows $1 parked since their
// claim more than $3 ms ago.
const sqlScanParked = `SELECT scope, idempotency_key, lock_version, created_at
FROM idemflow_keys
WHERE flow = ANY($1::text[]) AND ` + parkedGuard + `
ORDER BY next_attempt_at
LIMIT $2`

// sqlExpireParkedKey deletes the keys $2 of the scope $1 still parked and claimed more
// than $3 ms ago.
var sqlExpireParkedKey = deleteOfScope(parkedGuard)
