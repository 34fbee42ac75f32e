package keytable

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of a pipelined tx phase (workflow's pipeline.go): its whole
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
// remains for the end (QueuePipeClaimLock). A partitioned key table has no primary key
// across partitions and keeps the check.
//
// Such a batch is also sent without BEGIN and COMMIT (workflow's phaseTx.send): the
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

// pipeStatements are the pipelined statements' texts, qualified like statements.
type pipeStatements struct {
	// explicit: a batch found the session's default isolation level is not READ
	// COMMITTED, so every pipelined transaction begins with BEGIN from then on.
	explicit *atomic.Bool

	claimLock, claimLockFlushed, claimAbsent, fence string
	insertKey, advance, finish                      string
	// check is a Go-code tx phase's (QueueFenceCheck): not pipelined, but sent at the
	// head of its transaction like the fence.
	check string
}

func newPipeStatements(schema string) pipeStatements {
	q := func(sql string) string { return qualify(sql, schema) }
	return pipeStatements{
		explicit:  &atomic.Bool{},
		claimLock: q(sqlPipeClaimLock), claimLockFlushed: q(sqlPipeClaimLockFlushed), claimAbsent: q(sqlPipeClaimAbsent), fence: q(sqlPipeFence),
		insertKey: q(sqlPipeInsertKey), advance: q(sqlPipeAdvance), finish: q(sqlPipeFinish),
		check: q(sqlFenceCheck),
	}
}

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

// sqlFenceCheck is the fence without the lock, for a Go-code tx phase (workflow's
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

// ErrNotReadCommitted: a pipelined batch sent as an implicit transaction ran at
// another isolation level than READ COMMITTED (the session's default), and raised
// before anything of it ran. The Store sends BEGIN from then on (SendExplicit).
var ErrNotReadCommitted = errors.New("implicit transaction is not read committed")

// SendExplicit reports whether pipelined transactions must begin with BEGIN: a batch
// found the session's default isolation level is not READ COMMITTED (ReadPipeClaim,
// ReadPipeFence returned ErrNotReadCommitted). It stays so for the Store's life.
func (s *Store) SendExplicit() bool { return s.pipe.explicit.Load() }

// PipeInsertsAtClaim reports whether a new key's claim in a batch that needs no
// result before its end is the claim lock alone, followed at once by the insert of
// the key row (QueuePipeClaimLock): s has learnt its key table is not partitioned.
func (s *Store) PipeInsertsAtClaim() bool { return s.KnownUnpartitioned() }

// QueuePipeClaim adds a new key's claim to b: two statements, which raise when the
// claim is lost. Read them with ReadPipeClaim.
func (s *Store) QueuePipeClaim(b *pgx.Batch, c Claim) {
	s.QueuePipeClaimLock(b, c)
	b.Queue(s.pipe.claimAbsent, c.Scope, c.Key)
}

// QueuePipeClaimLock adds to b a new key's claim lock alone, which raises when
// another transaction holds it. On a plain key table the insert of the key row that
// follows it at once (QueuePipeInsertKey, QueueInsertFinished) completes the claim: it
// raises on the primary key when the row exists. Read it with ReadPipeClaimLock.
func (s *Store) QueuePipeClaimLock(b *pgx.Batch, c Claim) {
	b.Queue(s.pipe.claimLock, claimHash(c.Scope, c.Key))
}

// QueuePipeClaimLockFlushed is QueuePipeClaimLock for a transaction whose commit must
// be durable on the server whatever synchronous_commit says (QueueCommitFlushed), in
// the same statement. Read it with ReadPipeClaimLock.
func (s *Store) QueuePipeClaimLockFlushed(b *pgx.Batch, c Claim) {
	b.Queue(s.pipe.claimLockFlushed, claimHash(c.Scope, c.Key))
}

// ReadPipeClaim reads QueuePipeClaim's results: nil when this transaction holds the
// claim and no row exists; ErrClaimBusy when another transaction holds the claim lock;
// ErrClaimExists when the row exists (either way the transaction is aborted and
// nothing queued after the claim ran); ErrNotReadCommitted; or another translated
// error.
func (s *Store) ReadPipeClaim(br pgx.BatchResults) error {
	if err := s.ReadPipeClaimLock(br); err != nil {
		return err
	}
	if _, err := br.Exec(); err != nil {
		if isCode(err, codeDivisionByZero) {
			return fmt.Errorf("claim key: %w", ErrClaimExists)
		}
		return fmt.Errorf("claim key: %w", Classify(err))
	}
	return nil
}

// ReadPipeClaimLock reads QueuePipeClaimLock's result: nil, ErrClaimBusy,
// ErrNotReadCommitted, or another translated error.
func (s *Store) ReadPipeClaimLock(br pgx.BatchResults) error {
	_, err := br.Exec()
	switch {
	case err == nil:
		return nil
	case isCode(err, codeDivisionByZero):
		return fmt.Errorf("claim key: %w", ErrClaimBusy)
	}
	return fmt.Errorf("claim key: %w", s.guardErr(err))
}

// guardErr translates err, and notes that pipelined transactions must begin with
// BEGIN when it is readCommittedGuard's.
func (s *Store) guardErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, notReadCommitted) {
		s.pipe.explicit.Store(true)
		return fmt.Errorf("%w: %w", ErrNotReadCommitted, err)
	}
	return Classify(err)
}

// QueuePipeFence adds the fence of f's row to b. Read it with ReadPipeFence.
func (s *Store) QueuePipeFence(b *pgx.Batch, f Fence) {
	b.Queue(s.onPartition(s.pipe.fence, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt)
}

// ReadPipeFence reads QueuePipeFence's result: the row's creation time; ErrLeaseLost
// when the row no longer has the fence; ErrConflict when another transaction holds its
// lock (then the fence may be tried again: it never waited); or another translated
// error. After an error the transaction is aborted and nothing queued after the fence
// ran.
func (s *Store) ReadPipeFence(br pgx.BatchResults) (time.Time, error) {
	var one int
	var created time.Time
	err := br.QueryRow().Scan(&one, &created)
	switch {
	case err == nil:
		return created, nil
	case isCode(err, "55P03"):
		return time.Time{}, fmt.Errorf("fence key: %w: %w", ErrConflict, err)
	case isCode(err, "22P02"):
		return time.Time{}, fmt.Errorf("fence key: %w", s.guardErr(err))
	}
	return time.Time{}, fmt.Errorf("fence key: %w", fenceErr(err))
}

// QueueFenceCheck adds to b the check that f's row still has the fence, without
// locking it: a Go-code tx phase sends it with BEGIN, before the first of the phase's
// statements. Read it with ReadFenceCheck.
func (s *Store) QueueFenceCheck(b *pgx.Batch, f Fence) {
	b.Queue(s.onPartition(s.pipe.check, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt)
}

// ReadFenceCheck reads QueueFenceCheck's result: nil; ErrLeaseLost when the row no
// longer has the fence; or another translated error. After an error the transaction
// is aborted and nothing queued after the check ran.
func (s *Store) ReadFenceCheck(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("check fence: %w", fenceErr(err))
	}
	return nil
}

// QueuePipeInsertKey is QueueInsertKey returning the row's creation time: read it
// with ReadPipeInsertKey.
func (s *Store) QueuePipeInsertKey(b *pgx.Batch, c Claim, recoveryPoint string, data []byte) {
	b.Queue(s.pipe.insertKey, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body,
		recoveryPoint, json.RawMessage(data), c.Lease.Milliseconds(), c.origin())
}

// ReadPipeInsertKey reads QueuePipeInsertKey's result: the row's creation time, or the
// errors of ReadInsert.
func (s *Store) ReadPipeInsertKey(br pgx.BatchResults) (time.Time, error) {
	var created time.Time
	if err := br.QueryRow().Scan(&created); err != nil {
		return time.Time{}, insertErr(err)
	}
	return created, nil
}

// QueuePipeAdvance adds to b the plain update that moves the fenced row f to
// a.RecoveryPoint with a.Data and a lease of a.Lease. Read it with ReadPipeWrite.
func (s *Store) QueuePipeAdvance(b *pgx.Batch, f Fence, a Advance) {
	b.Queue(s.onPartition(s.pipe.advance, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt,
		a.RecoveryPoint, json.RawMessage(a.Data), a.Lease.Milliseconds())
}

// QueuePipeFinish adds to b the plain update that finishes the fenced row f with
// resp. Read it with ReadPipeWrite.
func (s *Store) QueuePipeFinish(b *pgx.Batch, f Fence, resp StoredResponse) {
	e, keep := resp.History.args()
	b.Queue(s.onPartition(s.pipe.finish, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt,
		resp.Status, json.RawMessage(resp.Headers), resp.Body, e, keep)
}

// ReadPipeWrite reads the result of QueuePipeAdvance or QueuePipeFinish: nil, or
// ErrLeaseLost if it changed no row (which the fence before it rules out), or another
// translated error.
func (s *Store) ReadPipeWrite(br pgx.BatchResults) error {
	tag, err := br.Exec()
	switch {
	case err != nil:
		return fmt.Errorf("write key: %w", Classify(err))
	case tag.RowsAffected() != 1:
		return fmt.Errorf("write key: %w", ErrLeaseLost)
	}
	return nil
}

// isCode reports whether err is a PostgreSQL error with SQLSTATE code.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
