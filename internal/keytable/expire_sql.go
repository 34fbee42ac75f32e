package keytable

import (
	"fmt"
	"strings"
)

// The expiries' statements, and only them: the end of finished keys after their
// retention, of dead-lettered keys after theirs, and of parked keys whose client never
// came back (expire.go sends them). Each deletes a short batch of rows it locked with
// SKIP LOCKED, oldest first, and re-checks its guard on them: in one statement on plain
// PostgreSQL (ScanSingle, matching rows by ctid), or as a scan without a lock and a
// delete per scope (ScanPerKey: partitioned key tables and Citus).

// sqlExpireFinished deletes up to $2 finished keys whose finish is more than $1 ms old,
// oldest first, skipping rows someone else has locked. Unfinished and dead keys are
// never deleted.
const sqlExpireFinished = `DELETE FROM idemflow_keys
WHERE ` + ownTableRows + `ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'finished'
			AND finished_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
		ORDER BY finished_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	AND status = 'finished'`

// sqlExpireDead deletes up to $2 dead-lettered keys dead-lettered (last changed) more
// than $1 ms ago. A re-drive makes a key in progress again, and so safe from it.
const sqlExpireDead = `DELETE FROM idemflow_keys
WHERE ` + ownTableRows + `ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'dead'
			AND updated_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
		ORDER BY created_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	AND status = 'dead'
	AND updated_at < statement_timestamp() - $1::bigint * interval '1 millisecond'`

// sqlExpireParked deletes up to $2 keys of the client-only flows $3 that are in
// progress with no live lease and were claimed more than $1 ms ago: parked keys whose
// client never finished them.
const sqlExpireParked = `DELETE FROM idemflow_keys
WHERE ` + ownTableRows + `ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'in_progress'
			AND flow = ANY($3::text[])
			AND (locked_until IS NULL OR locked_until <= statement_timestamp())
			AND created_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
		ORDER BY next_attempt_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	AND status = 'in_progress'
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())
	AND created_at < statement_timestamp() - $1::bigint * interval '1 millisecond'`

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
		AND ` + byKey(guard) + `
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

// sqlScanFinishedRemovable is sqlScanFinished on a partitioned key table: only the
// keys created more than $3 ms ago (the retention and a partition's width), which
// are in partitions past their removal (ExpireFinished). A row's created_at never
// changes, so the per-key delete need not check it again.
var sqlScanFinishedRemovable = strings.Replace(sqlScanFinished, "\nORDER BY ",
	"\n\tAND created_at < statement_timestamp() - $3::bigint * interval '1 millisecond'\nORDER BY ", 1)

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
