package keytable

import "strings"

// The key row's statements, and nothing else: the claim of a new key, the head that
// opens a tx phase's transaction (the claim, or the fence of an existing key) and the
// one write of the key row at the transaction's end, in each of its forms. The Go that
// queues and reads them is keyrow.go; the conventions of every statement (scope,
// database clock, Citus) are sql.go's.

// The claim. A new key's row is written only when its first transaction commits, so
// that a first phase costs one write of the key row, not an insert and an update. Until
// then the key is held by a transaction-scoped advisory lock on a 64-bit hash of (scope,
// key), taken without waiting: a concurrent attempt is told the key is busy at once,
// never queued behind the first. The claim runs before any of the phase's code (see
// internal/attempt's phaseTx.claim), and the lock is read in a statement of its own: a READ
// COMMITTED statement reads a snapshot taken when it starts, so a claim that committed
// (letting go of its lock) after the lock statement started is visible only to the next
// statement, the look-up.

// claimLockID is the advisory-lock id of the key whose hash is $n: the hash mixed with
// the key table's oid, so that key tables in two schemas of one database (or two test
// schemas) never share a lock.
func claimLockID(n string) string {
	return `($` + n + `::bigint # 'idemflow_keys'::regclass::oid::bigint)`
}

// sqlClaimLock takes the key's claim lock if it is free: true when taken (or already
// held by this transaction); and the transaction's start, which the key row inserted
// by this transaction takes as its created_at (the column's default).
var sqlClaimLock = `SELECT pg_try_advisory_xact_lock(` + claimLockID("1") + `), now()`

// insertColumns are the columns every insert of a key row sets.
const insertColumns = `scope, idempotency_key, id, flow, method, route, fingerprint, request_body, recovery_point, phase_data`

// keyValues are the values of a new, unfinished key row: recovery point $9, phase data
// $10, a lease of $11 ms, origin $12.
const keyValues = `$1, $2, $3::uuid, $4, $5, $6, $7, $8, $9, $10,
	statement_timestamp() + $11::bigint * interval '1 millisecond', $12`

// finishedValues are the values of a new key row that is already finished with its
// response ($8-$10), its attempt's history entry $11 (see historyFirst) and origin
// $12. Like a finished row, it keeps no request body or phase data.
var finishedValues = `$1, $2, $3::uuid, $4, $5, $6, $7, '', 'finished', '{}',
	'finished', $8, $9, $10, statement_timestamp(), ` + historyFirst("11") + `, $12`

const finishedColumns = insertColumns + `, status, response_status, response_headers, response_body, finished_at, history, origin`

// sqlInsertKey writes a new key row in the transaction that holds its claim lock and
// found no row. Nothing that takes the lock can have written the row since; anything
// else that did makes the primary key abort the transaction (23505).
const sqlInsertKey = `INSERT INTO idemflow_keys (` + insertColumns + `, locked_until, origin) VALUES (` + keyValues + `)`

// sqlInsertFinished is sqlInsertKey for a first transaction that answers.
var sqlInsertFinished = `INSERT INTO idemflow_keys (` + finishedColumns + `) VALUES (` + finishedValues + `)`

// sqlClaimInsertKey claims a new key and writes its row in one statement: nothing is
// inserted when the claim lock ($13) is held by another transaction, and a row that
// exists aborts the transaction on the primary key (23505), whatever the snapshot.
var sqlClaimInsertKey = `INSERT INTO idemflow_keys (` + insertColumns + `, locked_until, origin)
SELECT ` + keyValues + ` WHERE pg_try_advisory_xact_lock(` + claimLockID("13") + `)
RETURNING created_at`

// sqlClaimInsertFinished is sqlClaimInsertKey for a key that finishes in the same
// transaction (lock id $13).
var sqlClaimInsertFinished = `INSERT INTO idemflow_keys (` + finishedColumns + `)
SELECT ` + finishedValues + ` WHERE pg_try_advisory_xact_lock(` + claimLockID("13") + `)
RETURNING created_at`

// fence matches the row one executor owns: $1-$4 and, as the statement's last
// argument $n, the row's created_at, which names its partition on a partitioned key
// table (the statement then reads one partition) and changes nothing on a plain one
// (the primary key finds the row).
func fence(n string) string {
	return `scope = $1 AND idempotency_key = $2 AND id = $3::uuid AND lock_version = $4 AND ` + rowStatus("in_progress") + `
	AND created_at = $` + n + `::timestamptz`
}

// rowStatus is the condition that a key row's status is st, for a statement that
// finds its rows by the primary key (one key, or some keys of one scope), written so
// that no partial index's predicate matches it: PostgreSQL uses a partial index only
// where it can prove the query implies the index's predicate, which takes the same
// expression. Written plainly, `status = 'in_progress'` lets the planner read a key's
// row through the due index (idemflow_keys_due_idx, WHERE status = 'in_progress').
// When the table's statistics say few keys are unfinished, as they do once most keys
// have finished, that index looks empty and wins over the primary key, and the
// statement then reads every unfinished key to find its one: in a backlog after an
// outage, thousands of rows for each fence, finish and takeover (TestPerKeyPlans; the
// bench's drain read 2,500 buffers a fence check).
func rowStatus(st string) string { return `status || '' = '` + st + `'` }

// byKey is guard, a condition naming statuses as `status = '…'`, for a statement that
// finds its rows by the primary key: each becomes rowStatus's form.
func byKey(guard string) string {
	return strings.ReplaceAll(guard, `status = '`, `status || '' = '`)
}

// A fenced update that rides with COMMIT aborts the transaction unless it updated
// exactly one row: 1/count(*) divides by zero (22012) when the fence missed, and the
// COMMIT after it is then skipped.

// sqlAdvance moves the recovery point and extends the lease; aborts unless it updated
// exactly one row.
var sqlAdvance = `WITH u AS (
	UPDATE idemflow_keys
	SET recovery_point = $5, phase_data = $6,
		locked_until = statement_timestamp() + $7::bigint * interval '1 millisecond',
		updated_at = statement_timestamp()
	WHERE ` + fence("8") + `
	RETURNING 1
)
SELECT 1/count(*)::int FROM u`

// sqlFinish stores the response; aborts unless it updated exactly one row. A finished
// row keeps only what a replay and a mismatch check need, and its history: the request
// body and the phase data are emptied. History entry $8, kept $9.
var sqlFinish = `WITH u AS (
	UPDATE idemflow_keys
	SET status = 'finished', recovery_point = 'finished', phase_data = '{}', request_body = '',
		response_status = $5, response_headers = $6, response_body = $7,
		locked_until = NULL, last_error = NULL, history = ` + historyAppend("8", "9") + `,
		finished_at = statement_timestamp(), updated_at = statement_timestamp()
	WHERE ` + fence("10") + `
	RETURNING 1
)
SELECT 1/count(*)::int FROM u`

// The statements of a pipelined tx phase (internal/attempt's pipeline.go): its whole
// transaction is sent at once, so whatever decides whether the phase may run goes
// first and raises when it says no, and nothing queued after it runs. Only a loser
// raises: the winning path's statements never fail, so pgx keeps their prepared
// statements.
//
// A new key's batch starts with the claim: the claim lock, taken without waiting,
// raises when another transaction holds it; then, in a statement of its own (so that
// it reads a snapshot taken after the lock, see sqlClaimLock), the check that no row
// exists raises when one does. An existing key's batch starts with the fence: it
// locks the key row without waiting (NOWAIT: a lock held elsewhere raises 55P03 at
// once) and raises unless the row still has the executor's identity and lock version.
// The key row's write at the end is then a plain INSERT or UPDATE: nothing else can
// write the row until COMMIT.
//
// The fence carries the row's creation time when the executor knows it, so that on a
// key table partitioned by created_at it names one partition; the fence returns it, as
// the insert of a new row does.
//
// On a plain key table a phase sent in one round trip (nothing in it depends on its
// statements' results) claims a new key with the lock and, right after it, the insert
// of the key row as the phase leaves it: a row that exists makes the insert fail on
// the primary key, whatever the snapshot, so no separate check is needed and no write
// remains for the end (Head.InsertFollows). A partitioned key table has no primary key
// across partitions and keeps the check.
//
// Such a batch is also sent without BEGIN and COMMIT (internal/attempt's phaseTx.send): the
// server runs what comes before the protocol's Sync (extended protocol) or in one
// query string (simple protocol) as one implicit transaction, which any error rolls
// back whole. That transaction runs at the session's default isolation level, while
// the claim's check relies on READ COMMITTED (a snapshot per statement). So the first
// statement of every pipelined batch checks the level it runs at and raises
// (ErrNotReadCommitted) when it is another: nothing has run then, and the Store sends
// BEGIN ISOLATION LEVEL READ COMMITTED from then on (SendExplicit).
//
// A Go-code tx phase cannot hold the fence's lock: its Go code runs between its
// statements, and a takeover meanwhile must not wait for it. Its transaction starts
// with the fence's check instead (sqlFenceCheck), which locks nothing and raises the
// same way on a stale lock version, so that an executor whose lease was taken over
// runs none of that phase's statements either; the fenced write at its commit still
// catches a takeover while the phase runs.

// readCommittedGuard is 0 in a READ COMMITTED transaction; in any other it raises
// 22P02, its message naming notReadCommitted and the level. The first statement of a
// pipelined batch adds it, so that a batch sent as an implicit transaction never runs
// at another level.
const readCommittedGuard = `(CASE current_setting('transaction_isolation') WHEN 'read committed' THEN '0'
	ELSE '` + notReadCommitted + `' || current_setting('transaction_isolation') END)::int`

// readCommittedFilter is readCommittedGuard as a condition that holds in a READ
// COMMITTED transaction, without a CASE: the planner evaluates it once, before the
// scan and its lock, and it raises as the guard does in any other level. The fence
// takes this form because Citus allows only immutable functions inside a CASE of a
// statement it routes as a modification, which a row lock makes the fence.
const readCommittedFilter = `('` + notReadCommitted + `' || nullif(current_setting('transaction_isolation'), 'read committed'))::int IS NULL`

// notReadCommitted marks the guard's error.
const notReadCommitted = "idemflow: transaction is not read committed: "

// sqlPipeClaimLock takes a new key's claim lock, or raises 22012 when another
// transaction holds it (22P02 outside READ COMMITTED).
var sqlPipeClaimLock = `SELECT ` + readCommittedGuard + ` + 1/pg_try_advisory_xact_lock(` + claimLockID("1") + `)::int`

// sqlPipeClaimLockFlushed is sqlPipeClaimLock that also makes its transaction commit
// durably whatever synchronous_commit says (sqlCommitFlushed, in a second column: a
// table-less SELECT, so Citus runs it on the coordinator), for a claim whose commit
// precedes a call phase, without a statement of its own. The second column is
// evaluated only once the first did not raise.
var sqlPipeClaimLockFlushed = `SELECT ` + readCommittedGuard + ` + 1/pg_try_advisory_xact_lock(` + claimLockID("1") + `)::int,
	CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) END`

// sqlPipeClaimAbsent raises 22012 when the key row exists.
const sqlPipeClaimAbsent = `SELECT 1/(NOT EXISTS (SELECT FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2))::int`

// pipeRow names the row one executor owns, created at $5 (its partition, on a
// partitioned key table).
var pipeRow = fence("5")

// sqlPipeFence locks the executor's key row without waiting and returns its creation
// time; it raises 22012 when the row no longer has the executor's fence, 55P03 when
// another transaction holds its lock (22P02 outside READ COMMITTED).
var sqlPipeFence = `SELECT 1/count(*)::int, max(created_at) FROM (
	SELECT created_at FROM idemflow_keys
	WHERE ` + pipeRow + ` AND ` + readCommittedFilter + `
	FOR NO KEY UPDATE NOWAIT) f`

// sqlFenceCheck is the fence without the lock, for a Go-code tx phase (internal/attempt's
// phaseTx): it raises 22012 when the row no longer has the executor's fence (its lease
// was taken over, or the key finished or was dead-lettered by another), and locks
// nothing, so a takeover while the phase's Go code runs never waits for it. That
// takeover is caught by the fenced write at the commit, as before.
var sqlFenceCheck = `SELECT 1/count(*)::int FROM idemflow_keys
WHERE ` + pipeRow

// sqlPipeInsertKey is sqlInsertKey returning the row's creation time.
const sqlPipeInsertKey = sqlInsertKey + ` RETURNING created_at`

// sqlPipeAdvance is sqlAdvance for a row the fence locked: a plain update.
var sqlPipeAdvance = `UPDATE idemflow_keys
SET recovery_point = $6, phase_data = $7,
	locked_until = statement_timestamp() + $8::bigint * interval '1 millisecond',
	updated_at = statement_timestamp()
WHERE ` + pipeRow

// sqlPipeFinish is sqlFinish for a row the fence locked: a plain update. History
// entry $9, kept $10.
var sqlPipeFinish = `UPDATE idemflow_keys
SET status = 'finished', recovery_point = 'finished', phase_data = '{}', request_body = '',
	response_status = $6, response_headers = $7, response_body = $8,
	locked_until = NULL, last_error = NULL, history = ` + historyAppend("9", "10") + `,
	finished_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE ` + pipeRow

// sqlCommitFlushed makes the transaction it runs in commit durably on this server
// whatever synchronous_commit the server, the role or the session set: off becomes
// local for this transaction only (is_local: set_config's SET LOCAL), so the COMMIT
// is answered after its record is flushed; a stronger setting (local, remote_write,
// on, remote_apply) is left as it is. It touches no table (Citus runs it on the
// coordinator) and raises nothing. It takes effect in an implicit transaction too: the
// setting lasts until the transaction ends, at the protocol's Sync, and is read when
// it commits. It returns one row when it changed the setting, none otherwise.
const sqlCommitFlushed = `SELECT set_config('synchronous_commit', 'local', true) WHERE current_setting('synchronous_commit') = 'off'`

// sqlRefuseResponse is queued in place of a write that would store a response no key
// may hold (StoredResponse.storable): it raises check_violation (23514, errInvalid),
// aborting the transaction and so the phase's writes, as the CHECK constraint on the
// stored status did before migration 004. The engine never sends it: it refuses such a
// response before it writes.
const sqlRefuseResponse = `DO $$BEGIN RAISE EXCEPTION USING ERRCODE = 'check_violation',
	MESSAGE = 'idemflow: a response status outside 100-499 is never stored'; END$$`
