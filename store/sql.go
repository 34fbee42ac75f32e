package store

// All of idemflow's SQL on the key table, in one place for review. Every statement
// filters by scope. Lease arithmetic uses the database clock (clock_timestamp(), so a
// long transaction does not shorten the lease it sets); durations arrive as
// milliseconds.

// rowColumns are the columns of Row, computed from a key row.
const rowColumns = `
	scope, idempotency_key, id::text AS id, flow, method, route, fingerprint, request_body,
	recovery_point, phase_data, status, lock_version, attempts, last_error,
	coalesce(locked_until > clock_timestamp(), false) AS lease_live,
	CASE WHEN locked_until > clock_timestamp()
		THEN ceil(extract(epoch FROM locked_until - clock_timestamp()) * 1000)::bigint
		ELSE 0 END AS lease_left_ms,
	response_status::int AS response_status, response_headers, response_body`

// sqlLookup reads one key row: the replay path's only statement.
const sqlLookup = `SELECT ` + rowColumns + `, false AS inserted
FROM idemflow_keys
WHERE scope = $1 AND idempotency_key = $2`

// sqlClaim inserts a key row or returns the existing one, in one statement. When a
// concurrent claim of the same key commits while this one waits on it, the existing row
// is not visible to this statement's snapshot and no row comes back (ErrClaimRaced).
const sqlClaim = `WITH ins AS (
	INSERT INTO idemflow_keys AS k
		(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, locked_until)
	VALUES ($1, $2, $3::uuid, $4, $5, $6, $7, $8, clock_timestamp() + $9::bigint * interval '1 millisecond')
	ON CONFLICT (scope, idempotency_key) DO NOTHING
	RETURNING ` + rowColumns + `, true AS inserted
)
SELECT * FROM ins
UNION ALL
SELECT ` + rowColumns + `, false AS inserted
FROM idemflow_keys
WHERE scope = $1 AND idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM ins)`

// fence matches the row one executor owns.
const fence = `scope = $1 AND idempotency_key = $2 AND id = $3::uuid AND lock_version = $4 AND status = 'in_progress'`

// sqlAdvance moves the recovery point and extends the lease; raises (IF001) unless it
// updated exactly one row.
const sqlAdvance = `WITH u AS (
	UPDATE idemflow_keys
	SET recovery_point = $5, phase_data = $6,
		locked_until = clock_timestamp() + $7::bigint * interval '1 millisecond',
		updated_at = clock_timestamp()
	WHERE ` + fence + `
	RETURNING 1
)
SELECT idemflow_fence(count(*)) FROM u`

// sqlFinish stores the response; raises (IF001) unless it updated exactly one row.
const sqlFinish = `WITH u AS (
	UPDATE idemflow_keys
	SET status = 'finished', recovery_point = 'finished', phase_data = $5,
		response_status = $6, response_headers = $7, response_body = $8,
		locked_until = NULL, last_error = NULL,
		finished_at = clock_timestamp(), updated_at = clock_timestamp()
	WHERE ` + fence + `
	RETURNING 1
)
SELECT idemflow_fence(count(*)) FROM u`

// sqlRelease gives up the lease after a transient failure.
const sqlRelease = `UPDATE idemflow_keys
SET recovery_point = $5, phase_data = $6, last_error = $7,
	next_attempt_at = clock_timestamp() + $8::bigint * interval '1 millisecond',
	locked_until = NULL, updated_at = clock_timestamp()
WHERE ` + fence

// sqlTakeover takes an expired or released lease, bumping the lock version.
const sqlTakeover = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, attempts = attempts + 1,
	locked_until = clock_timestamp() + $5::bigint * interval '1 millisecond',
	updated_at = clock_timestamp()
WHERE ` + fence + `
	AND (locked_until IS NULL OR locked_until <= clock_timestamp())
RETURNING ` + rowColumns + `, false AS inserted`

// The sweeper's and retention's statements. They select across scopes (that is their
// job), from a candidate list locked with FOR UPDATE SKIP LOCKED in the same statement,
// and re-check every guard on the row they change. The candidates are matched by ctid:
// a row cannot move while the statement holds its lock, and a TID scan keeps the
// planner from joining the candidates to the whole table (a hash join over a
// sequential scan, at a few thousand rows). A ctid that were stale would only match a
// dead row version, whose newest version then fails the ctid condition: skipped, not
// misapplied.

// sqlTakeDue takes over up to $1 due keys in one short statement: unfinished, lease
// expired or released, due by next_attempt_at, older than the grace period ($2 ms), of
// a flow in $4. Rows locked by anyone else (a request committing, another sweeper) are
// skipped, never waited for. FOR UPDATE re-checks the candidate guard on the newest
// row version, and the UPDATE checks it once more, so a key that finished or was taken
// over after this statement's snapshot is left alone. Sets a fresh lease of $3 ms.
const sqlTakeDue = `UPDATE idemflow_keys
SET lock_version = lock_version + 1, attempts = attempts + 1,
	locked_until = clock_timestamp() + $3::bigint * interval '1 millisecond',
	updated_at = clock_timestamp()
WHERE ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'in_progress'
			AND next_attempt_at <= clock_timestamp()
			AND (locked_until IS NULL OR locked_until <= clock_timestamp())
			AND created_at <= clock_timestamp() - $2::bigint * interval '1 millisecond'
			AND flow = ANY($4::text[])
		ORDER BY next_attempt_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	AND status = 'in_progress'
	AND next_attempt_at <= clock_timestamp()
	AND (locked_until IS NULL OR locked_until <= clock_timestamp())
RETURNING ` + rowColumns + `, false AS inserted`

// sqlGiveBack returns a key taken over but never run: the lease is cleared and the
// attempt the takeover counted is uncounted, once (a released key is not matched). next_attempt_at is unchanged, so the key
// stays due. The lock version stays bumped.
const sqlGiveBack = `UPDATE idemflow_keys
SET locked_until = NULL, attempts = greatest(attempts - 1, 0), updated_at = clock_timestamp()
WHERE ` + fence + ` AND locked_until IS NOT NULL`

// sqlPark releases a key that only its client can finish: the lease is cleared, the
// takeover's attempt uncounted, the reason recorded, and the key not due again for $6
// ms. The lock version stays bumped.
const sqlPark = `UPDATE idemflow_keys
SET locked_until = NULL, attempts = greatest(attempts - 1, 0), last_error = $5,
	next_attempt_at = clock_timestamp() + $6::bigint * interval '1 millisecond',
	updated_at = clock_timestamp()
WHERE ` + fence + ` AND locked_until IS NOT NULL`

// sqlDeadLetter gives up on a key: status 'dead' with its last error, no lease. The
// recovery point and phase data are kept, so a re-drive resumes where it stopped.
const sqlDeadLetter = `UPDATE idemflow_keys
SET status = 'dead', recovery_point = $5, phase_data = $6, last_error = $7,
	locked_until = NULL, updated_at = clock_timestamp()
WHERE ` + fence

// sqlRedrive puts a dead-lettered key back in progress: released, attempts reset, due
// now. The lock version is bumped so nothing that ran it before can commit. last_error
// is kept until the next failure or the finish replaces it.
const sqlRedrive = `UPDATE idemflow_keys
SET status = 'in_progress', attempts = 0, lock_version = lock_version + 1,
	locked_until = NULL, next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE scope = $1 AND idempotency_key = $2 AND status = 'dead'
RETURNING ` + rowColumns + `, false AS inserted`

// sqlExpireFinished deletes up to $2 finished keys whose finish is more than $1 ms old,
// oldest first, skipping rows someone else has locked. Unfinished and dead keys are
// never deleted.
const sqlExpireFinished = `DELETE FROM idemflow_keys
WHERE ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'finished'
			AND finished_at < clock_timestamp() - $1::bigint * interval '1 millisecond'
		ORDER BY finished_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	AND status = 'finished'`
