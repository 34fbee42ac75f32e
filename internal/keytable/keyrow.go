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

// A tx phase's transaction, as the engine builds it (internal/attempt's plan), is a head, the
// phase's statements, one write of the key row and a tail: COMMIT, or the end of an
// implicit transaction. This file queues the head and the write, each with its reader
// attached where it is queued (Queued), so that a statement and the code that reads
// its result cannot drift apart; their SQL is sql_keyrow.go's.
//
// The head decides whether this attempt may run the phase's statements, and raises
// when it may not, so that the server runs nothing queued after it: a new key's claim
// (the claim lock, then the check that no row exists), or the fence of an existing
// key's row, which either locks the row (a pipelined phase, whose write is then a
// plain UPDATE) or only checks it (a Go-code phase, whose Go code runs while the
// transaction is open and must never make a takeover wait).

// Head is the start of a tx phase's transaction, queued ahead of its statements by
// QueueHead.
type Head struct {
	// Claim, when set, is a new key's claim: the claim lock, which raises when another
	// transaction holds it, and the check that no row exists, which raises when one
	// does. Fence names the existing row otherwise.
	Claim *Claim
	Fence Fence
	// Lock: the fence locks the row without waiting (FOR NO KEY UPDATE NOWAIT) and
	// returns its created_at, so the transaction's write of the row is a plain update
	// (KeyWrite.Held). Otherwise the fence only checks the row, locking nothing.
	Lock bool
	// InsertFollows: the claim is the claim lock alone, for a key table known not to
	// be partitioned (Store.KnownUnpartitioned): the insert of the key row queued right
	// after it (a held KeyWrite) completes the claim, raising on the primary key when
	// the row exists. Flushed then makes the same statement turn synchronous_commit off
	// into local for the transaction (see KeyWrite.Flushed).
	InsertFollows bool
	Flushed       bool
}

// KeyWrite is the engine's one write of a key row at the end of a tx phase's
// transaction (or of a transaction of its own): the insert of a new key's row, or the
// update of an existing one, moving it to RecoveryPoint with Data or finishing it with
// Response.
type KeyWrite struct {
	// Claim, when set, is a new key: its row is inserted, leased for Claim.Lease. Fence
	// names the existing row otherwise. A held insert returns the row's created_at
	// unless Fence.CreatedAt already holds it (the transaction's start, which the claim
	// lock read: ClaimLook.Read).
	Claim *Claim
	Fence Fence
	// Held: the transaction already holds what the write would otherwise check: a new
	// key's claim (its lock taken and no row found, or a Head with the claim), or the
	// lock on the existing row (a Head with Lock). The write is then a plain INSERT or
	// UPDATE. Otherwise the insert claims the key in the same statement (nothing is
	// inserted when another transaction holds the claim lock) and the update is fenced:
	// it raises, aborting the transaction, when the fence misses.
	Held bool
	// RecoveryPoint and Data are where the key stands after the write, and its phase
	// data (a JSON object); Lease is an update's new lease, from the database clock's
	// now.
	RecoveryPoint string
	Data          []byte
	Lease         time.Duration
	// Response, when set, finishes the key with it (its history entry appended); the
	// row keeps no phase data.
	Response *StoredResponse
	// Flushed: the transaction must commit durably on the server whatever
	// synchronous_commit says (sqlCommitFlushed, queued right after the write): its
	// commit precedes a call phase, whose loss in a crash would let a retry claim a new
	// key row and call again under another derived key.
	Flushed bool
	// Cancel, when set, makes the write an operator's cancel of the row it describes
	// (CancelKey's write, in the transaction of a flow's compensation), fenced: it
	// raises, aborting the transaction, unless it finished exactly that row. Every
	// other field is then ignored.
	Cancel *Cancel
}

// Queued reads the result of what QueueHead or QueueKeyWrite queued, from the results
// of the batch it was queued on, in order with its neighbours.
type Queued struct {
	s       *Store
	kind    queuedKind
	flushed bool
}

// queuedKind is which statements a Queued reads.
type queuedKind uint8

const (
	headClaim           queuedKind = iota // the claim lock and the check that no row exists
	headClaimLock                         // the claim lock alone
	headFence                             // the locking fence, returning created_at
	headCheck                             // the fence's check, locking nothing
	writeClaim                            // the insert that claims (either form: queueClaimChecks)
	writeInsert                           // the insert of an unfinished row, returning created_at
	writeInsertKnown                      // the insert of an unfinished row whose created_at is known
	writeInsertFinished                   // the insert of a finished row
	writeFenced                           // the fenced update that raises when it misses
	writeLocked                           // the plain update of a row the fence locked
	writeRefused                          // sqlRefuseResponse, in place of a write of a response never stored
)

// QueueHead adds h to b, and returns its reader.
func (s *Store) QueueHead(b *pgx.Batch, h Head) Queued {
	switch c := h.Claim; {
	case c != nil && h.InsertFollows && h.Flushed:
		b.Queue(s.pipe.claimLockFlushed, claimHash(c.Scope, c.Key))
		return Queued{s: s, kind: headClaimLock}
	case c != nil && h.InsertFollows:
		b.Queue(s.pipe.claimLock, claimHash(c.Scope, c.Key))
		return Queued{s: s, kind: headClaimLock}
	case c != nil:
		b.Queue(s.pipe.claimLock, claimHash(c.Scope, c.Key))
		b.Queue(s.pipe.claimAbsent, c.Scope, c.Key)
		return Queued{s: s, kind: headClaim}
	}
	f := h.Fence
	if h.Lock {
		b.Queue(s.onPartition(s.pipe.fence, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt)
		return Queued{s: s, kind: headFence}
	}
	b.Queue(s.onPartition(s.pipe.check, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt)
	return Queued{s: s, kind: headCheck}
}

// QueueKeyWrite adds w to b, and returns its reader.
func (s *Store) QueueKeyWrite(b *pgx.Batch, w KeyWrite) Queued {
	q := Queued{s: s, flushed: w.Flushed}
	c, f, resp := w.Claim, w.Fence, w.Response
	var status int
	var headers json.RawMessage
	var body []byte
	if resp != nil {
		status, headers, body = resp.columns()
	}
	switch {
	case resp != nil && !resp.storable() || w.Cancel != nil && !w.Cancel.Response.storable():
		q.kind = writeRefused
		b.Queue(sqlRefuseResponse)
	case w.Cancel != nil:
		q.kind = writeFenced
		b.Queue(s.admin.cancelFenced, w.Cancel.args(f.Scope, f.Key)...)
	case c != nil && !w.Held && resp != nil:
		q.kind = writeClaim
		e, _ := resp.History.args()
		if s.queueClaimChecks(b, *c) { // a partitioned key table: docs/PARTITIONS.md
			b.Queue(s.part.insertFinished, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint,
				status, headers, body, e, c.origin())
			break
		}
		b.Queue(s.sql.claimInsertFinished, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint,
			status, headers, body, e, c.origin(), claimHash(c.Scope, c.Key))
	case c != nil && !w.Held:
		q.kind = writeClaim
		if s.queueClaimChecks(b, *c) { // a partitioned key table: docs/PARTITIONS.md
			b.Queue(s.part.insertKey, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body,
				w.RecoveryPoint, json.RawMessage(w.Data), c.Lease.Milliseconds(), c.origin())
			break
		}
		b.Queue(s.sql.claimInsertKey, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body,
			w.RecoveryPoint, json.RawMessage(w.Data), c.Lease.Milliseconds(), c.origin(), claimHash(c.Scope, c.Key))
	case c != nil && resp != nil:
		q.kind = writeInsertFinished
		e, _ := resp.History.args()
		b.Queue(s.onPartition(s.sql.insertFinished, f.CreatedAt), c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint,
			status, headers, body, e, c.origin())
	case c != nil && !f.CreatedAt.IsZero():
		q.kind = writeInsertKnown
		b.Queue(s.onPartition(s.sql.insertKey, f.CreatedAt), c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body,
			w.RecoveryPoint, json.RawMessage(w.Data), c.Lease.Milliseconds(), c.origin())
	case c != nil:
		q.kind = writeInsert
		b.Queue(s.pipe.insertKey, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body,
			w.RecoveryPoint, json.RawMessage(w.Data), c.Lease.Milliseconds(), c.origin())
	case w.Held && resp != nil:
		q.kind = writeLocked
		e, keep := resp.History.args()
		b.Queue(s.onPartition(s.pipe.finish, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt,
			status, headers, body, e, keep)
	case w.Held:
		q.kind = writeLocked
		b.Queue(s.onPartition(s.pipe.advance, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt,
			w.RecoveryPoint, json.RawMessage(w.Data), w.Lease.Milliseconds())
	case resp != nil:
		q.kind = writeFenced
		e, keep := resp.History.args()
		b.Queue(s.onPartition(s.sql.finish, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion,
			status, headers, body, e, keep, f.CreatedAt)
	default:
		q.kind = writeFenced
		b.Queue(s.onPartition(s.sql.advance, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion,
			w.RecoveryPoint, json.RawMessage(w.Data), w.Lease.Milliseconds(), f.CreatedAt)
	}
	if w.Flushed {
		b.Queue(sqlCommitFlushed) // last before COMMIT: a head or write that raised skips it
	}
	return q
}

// Read reads the result of the queued statements: the row's created_at where they
// return it (the claim, the locking fence, the insert of an unfinished row; zero
// otherwise) and nil, or the error that says why this attempt may not go on:
//
//   - ErrClaimBusy: another transaction holds the key's claim lock. Where the claim
//     raised (a head, the claim checks of a partitioned key table) the transaction is
//     aborted; the plain insert that claims wrote nothing and left it good.
//   - ErrClaimExists: the key row exists; the transaction is aborted.
//   - ErrLeaseLost: the row no longer has the fence; the transaction is aborted.
//   - ErrConflict: another transaction holds the row's lock (the locking fence never
//     waits, so it may be tried again).
//   - ErrNotReadCommitted: an implicit transaction ran at another isolation level and
//     raised before anything ran; the Store sends BEGIN from then on (SendExplicit).
//   - another translated error.
//
// After an error that aborted the transaction nothing queued after the statement ran.
// A write queued with KeyWrite.Flushed has the result of its second statement read
// too, whatever the first's.
func (q Queued) Read(br pgx.BatchResults) (time.Time, error) {
	at, err := q.read(br)
	if q.flushed {
		_, ferr := br.Exec()
		if err == nil && ferr != nil {
			err = fmt.Errorf("commit flushed: %w", Classify(ferr))
		}
	}
	return at, err
}

// Rechecked is Read's error for err, the error of a fence's check (a Head without
// Lock) that was sent again ahead of the statements behind it
// (pgpipe.SendRechecked).
func (q Queued) Rechecked(err error) error {
	if q.kind == headCheck {
		return fmt.Errorf("check fence again: %w", fenceErr(err))
	}
	return Classify(err)
}

// read is Read without the flushed statement's result.
func (q Queued) read(br pgx.BatchResults) (time.Time, error) {
	var at time.Time
	switch q.kind {
	case headClaim:
		return at, q.s.readClaim(br)
	case headClaimLock:
		return at, q.s.readClaimLock(br)
	case headFence:
		return q.s.readFence(br)
	case headCheck:
		if _, err := br.Exec(); err != nil {
			return at, fmt.Errorf("check fence: %w", fenceErr(err))
		}
	case writeClaim:
		return readClaimInsert(br)
	case writeInsert:
		return readInsertAt(br)
	case writeInsertFinished, writeInsertKnown:
		if _, err := br.Exec(); err != nil {
			return at, insertErr(err)
		}
	case writeFenced:
		if _, err := br.Exec(); err != nil {
			return at, fmt.Errorf("fenced update: %w", fenceErr(err))
		}
	case writeRefused:
		_, err := br.Exec()
		return at, fmt.Errorf("write key: %w", Classify(err))
	case writeLocked:
		tag, err := br.Exec()
		switch {
		case err != nil:
			return at, fmt.Errorf("write key: %w", Classify(err))
		case tag.RowsAffected() != 1: // the fence before it rules this out
			return at, fmt.Errorf("write key: %w", ErrLeaseLost)
		}
	}
	return at, nil
}

// readClaim reads a head's claim: the claim lock, then the check that no row exists.
func (s *Store) readClaim(br pgx.BatchResults) error {
	if err := s.readClaimLock(br); err != nil {
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

// readClaimLock reads a head's claim lock.
func (s *Store) readClaimLock(br pgx.BatchResults) error {
	_, err := br.Exec()
	switch {
	case err == nil:
		return nil
	case isCode(err, codeDivisionByZero):
		return fmt.Errorf("claim key: %w", ErrClaimBusy)
	}
	return fmt.Errorf("claim key: %w", s.guardErr(err))
}

// readFence reads a head's locking fence: the row's created_at.
func (s *Store) readFence(br pgx.BatchResults) (time.Time, error) {
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

// readInsertAt reads the created_at the held insert returns. It declares the time it
// scans into itself: a variable of Read's that Scan took would cost every Read an
// allocation.
func readInsertAt(br pgx.BatchResults) (time.Time, error) {
	var at time.Time
	if err := br.QueryRow().Scan(&at); err != nil {
		return time.Time{}, insertErr(err)
	}
	return at, nil
}

// readClaimInsert reads either form of the insert that claims (readClaimInsertAt):
// the row's created_at, or why the claim was lost.
func readClaimInsert(br pgx.BatchResults) (time.Time, error) {
	at, err := readClaimInsertAt(br)
	switch {
	case errors.Is(err, ErrClaimBusy), errors.Is(err, ErrClaimExists):
		return time.Time{}, err
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, fmt.Errorf("claim key: %w", ErrClaimBusy)
	case err != nil:
		return time.Time{}, insertErr(err)
	}
	return at, nil
}

// insertErr translates the error of an insert of a key row: ErrClaimExists when the
// row exists (written by something that took no claim lock).
func insertErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeUniqueViolation ||
		// Citus sends the claim's INSERT ... SELECT through the coordinator and raises a
		// shard's unique violation as an internal error.
		pgErr.Code == "XX000" && strings.HasPrefix(pgErr.Message, "duplicate key value violates unique constraint")) {
		return fmt.Errorf("insert key: %w: %w", ErrClaimExists, err)
	}
	if errors.As(err, &pgErr) && (partitionGone(pgErr) || outsidePartition(pgErr)) {
		// A held insert sent to the partition of its created_at (onPartition) found it
		// gone or not covering that time: as an insert through the key table that finds
		// no partition, nothing is written and the attempt may be retried.
		return fmt.Errorf("insert key: %w: no partition of the key table holds the new row's created_at: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("insert key: %w", Classify(err))
}

// pipeStatements are the texts of the key row's head and plain writes, qualified like
// statements.
type pipeStatements struct {
	// explicit: a batch found the session's default isolation level is not READ
	// COMMITTED, so every pipelined transaction begins with BEGIN from then on (as it
	// does on Citus: SendExplicit).
	explicit *atomic.Bool

	claimLock, claimLockFlushed, claimAbsent, fence string
	insertKey, advance, finish                      string
	// check is a Go-code tx phase's fence (Head without Lock): it locks nothing.
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

// ErrNotReadCommitted: a pipelined batch sent as an implicit transaction ran at
// another isolation level than READ COMMITTED (the session's default), and raised
// before anything of it ran. The Store sends BEGIN from then on (SendExplicit).
var ErrNotReadCommitted = errors.New("implicit transaction is not read committed")

// SendExplicit reports whether pipelined transactions must begin with BEGIN: a batch
// found the session's default isolation level is not READ COMMITTED (a head's Read
// returned ErrNotReadCommitted; it stays so for the Store's life), or s has not learnt
// that the database lacks the citus extension (CheckPartitions, or a sweep, learns
// it). On Citus a pipeline without BEGIN is no transaction across nodes: the
// coordinator's implicit transaction is not a transaction block to Citus, so each
// statement it routes to a worker commits there on its own, and a later statement's
// error rolls back only the coordinator's part. Until learnt, the strictest case.
func (s *Store) SendExplicit() bool { return s.pipe.explicit.Load() || s.learnt.citus.Load() != 1 }

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

// isCode reports whether err is a PostgreSQL error with SQLSTATE code.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
