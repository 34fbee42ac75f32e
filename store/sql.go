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
