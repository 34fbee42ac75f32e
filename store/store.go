package store

import (
	"context"
	"fmt"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Statuses of a key row.
const (
	StatusInProgress = "in_progress"
	StatusFinished   = "finished"
	StatusDead       = "dead"
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
	// LeaseLive reports whether locked_until is in the future, by the database clock.
	LeaseLive bool `db:"lease_live"`
	// LeaseLeft is how much of the lease remains, by the database clock (0 if none).
	LeaseLeftMillis int64 `db:"lease_left_ms"`
	// Response, set when Status is StatusFinished.
	ResponseStatus  *int   `db:"response_status"`
	ResponseHeaders []byte `db:"response_headers"`
	ResponseBody    []byte `db:"response_body"`
	// Inserted is true when the claim that returned this row created it.
	Inserted bool `db:"inserted"`
}

// LeaseLeft is the remaining lease as a duration.
func (r *Row) LeaseLeft() time.Duration { return time.Duration(r.LeaseLeftMillis) * time.Millisecond }

// Fence names one key row as one executor knows it: a fenced statement matches only if
// the row still has this identity and lock version and is unfinished.
type Fence struct {
	Scope       string
	Key         string
	ID          string
	LockVersion int64
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
}

// StoredResponse is a response as stored on a finished key.
type StoredResponse struct {
	Status  int
	Headers []byte // a JSON object of header name to list of values
	Body    []byte
}

// Store runs idemflow's statements. It holds no state; the zero value is ready to use.
type Store struct{}

// New returns a Store.
func New() *Store { return &Store{} }

// Lookup returns the key row, or ErrNotFound.
func (s *Store) Lookup(ctx context.Context, db DBTX, scope, key string) (*Row, error) {
	rows, err := db.Query(ctx, sqlLookup, scope, key)
	if err != nil {
		return nil, fmt.Errorf("look up key: %w", Classify(err))
	}
	return scanOne(rows, "look up key", ErrNotFound)
}

// QueueClaim adds the claim statement to b: it inserts the row, or, if (scope, key)
// exists, returns the existing row with Inserted false. Read its result with ReadClaim.
func (s *Store) QueueClaim(b *pgx.Batch, c Claim) {
	b.Queue(sqlClaim, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body, c.Lease.Milliseconds())
}

// ReadClaim reads the result of a queued claim. It returns ErrClaimRaced when a
// concurrent claim's row exists but is not visible to this statement.
func (s *Store) ReadClaim(br pgx.BatchResults) (*Row, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claim key: %w", Classify(err))
	}
	return scanOne(rows, "claim key", ErrClaimRaced)
}

// QueueAdvance adds to b the fenced update that moves the recovery point to phase and
// stores data, extending the lease. If the fence does not match, the statement raises
// and the transaction aborts. Read its result with ReadFenced.
func (s *Store) QueueAdvance(b *pgx.Batch, f Fence, phase string, data []byte, lease time.Duration) {
	b.Queue(sqlAdvance, f.Scope, f.Key, f.ID, f.LockVersion, phase, data, lease.Milliseconds())
}

// QueueFinish adds to b the fenced update that stores the response and marks the key
// finished. Like QueueAdvance it raises when the fence does not match.
func (s *Store) QueueFinish(b *pgx.Batch, f Fence, data []byte, resp StoredResponse) {
	b.Queue(sqlFinish, f.Scope, f.Key, f.ID, f.LockVersion, data, resp.Status, resp.Headers, resp.Body)
}

// ReadFenced reads the result of a queued advance or finish: nil, ErrLeaseLost, or
// another translated error.
func (s *Store) ReadFenced(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("fenced update: %w", Classify(err))
	}
	return nil
}

// Finish stores the response and marks the key finished, as one statement outside any
// phase transaction. It returns ErrLeaseLost if the fence does not match.
func (s *Store) Finish(ctx context.Context, db DBTX, f Fence, data []byte, resp StoredResponse) error {
	if _, err := db.Exec(ctx, sqlFinish, f.Scope, f.Key, f.ID, f.LockVersion, data, resp.Status, resp.Headers, resp.Body); err != nil {
		return fmt.Errorf("finish key: %w", Classify(err))
	}
	return nil
}

// Release gives up the lease after a transient failure: the recovery point and phase
// data are set to what is durable in the caller's view (it may carry a call phase's
// result forward), the error is recorded, and the key is due again after retryIn. It
// returns ErrLeaseLost if the fence does not match.
func (s *Store) Release(ctx context.Context, db DBTX, f Fence, recoveryPoint string, data []byte, lastErr string, retryIn time.Duration) error {
	tag, err := db.Exec(ctx, sqlRelease, f.Scope, f.Key, f.ID, f.LockVersion, recoveryPoint, data, truncate(lastErr, 2000), retryIn.Milliseconds())
	if err != nil {
		return fmt.Errorf("release key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("release key: %w", ErrLeaseLost)
	}
	return nil
}

// Takeover takes the lease of an unfinished key whose lease expired or was released,
// bumping its lock version and attempt count. id and seenVersion are the row as the
// caller last read it; if the row changed since, or its lease is live, Takeover
// returns ErrNotTaken and changes nothing.
func (s *Store) Takeover(ctx context.Context, db DBTX, scope, key, id string, seenVersion int64, lease time.Duration) (*Row, error) {
	rows, err := db.Query(ctx, sqlTakeover, scope, key, id, seenVersion, lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("take over key: %w", Classify(err))
	}
	return scanOne(rows, "take over key", ErrNotTaken)
}

func scanOne(rows pgx.Rows, op string, none error) (*Row, error) {
	var r Row
	if err := pgxscan.ScanOne(&r, rows); err != nil {
		if pgxscan.NotFound(err) {
			return nil, fmt.Errorf("%s: %w", op, none)
		}
		return nil, fmt.Errorf("%s: %w", op, Classify(err))
	}
	return &r, nil
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

// IsCommitted reports whether a batch ending in COMMIT committed, given its tag.
func IsCommitted(tag pgconn.CommandTag) bool { return tag.String() == "COMMIT" }
