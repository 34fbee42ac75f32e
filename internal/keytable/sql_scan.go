package keytable

// The statements of ScanPerKey's takeover (scan.go sends them), and nothing else: the
// sweeper's takeover of one due key (the per-key expiries are in expire_sql.go). A scan
// reads candidates across scopes, oldest first, without a lock (a multi-shard SELECT on
// Citus); each takeover names its key by scope and key: one shard. It takes a row only
// if no one else holds it (FOR UPDATE SKIP LOCKED) and re-checks the candidate's guard
// on the newest row version. A candidate that changed after the scan is skipped.

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
// (knownFormat): scope, key, lock version, created_at. Like sqlTakeDue it reads in
// next_attempt_at order from a start point $5 of the way from the oldest unfinished
// key's due time to now, then from the oldest up to that point, so that sweepers that
// scan at once from different start points list different keys.
var sqlScanDue = `SELECT c.scope, c.idempotency_key, c.lock_version, c.created_at FROM (
	SELECT a.* FROM (` + scanDueCandidates(">=") + `) AS a
	UNION ALL
	SELECT b.* FROM (` + scanDueCandidates("<") + `) AS b
) AS c
LIMIT $1`

// scanDueCandidates is one part of sqlScanDue: due keys whose next_attempt_at is cmp
// (">=" or "<") the start point, oldest due first.
func scanDueCandidates(cmp string) string {
	return `SELECT scope, idempotency_key, lock_version, created_at
		FROM idemflow_keys
		WHERE ` + dueGuard + `
			AND next_attempt_at ` + cmp + ` ` + dueStart("5") + `
			AND created_at <= statement_timestamp() - $2::bigint * interval '1 millisecond'
			AND flow = ANY($3::text[])
			AND ` + knownPoint("4") + `
			AND ` + knownFormat + `
		ORDER BY next_attempt_at
		LIMIT $1`
}

// sqlTakeKey takes over the due key $1, $2 created at $7 (its partition) if its lock
// version is still $3, as sqlTakeDue does for a batch: a lease of $4 ms, history kept
// $5, recovery point in $6 and formats known, re-checked (a release may have moved
// them since the scan).
var sqlTakeKey = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, attempts = attempts + 1, history = ` + historyAbandoned("5") + `,
	locked_until = statement_timestamp() + $4::bigint * interval '1 millisecond',
	updated_at = statement_timestamp()
WHERE scope = $1 AND idempotency_key = $2 AND lock_version = $3 AND created_at = $7::timestamptz
	AND ` + byKey(dueGuard) + `
	AND ` + knownPoint("6") + `
	AND ` + knownFormat + `
	AND ` + lockedByNoOne + `
RETURNING ` + leasedColumns("4")
