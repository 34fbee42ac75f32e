package idemflowtest

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier reads rows; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Execer runs statements; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Key is what the key table says about one key.
type Key struct {
	Scope, Key    string
	ID            string // the row's identity, from which derived keys are built
	Flow          string
	Status        string // in_progress, finished or dead
	RecoveryPoint string // the last durable phase; "started" before any, "finished" after
	LockVersion   int64
	Leased        bool // a lease is live, by the database clock
	Attempts      int
	LastError     string
	// The stored response of a finished key.
	ResponseStatus  int
	ResponseHeaders []byte // JSON object of header name to values
	ResponseBody    []byte
}

// LookupKey reads a key's row; false if there is none.
func LookupKey(t testing.TB, db Querier, scope, key string) (Key, bool) {
	t.Helper()
	k := Key{Scope: scope, Key: key}
	var status *int
	var lastError *string
	err := db.QueryRow(context.Background(), `
		SELECT id::text, flow, status, recovery_point, lock_version,
			coalesce(locked_until > statement_timestamp(), false), attempts, last_error,
			response_status, response_headers::text::bytea, response_body
		FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).
		Scan(&k.ID, &k.Flow, &k.Status, &k.RecoveryPoint, &k.LockVersion, &k.Leased, &k.Attempts, &lastError,
			&status, &k.ResponseHeaders, &k.ResponseBody)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, false
	}
	if err != nil {
		t.Fatalf("idemflowtest: look up key %q/%q: %v", scope, key, err)
	}
	if status != nil {
		k.ResponseStatus = *status
	}
	if lastError != nil {
		k.LastError = *lastError
	}
	return k, true
}

// RequireKey is LookupKey that fails the test if the key has no row.
func RequireKey(t testing.TB, db Querier, scope, key string) Key {
	t.Helper()
	k, ok := LookupKey(t, db, scope, key)
	if !ok {
		t.Fatalf("idemflowtest: key %q/%q has no row", scope, key)
	}
	return k
}

// RequireFinished fails the test unless the key is finished, and returns its row.
func RequireFinished(t testing.TB, db Querier, scope, key string) Key {
	t.Helper()
	k := RequireKey(t, db, scope, key)
	if k.Status != "finished" {
		t.Fatalf("idemflowtest: key %q/%q is %s at %s, not finished (last error: %q)", scope, key, k.Status, k.RecoveryPoint, k.LastError)
	}
	return k
}

// RequireInProgressAt fails the test unless the key is in progress with recovery point
// phase (phases.Started before any phase is durable), and returns its row.
func RequireInProgressAt(t testing.TB, db Querier, scope, key, phase string) Key {
	t.Helper()
	k := RequireKey(t, db, scope, key)
	if k.Status != "in_progress" || k.RecoveryPoint != phase {
		t.Fatalf("idemflowtest: key %q/%q is %s at %s, want in_progress at %s", scope, key, k.Status, k.RecoveryPoint, phase)
	}
	return k
}

// RequireDeadLettered fails the test unless the key was given up on, and returns its
// row (LastError says why).
func RequireDeadLettered(t testing.TB, db Querier, scope, key string) Key {
	t.Helper()
	k := RequireKey(t, db, scope, key)
	if k.Status != "dead" {
		t.Fatalf("idemflowtest: key %q/%q is %s at %s, not dead-lettered", scope, key, k.Status, k.RecoveryPoint)
	}
	return k
}

// expireSQL moves the lease, backoff and grace period of unfinished keys into the past.
// A lease is moved to a constant long past: Citus refuses the clock inside a CASE in an
// UPDATE on a distributed table. The creation time goes back an hour; on a partitioned
// key table that can leave the row's partition, which fails with no partition for the
// row (23514) when the key was created in the first hour of its partition and no
// partition lies behind it. expire then sends expireInPartitionSQL.
const expireSQL = `
	UPDATE idemflow_keys
	SET locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END,
		next_attempt_at = statement_timestamp() - interval '1 millisecond',
		created_at = least(created_at, statement_timestamp() - interval '1 hour')
	WHERE status = 'in_progress'`

// expireInPartitionSQL is expireSQL moving the creation time back an hour or to the
// start of the row's partition, whichever is later, so that the row stays where it is.
const expireInPartitionSQL = `
	UPDATE idemflow_keys
	SET locked_until = CASE WHEN locked_until IS NULL THEN NULL ELSE timestamptz '2000-01-01 00:00:00+00' END,
		next_attempt_at = statement_timestamp() - interval '1 millisecond',
		created_at = least(created_at, greatest(statement_timestamp() - interval '1 hour', (
			SELECT substring(pg_get_expr(c.relpartbound, 0) FROM 'FROM \(''([^'']*)''\)')::timestamptz
			FROM pg_class c WHERE c.oid = idemflow_keys.tableoid)))
	WHERE status = 'in_progress'`

// expire runs expireSQL with the condition where, falling back to
// expireInPartitionSQL when the row would leave its partition.
func expire(db Execer, where string, args ...any) (pgconn.CommandTag, error) {
	ctx := context.Background()
	tag, err := db.Exec(ctx, expireSQL+where, args...)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" {
		return db.Exec(ctx, expireInPartitionSQL+where, args...)
	}
	return tag, err
}

// ExpireLease moves an unfinished key's lease, its backoff and its grace period into the
// past by the database clock, as if they had all run out: the next retry takes the key
// over and the next sweeper pass takes it, at once, without the test waiting. It
// reports whether the key had an unfinished row.
func ExpireLease(t testing.TB, db Execer, scope, key string) bool {
	t.Helper()
	tag, err := expire(db, ` AND scope = $1 AND idempotency_key = $2`, scope, key)
	if err != nil {
		t.Fatalf("idemflowtest: expire the lease of %q/%q: %v", scope, key, err)
	}
	return tag.RowsAffected() == 1
}

// ExpireAll is ExpireLease for every unfinished key, and returns how many there were.
func ExpireAll(t testing.TB, db Execer) int64 {
	t.Helper()
	tag, err := expire(db, "")
	if err != nil {
		t.Fatalf("idemflowtest: expire all leases: %v", err)
	}
	return tag.RowsAffected()
}
