package keytable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Statuses of a key row the engine branches on. The third, "in_progress", is every
// other row's.
const (
	StatusFinished = "finished"
	StatusDead     = "dead"
)

// DBTX runs statements; *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Row is a key row as the engine sees it.
type Row struct {
	Scope         string  `db:"scope"`
	Key           string  `db:"idempotency_key"`
	ID            string  `db:"id"`
	Flow          string  `db:"flow"`
	Method        string  `db:"method"`
	Route         string  `db:"route"`
	Fingerprint   []byte  `db:"fingerprint"`
	RequestBody   []byte  `db:"request_body"`
	RecoveryPoint string  `db:"recovery_point"`
	PhaseData     []byte  `db:"phase_data"`
	Status        string  `db:"status"`
	LockVersion   int64   `db:"lock_version"`
	Attempts      int     `db:"attempts"`
	LastError     *string `db:"last_error"`
	// Origin is what the engine's Origin hook gave when the key was claimed; empty if
	// none.
	Origin string `db:"origin"`
	// CreatedAt is when the key row was inserted (its inserting transaction's start,
	// by the database clock, to the microsecond): the last part of the row's identity,
	// which names its partition on a partitioned key table (docs/PARTITIONS.md).
	CreatedAt time.Time `db:"created_at"`
	// LeaseLive reports whether locked_until is in the future, by the database clock.
	LeaseLive bool `db:"lease_live"`
	// LeaseLeftMillis is how much of the lease remains in milliseconds, by the
	// database clock (0 if none); LeaseLeft is the same as a duration.
	LeaseLeftMillis int64 `db:"lease_left_ms"`
	// Response, set when Status is StatusFinished.
	ResponseStatus  *int   `db:"response_status"`
	ResponseHeaders []byte `db:"response_headers"`
	ResponseBody    []byte `db:"response_body"`
}

// LeaseLeft is the remaining lease as a duration.
func (r *Row) LeaseLeft() time.Duration { return time.Duration(r.LeaseLeftMillis) * time.Millisecond }

// Fence is the fence of the row as it was read.
func (r *Row) Fence() Fence {
	return Fence{Scope: r.Scope, Key: r.Key, ID: r.ID, LockVersion: r.LockVersion, CreatedAt: r.CreatedAt}
}

// Fence names one key row as one executor knows it: a fenced statement matches only if
// the row still has this identity and lock version and is unfinished.
type Fence struct {
	Scope       string
	Key         string
	ID          string
	LockVersion int64
	// CreatedAt is the row's created_at (Row.CreatedAt, or what the claim that
	// inserted it read: the Read of a ClaimLook, a KeyWrite or a Head). Every fenced statement
	// matches it: on a partitioned key table it prunes the statement to the row's
	// partition.
	CreatedAt time.Time
}

// Claim is a new key row.
type Claim struct {
	Scope       string
	Key         string
	ID          string // a fresh UUID chosen by the caller
	Flow        string
	Method      string
	Route       string
	Fingerprint []byte
	Body        []byte
	Lease       time.Duration
	// Origin is stored with the row (see Row.Origin); empty stores none.
	Origin string
}

// origin is the argument of c's origin: NULL when empty.
func (c *Claim) origin() any {
	if c.Origin == "" {
		return nil
	}
	return c.Origin
}

// StoredResponse is a response as stored on a finished key.
type StoredResponse struct {
	Status  int
	Headers []byte // a JSON object of header name to list of values
	Body    []byte
	// History is the finishing attempt's entry, appended to the key's history as the
	// response is stored.
	History History
}

// storable reports whether r may be stored: a status of 100-499 (a 5xx is transient
// by definition, never an answer to replay). The engine refuses any other before it
// writes (attempt.Exec.storable, workflow.Engine.CancelKey); this is the table's own
// guard since migration 004 dropped the CHECK constraint that was (sqlRefuseResponse).
func (r *StoredResponse) storable() bool { return r.Status >= 100 && r.Status <= 499 }

// columns are r's response columns as the statements that finish a key write them:
// headers and body are never NULL (a finished row carries its whole response), an
// absent one is written empty.
func (r *StoredResponse) columns() (status int, headers json.RawMessage, body []byte) {
	headers, body = r.Headers, r.Body
	if headers == nil {
		headers = json.RawMessage(`{}`)
	}
	if body == nil {
		body = []byte{}
	}
	return r.Status, headers, body
}

// Release is what Release writes on a key row after a transient failure.
type Release struct {
	// RecoveryPoint and Data are what is durable in the caller's view (it may carry a
	// call phase's result forward).
	RecoveryPoint string
	Data          []byte
	// LastError is recorded on the row, cut to 2000 bytes.
	LastError string
	// RetryIn is how long until the key is due again. Zero means at once.
	RetryIn time.Duration
	// Stored is the recovery point the caller last knew the row to hold. The release
	// matches only while it still does (see sqlRelease).
	Stored string
	// History is the attempt's entry.
	History History
}

// Store sends idemflow's statements on the key table. It holds their texts, built once
// by New or NewWith, so that what varies between stores (the schema) is applied
// once rather than on every call. The zero Store is not usable.
type Store struct {
	sql    statements
	admin  adminStatements
	scan   Scan
	learnt scanState
	part   partStatements // the partitioned layout's (partition.go)
	pipe   pipeStatements // pipelined phases' (pipeline.go)
	remove removalOptions // how RemovePartitions removes a detached table (partition_maint.go)
}

// New returns a Store of the statements in sql.go, on the key table of the current
// schema (the first schema of the connection's search_path that exists).
func New() *Store {
	return &Store{sql: newStatements(""), admin: newAdminStatements(""), part: newPartStatements(""), pipe: newPipeStatements("")}
}

// newInSchema returns a Store whose statements name the key table in schema, quoted,
// whatever the connection's search_path. An empty schema is New's current schema. It
// fails on a name PostgreSQL cannot hold: longer than 63 bytes or with a NUL byte.
func newInSchema(schema string) (*Store, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	return &Store{sql: newStatements(schema), admin: newAdminStatements(schema), part: newPartStatements(schema), pipe: newPipeStatements(schema)}, nil
}

// ValidateSchema reports whether schema can name a PostgreSQL schema as it is: at most
// 63 bytes (PostgreSQL would silently cut a longer name) and no NUL byte. The empty
// name, meaning the current schema, is valid.
func ValidateSchema(schema string) error {
	switch {
	case len(schema) > 63:
		return fmt.Errorf("schema name %q is longer than 63 bytes", schema)
	case strings.IndexByte(schema, 0) >= 0:
		return fmt.Errorf("schema name %q contains a NUL byte", schema)
	}
	return nil
}

// Lookup returns the key row, or ErrNotFound.
func (s *Store) Lookup(ctx context.Context, db DBTX, scope, key string) (*Row, error) {
	if row, ok, err := s.lookupCurrent(ctx, db, scope, key); ok {
		return row, err
	}
	rows, err := db.Query(ctx, s.lookupSQL(), scope, key)
	if err != nil {
		return nil, fmt.Errorf("look up key: %w", Classify(err))
	}
	return scanOne(rows, "look up key", errLookUpNone)
}

// lookupCurrent is Lookup's first statement when s addresses partitions by name and
// db runs it outside a transaction: the look-up of the partition that holds now. ok
// is false when it did not answer (not sent, the key is not there, or the partition
// does not exist): Lookup then looks in every partition.
func (s *Store) lookupCurrent(ctx context.Context, db DBTX, scope, key string) (*Row, bool, error) {
	row, err := s.lookupCurrentOnly(ctx, db, scope, key)
	switch {
	case err == nil:
		return row, true, nil
	case errors.Is(err, ErrNotFound), errors.Is(err, errCurrentGone):
		return nil, false, nil
	}
	return nil, true, err
}

// errCurrentGone: the current partition's look-up was not sent (s does not address
// partitions, or db is in a transaction) or its partition does not exist.
var errCurrentGone = errors.New("no current partition to look in")

// lookupCurrentOnly is the look-up of the partition that holds now: the row,
// ErrNotFound when it is not there, errCurrentGone when the statement was not sent or
// its partition does not exist, or another error.
func (s *Store) lookupCurrentOnly(ctx context.Context, db DBTX, scope, key string) (*Row, error) {
	sql := s.currentPartitionLookup(db)
	if sql == "" {
		return nil, errCurrentGone
	}
	rows, err := db.Query(ctx, sql, scope, key)
	if err == nil {
		var row *Row
		row, err = scanOne(rows, "look up key", errLookUpNone)
		if err == nil || errors.Is(err, ErrNotFound) {
			return row, err
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && partitionGone(pgErr) {
		return nil, errCurrentGone
	}
	return nil, fmt.Errorf("look up key: %w", Classify(err))
}

// LookupRecent is the look-up before a claim: Lookup, except that on a partitioned
// key table whose partitions s addresses by name, and outside a transaction, it reads
// the current partition alone (docs/PARTITIONS.md, "The look-up before a claim"). A
// replay of a recent key reads one table; a new key is not looked for in every past
// partition twice. ErrNotFound then means only that the key is not in the current
// partition: the caller must claim the key with a claim that looks in every partition
// under the claim lock (every claim at READ COMMITTED does: phaseTx's look-up, the
// pipelined claim's check, and the insert that claims, QueueKeyWrite, on this layout) and take the row that
// claim finds. Where s does not address partitions (a plain table, Citus, the layout
// not learnt yet, in a transaction), or the current partition does not exist, it is
// Lookup.
func (s *Store) LookupRecent(ctx context.Context, db DBTX, scope, key string) (*Row, error) {
	row, err := s.lookupCurrentOnly(ctx, db, scope, key)
	if errors.Is(err, errCurrentGone) {
		return s.Lookup(ctx, db, scope, key)
	}
	return row, err
}

// ClaimHash is claimHash, for code outside the package that must hold a key's claim
// lock itself (tests that make a copy lose): the lock's id is ClaimHash(scope, key)
// XOR the key table's oid, as claimLockID writes it.
func ClaimHash(scope, key string) int64 { return claimHash(scope, key) }

// claimHash is the hash of a key from which its claim lock's id is made: a 64-bit
// FNV-1a hash of the scope and the key. The lock's id mixes in the key table's oid
// (see the claim statements), so two keys share a lock only by a hash collision, which
// costs one of them a 409, never a wrong answer.
func claimHash(scope, key string) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, part := range [...]string{"idemflow\x00", scope, "\x00", key} {
		for i := 0; i < len(part); i++ {
			h ^= uint64(part[i])
			h *= prime
		}
	}
	return int64(h)
}

// QueueClaimLook adds to b a new key's claim in its own round trip: the statement that
// takes the key's claim lock if it is free, then the look-up of the key's row under
// it. Read their results with the ClaimLook it returns.
func (s *Store) QueueClaimLook(b *pgx.Batch, c Claim) ClaimLook {
	b.Queue(s.sql.claimLock, claimHash(c.Scope, c.Key))
	b.Queue(s.lookupSQL(), c.Scope, c.Key)
	return ClaimLook{}
}

// ClaimLook reads the results of what QueueClaimLook queued.
type ClaimLook struct{}

// Read reads whether the claim lock was taken, the transaction's start (the
// created_at of a key row the transaction inserts, Fence.CreatedAt) and the key's
// row, or ErrNotFound. The key is the claim's when the lock was taken and no row was
// found; another attempt is claiming it when neither.
func (ClaimLook) Read(br pgx.BatchResults) (locked bool, at time.Time, row *Row, err error) {
	if err := br.QueryRow().Scan(&locked, &at); err != nil {
		return false, time.Time{}, nil, fmt.Errorf("claim key: %w", Classify(err))
	}
	rows, err := br.Query()
	if err != nil {
		return locked, at, nil, fmt.Errorf("look up key: %w", Classify(err))
	}
	row, err = scanOne(rows, "look up key", errLookUpNone)
	return locked, at, row, err
}

// Release releases a key after a transient failure: the lease is cleared, the recovery
// point, phase data and last error are set from r, r.History is appended, and the key
// is due again after r.RetryIn. It returns ErrLeaseLost if the fence does not match.
func (s *Store) Release(ctx context.Context, db DBTX, f Fence, r Release) error {
	e, keep := r.History.args()
	tag, err := db.Exec(ctx, s.onPartition(s.sql.release, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, r.RecoveryPoint, json.RawMessage(r.Data), truncate(r.LastError, 2000), r.RetryIn.Milliseconds(), r.Stored, e, keep, f.CreatedAt)
	if err != nil {
		return fmt.Errorf("release key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("release key: %w", ErrLeaseLost)
	}
	return nil
}

// Takeover takes the lease of an unfinished key whose lease expired or was cleared,
// bumping its lock version and attempt count, and sets a lease of lease. seen is the
// fence of the row as the caller last read it (Row.Fence); if the row changed since,
// or its lease is live, Takeover returns ErrNotTaken and changes nothing. An expired
// lease's attempt is recorded in the history as abandoned, keeping the newest keep
// entries (0: history is off).
func (s *Store) Takeover(ctx context.Context, db DBTX, seen Fence, lease time.Duration, keep int) (*Row, error) {
	rows, err := db.Query(ctx, s.onPartition(s.sql.takeover, seen.CreatedAt), seen.Scope, seen.Key, seen.ID, seen.LockVersion, lease.Milliseconds(), max(keep, 0), seen.CreatedAt)
	if err != nil {
		return nil, fmt.Errorf("take over key: %w", Classify(err))
	}
	return scanOne(rows, "take over key", errTakeOverNone)
}

// The errors of scanOne when there is no row (none), made once: the look-up of every
// fresh key finds none.
var (
	errLookUpNone   = fmt.Errorf("look up key: %w", ErrNotFound)
	errTakeOverNone = fmt.Errorf("take over key: %w", ErrNotTaken)
	errTakeNone     = fmt.Errorf("take key: %w", ErrNotTaken)
	errRedriveNone  = fmt.Errorf("re-drive key: %w", ErrNotFound)
)

// scanOne reads the one row of rows (or returns none, a whole error, when there is
// none), with the columns of
// rowColumns in their order. It scans by position rather than by name: it is on the
// path of every request, a replay's only work, and reflection costs as much there as
// the rest of the decoding; and it decodes the raw values itself when it can
// (decodeRow, rowdecode.go), which saves most of the allocations of a scan.
func scanOne(rows pgx.Rows, op string, none error) (*Row, error) {
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", op, Classify(err))
		}
		return nil, none
	}
	if r, ok := decodeRow(rows); ok {
		return finishOne(rows, op, r)
	}
	var r Row
	err := rows.Scan(&r.Scope, &r.Key, &r.ID, &r.Flow, &r.Method, &r.Route, &r.Fingerprint, &r.RequestBody,
		&r.RecoveryPoint, &r.PhaseData, &r.Status, &r.LockVersion, &r.Attempts, &r.LastError, &r.Origin, &r.CreatedAt,
		&r.LeaseLive, &r.LeaseLeftMillis, &r.ResponseStatus, &r.ResponseHeaders, &r.ResponseBody)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, Classify(err))
	}
	return finishOne(rows, op, &r)
}

// finishOne closes rows after their one row r, and returns r or the error of rows.
func finishOne(rows pgx.Rows, op string, r *Row) (*Row, error) {
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, Classify(err))
	}
	return r, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// cut on a rune boundary so the text stays valid UTF-8
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
