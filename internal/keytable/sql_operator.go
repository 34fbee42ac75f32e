package keytable

import "strconv"

// The operator's statements, and nothing else: the console's lists, one key in full,
// the counts, gauges and outcomes over time, the release and purge of one key, the bulk
// actions and the cancel of one key, and the erasure of a scope. The code that sends
// them and reads their results is in admin.go, bulk.go and erase.go; newAdminStatements
// (admin.go) qualifies them once per Store. Nothing on a request's path sends them.
// Each statement on one key filters by its scope; the lists, counts and scans read
// across scopes without locking anything.

// stuckCond matches the rows of statusStuck.
const stuckCond = `status = 'in_progress' AND next_attempt_at <= statement_timestamp()
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())`

// listStatus is, for each status a list can ask for ("" for every key), which rows
// match and which column orders them: one that an index of that status orders.
var listStatus = map[string]struct{ where, order string }{
	"":               {`true`, `created_at`},
	StatusInProgress: {`status = 'in_progress'`, `next_attempt_at`}, // idemflow_keys_due_idx
	statusStuck:      {stuckCond, `next_attempt_at`},                // idemflow_keys_due_idx
	StatusDead:       {`status = 'dead'`, `created_at`},             // idemflow_keys_dead_idx
	StatusFinished:   {`status = 'finished'`, `finished_at`},        // idemflow_keys_finished_idx
}

// summaryColumns are the columns of KeySummary, in the order scanSummary reads them.
const summaryColumns = `scope, idempotency_key, id::text, flow,
	CASE WHEN ` + stuckCond + ` THEN 'stuck' ELSE status END,
	recovery_point, attempts, last_error, created_at, updated_at, finished_at`

// sqlList is the list of the keys matching where, ordered by order, then scope and
// key: keys of flow $1 ("" any) and scope $2 ("" any) claimed at least $3 ms ago, at
// most $4; the first page, and a later page, after ($5, $6, $7) in that order.
func sqlList(where, order string) (first, later string) {
	base := `SELECT ` + summaryColumns + `, ` + order + `
FROM idemflow_keys
WHERE ` + where + `
	AND ($1 = '' OR flow = $1) AND ($2 = '' OR scope = $2)
	AND created_at <= statement_timestamp() - $3::bigint * interval '1 millisecond'`
	tail := `
ORDER BY ` + order + `, scope, idempotency_key
LIMIT $4`
	return base + tail, base + `
	AND (` + order + `, scope, idempotency_key) > ($5::timestamptz, $6, $7)` + tail
}

// sqlShow reads the key $1, $2 in full: its summary, request, lease, response and
// history, and the version of its phase data's format.
const sqlShow = `SELECT ` + summaryColumns + `, method, route, request_body, octet_length(phase_data::text),
	lock_version, CASE WHEN locked_until > statement_timestamp()
		THEN ceil(extract(epoch FROM locked_until - statement_timestamp()) * 1000)::bigint ELSE 0 END,
	next_attempt_at, response_status::int, origin, history, response_headers, response_body,
	coalesce(phase_data ->> '` + FormatMember + `', '1')
FROM idemflow_keys
WHERE scope = $1 AND idempotency_key = $2`

// sqlCounts counts the keys by flow and status, stuck keys apart.
const sqlCounts = `SELECT flow, CASE WHEN ` + stuckCond + ` THEN 'stuck' ELSE status END AS s, count(*)
FROM idemflow_keys
GROUP BY 1, 2
ORDER BY 1, 2`

// sqlGauges reads, by flow, the keys in progress, stuck and dead-lettered, and how
// long (ms) the oldest stuck key has been due. One arm per partial index, so that the
// gauges never read a finished key.
const sqlGauges = `SELECT flow,
	count(*) FILTER (WHERE status = 'in_progress'),
	count(*) FILTER (WHERE ` + stuckCond + `),
	count(*) FILTER (WHERE status = 'dead'),
	floor(extract(epoch FROM statement_timestamp()
		- min(greatest(next_attempt_at, locked_until)) FILTER (WHERE ` + stuckCond + `)) * 1000)::bigint
FROM (
	SELECT flow, status, next_attempt_at, locked_until FROM idemflow_keys WHERE status = 'in_progress'
	UNION ALL
	SELECT flow, status, next_attempt_at, locked_until FROM idemflow_keys WHERE status = 'dead'
) k
GROUP BY flow
ORDER BY flow`

// sqlOutcomes counts the keys finished or dead-lettered in the last $1 ms, by flow and
// buckets of $2 ms, of status $3 ("" both). One arm per partial index: finished keys
// by finish time, dead-lettered keys by the time they died (their last update). The
// window is bounded by statement_timestamp(), which the planner can use as an index
// bound, as every statement here now does.
const sqlOutcomes = `SELECT flow, 'finished', date_bin($2::bigint * interval '1 millisecond', finished_at, timestamptz 'epoch'), count(*)
FROM idemflow_keys
WHERE status = 'finished' AND finished_at > statement_timestamp() - $1::bigint * interval '1 millisecond'
	AND $3 IN ('', 'finished')
GROUP BY 1, 3
UNION ALL
SELECT flow, 'dead', date_bin($2::bigint * interval '1 millisecond', updated_at, timestamptz 'epoch'), count(*)
FROM idemflow_keys
WHERE status = 'dead' AND updated_at > statement_timestamp() - $1::bigint * interval '1 millisecond'
	AND $3 IN ('', 'dead')
GROUP BY 1, 3
ORDER BY 3, 1, 2`

// operatorReleased is the history entry of an operator's release: the recovery point
// reached and whether the lease was live; history kept $3.
var operatorReleased = historyNote(jsonAttempt(`'by'`, `'operator'`, `'outcome'`, `'operator_released'`, `'reached'`, `recovery_point`), "3", "",
	[2]string{"lease_live", `((locked_until > statement_timestamp()) IS TRUE)::text::jsonb`})

// sqlOperatorRelease takes the lease of the unfinished key $1, $2 away (whoever holds
// it), makes it due now and returns its new lock version.
var sqlOperatorRelease = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, locked_until = NULL,
	next_attempt_at = statement_timestamp(), updated_at = statement_timestamp(),
	history = ` + operatorReleased + `
WHERE scope = $1 AND idempotency_key = $2 AND ` + rowStatus("in_progress") + `
RETURNING lock_version`

// sqlBulkRelease is sqlOperatorRelease for one key of a bulk action: it also
// re-checks the filter $4-$7.
var sqlBulkRelease = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, locked_until = NULL,
	next_attempt_at = statement_timestamp(), updated_at = statement_timestamp(),
	history = ` + operatorReleased + `
WHERE scope = $1 AND idempotency_key = $2 AND ` + rowStatus("in_progress") + ` AND ` + bulkFilter(4)

// sqlPurge deletes the finished key $1, $2.
var sqlPurge = `DELETE FROM idemflow_keys
WHERE scope = $1 AND idempotency_key = $2 AND ` + rowStatus("finished")

// bulkFilter is the condition of Filter on arguments $n to $n+3.
func bulkFilter(n int) string {
	a := func(i int) string { return "$" + strconv.Itoa(n+i) }
	return `(` + a(0) + ` = '' OR flow = ` + a(0) + `) AND (` + a(1) + ` = '' OR scope = ` + a(1) + `)
	AND (` + a(2) + ` = '' OR recovery_point = ` + a(2) + `)
	AND (` + a(3) + ` = '' OR strpos(coalesce(last_error, ''), ` + a(3) + `) > 0)`
}

// sqlBulkScan reads the next page of keys of status $1 matching the filter $2-$5, in
// claim order after ($6, $7, $8), at most $9. It locks nothing.
var sqlBulkScan = `SELECT scope, idempotency_key, flow, created_at
FROM idemflow_keys
WHERE status = $1 AND ` + bulkFilter(2) + `
	AND (created_at, scope, idempotency_key) > ($6::timestamptz, $7, $8)
ORDER BY created_at, scope, idempotency_key
LIMIT $9`

// sqlBulkRedrive is sqlRedrive for one key of a bulk action: it also re-checks the
// filter $5-$8. History entry $3, kept $4.
var sqlBulkRedrive = `UPDATE idemflow_keys
SET status = 'in_progress', attempts = 0, lock_version = lock_version + 1, history = ` + historyAppend("3", "4") + `,
	locked_until = NULL, next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE scope = $1 AND idempotency_key = $2 AND ` + rowStatus("dead") + ` AND ` + bulkFilter(5)

// sqlCancel finishes an unfinished key with an operator's response ($6-$8), as a
// finish does, and bumps the lock version so that no executor that held it can commit
// again. It matches only the row as the caller read it: id $3, lock version $4,
// recovery point $5, created at $11 (its partition), still in progress or
// dead-lettered. History entry $9, kept $10.
var sqlCancel = `UPDATE idemflow_keys
SET status = 'finished', recovery_point = 'finished', phase_data = '{}', request_body = '',
	response_status = $6, response_headers = $7, response_body = $8,
	lock_version = lock_version + 1, locked_until = NULL, last_error = NULL,
	history = ` + historyAppend("9", "10") + `,
	finished_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE scope = $1 AND idempotency_key = $2 AND id = $3::uuid AND lock_version = $4
	AND recovery_point = $5 AND status IN ('in_progress', 'dead') AND created_at = $11::timestamptz`

// sqlCancelFenced is sqlCancel as the fenced write of a compensation's transaction
// (KeyWrite.Cancel): it raises 22012, aborting the transaction and so the
// compensation's writes, unless it finished exactly one row.
var sqlCancelFenced = `WITH u AS (
` + sqlCancel + `
	RETURNING 1
)
SELECT 1/count(*)::int FROM u`

// sqlEraseBatch deletes up to $3 keys of scope $1, unfinished ones ('in_progress')
// only when $2. It returns, for each key deleted, whether it was leased beyond $4 (the
// database's time just before): a live holder is fenced by the deletion (every
// statement it commits matches no row). The RETURNING list calls no function, as
// Citus wants.
var sqlEraseBatch = `DELETE FROM idemflow_keys
WHERE scope = $1 AND idempotency_key IN (
	SELECT idempotency_key FROM idemflow_keys
	WHERE scope = $1 AND ($2 OR status <> 'in_progress')
	LIMIT $3)
	AND ($2 OR status <> 'in_progress')
RETURNING status = 'in_progress' AND (locked_until > $4::timestamptz) IS TRUE`

// sqlDatabaseTime reads the database's clock; it names no table.
const sqlDatabaseTime = `SELECT statement_timestamp()`

// sqlEraseCount counts the keys of scope $1: finished or dead-lettered, in progress,
// and in progress with a live lease.
var sqlEraseCount = `SELECT count(*) FILTER (WHERE status <> 'in_progress'),
	count(*) FILTER (WHERE status = 'in_progress'),
	count(*) FILTER (WHERE status = 'in_progress' AND locked_until > statement_timestamp())
FROM idemflow_keys
WHERE scope = $1`
