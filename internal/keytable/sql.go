package keytable

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// idemflow's SQL on the key table that has no file of its own, kept for review (the key
// row's head and write are in sql_keyrow.go, the expiries' in expire_sql.go, the
// partitioned layout's maintenance in partition_sql.go, the operator's in
// sql_operator.go, the per-key takeover in sql_scan.go). Every statement on
// one key filters by scope. Lease arithmetic uses the database clock, read with
// statement_timestamp() (the start of the statement, not of its transaction, so a long
// transaction does not shorten the lease it sets); durations arrive as milliseconds.
//
// Every statement here must also run as a single-shard (router) statement when the key
// table is distributed by scope on Citus (see citus.go for the rules, which a test
// checks): no volatile function such as statement_timestamp() in an UPDATE, only immutable
// expressions in a RETURNING list, and no ctid. The single-statement sweeps of plain
// PostgreSQL (takeDue, expire) break the last rule; a Store for Citus never sends them
// and scans then acts per key instead (scan.go). jsonb values (phase data, response headers) are sent as json.RawMessage,
// which pgx encodes as JSON text in every query exec mode (a []byte would go as bytea
// where pgx does not ask the server for the parameters' types: the exec and
// simple_protocol modes) and which costs no copy.

// statements are the texts of the statements a Store sends, built once by New.
type statements struct {
	lookup, lookupPartitioned, claimLock                 string
	insertKey, insertFinished                            string
	claimInsertKey, claimInsertFinished                  string
	advance, finish, release, takeover                   string
	takeDue, giveBack, park, deadLetter, redrive, expire string
	abandon                                              string
	// ScanPerKey's (scan.go).
	scanDue, takeKey, scanFinished, expireFinishedKey string
	scanFinishedRemovable                             string
}

// newStatements returns the statements on the key table: idemflow_keys in the current
// schema when schema is "", or in schema, named by every statement (see qualify).
func newStatements(schema string) statements {
	q := func(sql string) string { return qualify(sql, schema) }
	return statements{
		lookup: q(sqlLookup), lookupPartitioned: q(sqlLookupPartitioned), claimLock: q(sqlClaimLock),
		insertKey: q(sqlInsertKey), insertFinished: q(sqlInsertFinished),
		claimInsertKey: q(sqlClaimInsertKey), claimInsertFinished: q(sqlClaimInsertFinished),
		advance: q(sqlAdvance), finish: q(sqlFinish), release: q(sqlRelease), takeover: q(sqlTakeover),
		takeDue: q(sqlTakeDue), giveBack: q(sqlGiveBack), park: q(sqlPark), deadLetter: q(sqlDeadLetter),
		redrive: q(sqlRedrive), expire: q(sqlExpireFinished), abandon: q(sqlAbandon),
		scanDue: q(sqlScanDue), takeKey: q(sqlTakeKey), scanFinished: q(sqlScanFinished), expireFinishedKey: q(sqlExpireFinishedKey),
		scanFinishedRemovable: q(sqlScanFinishedRemovable),
	}
}

// keyTable is the key table's name as the statements below write it.
const keyTable = "idemflow_keys"

// qualify returns sql with every mention of the key table qualified by schema: the
// claim lock's 'idemflow_keys'::regclass literal becomes the qualified name as a
// string literal, and every other idemflow_keys the quoted schema and the table. With
// schema "" it returns sql unchanged, so the default store sends the texts above byte
// for byte. Nothing else in the statements contains the table's name (a test checks
// that the qualified texts name no other).
func qualify(sql, schema string) string {
	if schema == "" {
		return sql
	}
	name := pgx.Identifier{schema, keyTable}.Sanitize()
	literal := "'" + strings.ReplaceAll(name, "'", "''") + "'"
	sql = strings.ReplaceAll(sql, "'"+keyTable+"'", "\x00")
	sql = strings.ReplaceAll(sql, keyTable, name)
	return strings.ReplaceAll(sql, "\x00", literal)
}

// keyColumns are the columns of Row stored on a key row, in the order scanOne reads
// them (and named as Row's db tags, for the sweeper's lists). created_at is the last
// part of the row's identity (Fence.CreatedAt): on a partitioned key table it names
// the row's partition.
const keyColumns = `
	scope, idempotency_key, id::text AS id, flow, method, route, fingerprint, request_body,
	recovery_point, phase_data, status, lock_version, attempts, last_error, coalesce(origin, '') AS origin, created_at`

// responseColumns are the stored response's columns of Row, read after the lease's.
const responseColumns = `
	response_status::int AS response_status, response_headers, response_body`

// rowColumns are the columns of Row for a SELECT: the lease's computed from
// locked_until by the database clock.
const rowColumns = keyColumns + `,
	coalesce(locked_until > statement_timestamp(), false) AS lease_live,
	CASE WHEN locked_until > statement_timestamp()
		THEN ceil(extract(epoch FROM locked_until - statement_timestamp()) * 1000)::bigint
		ELSE 0 END AS lease_left_ms,` + responseColumns

// leasedColumns are the columns of Row for the RETURNING list of a statement that has
// just set a lease of $n ms: the lease's are that argument, an immutable expression
// (Citus refuses any other in a RETURNING list).
func leasedColumns(n string) string {
	return keyColumns + `,
	$` + n + `::bigint > 0 AS lease_live, $` + n + `::bigint AS lease_left_ms,` + responseColumns
}

// releasedColumns are the columns of Row for the RETURNING list of a statement that
// has just cleared the lease.
const releasedColumns = keyColumns + `,
	false AS lease_live, 0::bigint AS lease_left_ms,` + responseColumns

// sqlLookup reads one key row: the replay path's only statement.
const sqlLookup = `SELECT ` + rowColumns + `
FROM idemflow_keys
WHERE scope = $1 AND idempotency_key = $2`

// sqlLookupPartitioned is sqlLookup on a partitioned key table (docs/PARTITIONS.md):
// the partitions are read newest first until one holds the key (an ordered scan of
// the partitions under LIMIT 1), so that a replay of a recent key reads the few
// partitions ahead, empty, and its own. Every attached partition may hold a live key
// (a partition is removed only once it holds no unfinished or dead-lettered key), so
// a key not found has been looked for in each. The look-up does not read the clock: a
// row whose created_at lies ahead of the statement's start (the server's clock stepped
// back since it was inserted, or Citus nodes that disagree) is found like any other,
// for this look-up is what guards a Go-code phase's claim.
const sqlLookupPartitioned = sqlLookup + `
ORDER BY created_at DESC
LIMIT 1`

// sqlRelease gives up the lease after a transient failure. It matches only while the
// row still holds the recovery point the caller last knew durable ($9): a COMMIT whose
// outcome the caller could not learn, still running when it read the row, may advance
// the row after all, and a release must then not move it back. History entry $10, kept
// $11.
var sqlRelease = `UPDATE idemflow_keys
SET recovery_point = $5, phase_data = $6, last_error = $7, history = ` + historyAppend("10", "11") + `,
	next_attempt_at = statement_timestamp() + $8::bigint * interval '1 millisecond',
	locked_until = NULL, updated_at = statement_timestamp()
WHERE ` + fence("12") + ` AND recovery_point = $9`

// sqlTakeover takes an expired or released lease, bumping the lock version. An
// expired lease's attempt ended without a record: it is recorded as abandoned (history
// kept $6).
var sqlTakeover = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, attempts = attempts + 1, history = ` + historyAbandoned("6") + `,
	locked_until = statement_timestamp() + $5::bigint * interval '1 millisecond',
	updated_at = statement_timestamp()
WHERE ` + fence("7") + `
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())
RETURNING ` + leasedColumns("5")

// The sweeper's and retention's statements. They select across scopes (that is their
// job), from a candidate list locked with FOR UPDATE SKIP LOCKED in the same statement,
// and re-check every guard on the row they change. The candidates are matched by ctid:
// a row cannot move while the statement holds its lock, and a TID scan keeps the
// planner from joining the candidates to the whole table (a hash join over a
// sequential scan, at a few thousand rows). A ctid that were stale would only match a
// dead row version, whose newest version then fails the ctid condition: skipped, not
// misapplied.

// The single-statement sweeps match only rows of the key table itself (ownTableRows,
// partition.go): on a table partitioned after the Store learnt its layout, where ctid
// is unique only within a partition, they match nothing rather than another
// partition's row.

// sqlTakeDue takes over up to $1 due keys in one short statement: unfinished, lease
// expired or released, due by next_attempt_at, older than the grace period ($2 ms), of
// a flow in $4. Rows locked by anyone else (a request committing, another sweeper) are
// skipped, never waited for. FOR UPDATE re-checks the candidate guard on the newest
// row version, and the UPDATE checks it once more, so a key that finished or was taken
// over after this statement's snapshot is left alone. Sets a fresh lease of $3 ms, and
// records an expired lease's attempt as abandoned (history kept $5). Only keys at a
// recovery point in $6 (knownPoint), with a fingerprint and phase data this release
// reads (knownFormat), are taken: see format.go.
//
// The candidates are read in next_attempt_at order from a start point, $7 of the way
// (a fraction in [0, 1)) from the oldest unfinished key's due time to now
// (takeDueStart), and then, if fewer than $1 were found, from the oldest up to that
// point: every due key is within reach of every statement, and with $7 = 0 the order
// is the oldest due first. Sweepers that take at once from different start points
// read and lock different rows, where from one start they would all read the same
// oldest keys. The LIMIT over both parts stops the second part's scan before it reads
// a row when the first found enough. (Each part is a subquery of its own: PostgreSQL
// refuses FOR UPDATE in a part of a UNION.)
var sqlTakeDue = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, attempts = attempts + 1, history = ` + historyAbandoned("5") + `,
	locked_until = statement_timestamp() + $3::bigint * interval '1 millisecond',
	updated_at = statement_timestamp()
WHERE ` + ownTableRows + `ctid = ANY(ARRAY(
		SELECT c.ctid FROM (
			SELECT a.ctid FROM (` + takeDueCandidates(">=") + `) AS a
			UNION ALL
			SELECT b.ctid FROM (` + takeDueCandidates("<") + `) AS b
		) AS c
		LIMIT $1))
	AND status = 'in_progress'
	AND next_attempt_at <= statement_timestamp()
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())
RETURNING ` + leasedColumns("3")

// takeDueStart is sqlTakeDue's start point: $7 of the way from the oldest unfinished
// key's due time (the first entry of idemflow_keys_due_idx) to now; NULL when no key
// is unfinished (then nothing is due either). An initplan: computed once a statement.
var takeDueStart = dueStart("7")

// dueStart is a start point $n of the way from the oldest unfinished key's due time to
// now (takeDueStart, sqlScanDue's).
func dueStart(n string) string {
	return `(SELECT o.next_attempt_at + (statement_timestamp() - o.next_attempt_at) * $` + n + `::float8
	FROM idemflow_keys AS o WHERE o.status = 'in_progress' ORDER BY o.next_attempt_at LIMIT 1)`
}

// takeDueCandidates is one part of sqlTakeDue's candidates: due keys whose
// next_attempt_at is cmp (">=" or "<") the start point, oldest due first, locked.
func takeDueCandidates(cmp string) string {
	return `SELECT ctid
		FROM idemflow_keys
		WHERE status = 'in_progress'
			AND next_attempt_at <= statement_timestamp()
			AND next_attempt_at ` + cmp + ` ` + takeDueStart + `
			AND (locked_until IS NULL OR locked_until <= statement_timestamp())
			AND created_at <= statement_timestamp() - $2::bigint * interval '1 millisecond'
			AND flow = ANY($4::text[])
			AND ` + knownPoint("6") + `
			AND ` + knownFormat + `
		ORDER BY next_attempt_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED`
}

// sqlTakeDuePlan sets, for the rest of its transaction, the planner settings the
// takeover (sqlTakeDue) runs under: with them its candidates are read from
// idemflow_keys_due_idx in next_attempt_at order, and the scan stops once $1 are
// locked. Left to itself the planner, which expects few keys to be due, reads every
// due key with a bitmap scan and sorts them: a cost that grows with the backlog and is
// paid again by every batch, so that draining a backlog of n keys costs n²/batch.
const sqlTakeDuePlan = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
	set_config('enable_sort', 'off', true)`

// sqlGiveBack gives back a key taken over but never run: the lease is cleared and the
// attempt the takeover counted is uncounted, once (a key without a lease is not
// matched). next_attempt_at is unchanged, so the key stays due. The lock version stays
// bumped.
var sqlGiveBack = `UPDATE idemflow_keys
SET locked_until = NULL, attempts = greatest(attempts - 1, 0), updated_at = statement_timestamp()
WHERE ` + fence("5") + ` AND locked_until IS NOT NULL`

// sqlAbandon takes a key away from an attempt its process gives up on (a drain past
// its deadline): the lock version is bumped, so that the attempt, should it still run,
// can commit nothing more; the lease is cleared and the key is due at once, with why
// as its last error ($5) and history entry $6 (kept $7).
var sqlAbandon = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, locked_until = NULL, last_error = $5, history = ` + historyAppend("6", "7") + `,
	next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE ` + fence("8") + ` AND locked_until IS NOT NULL`

// sqlPark parks a key that only its client can finish: the lease is cleared, the
// takeover's attempt uncounted, why it waits recorded as its last error ($5), and the
// key not due again for $6 ms. The lock version stays bumped. History entry $7, kept $8.
var sqlPark = `UPDATE idemflow_keys
SET locked_until = NULL, attempts = greatest(attempts - 1, 0), last_error = $5, history = ` + historyAppend("7", "8") + `,
	next_attempt_at = statement_timestamp() + $6::bigint * interval '1 millisecond',
	updated_at = statement_timestamp()
WHERE ` + fence("9") + ` AND locked_until IS NOT NULL`

// sqlDeadLetter gives up on a key: status 'dead' with its last error, no lease. The
// recovery point and phase data are kept, so a re-drive resumes where it stopped.
// History entry $9, kept $10.
var sqlDeadLetter = `UPDATE idemflow_keys
SET status = 'dead', recovery_point = $5, phase_data = $6, last_error = $7, history = ` + historyAppend("9", "10") + `,
	locked_until = NULL, updated_at = statement_timestamp()
WHERE ` + fence("11") + ` AND recovery_point = $8`

// sqlRedrive puts a dead-lettered key back in progress: released, attempts reset, due
// now. The lock version is bumped so nothing that ran it before can commit. last_error
// is kept until the next failure or the finish replaces it. History entry $3, kept $4.
var sqlRedrive = `UPDATE idemflow_keys
SET status = 'in_progress', attempts = 0, lock_version = lock_version + 1, history = ` + historyAppend("3", "4") + `,
	locked_until = NULL, next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE scope = $1 AND idempotency_key = $2 AND ` + rowStatus("dead") + `
RETURNING ` + releasedColumns
