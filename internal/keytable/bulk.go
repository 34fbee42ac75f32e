package keytable

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Operators' actions on many keys, and the cancel of one. A bulk action never changes
// rows in one statement: a scan reads, without locking, a page of the keys that match
// a filter, and each key is then acted on by a statement of its own that re-checks the
// filter and the key's status on the row it updates, so that a key that changed since
// the scan (a live attempt advanced or finished it) is left alone.

// Filter selects the keys of a bulk action. Empty fields match every key.
type Filter struct {
	Flow, Scope, RecoveryPoint string
	// ErrorContains matches keys whose last error contains it.
	ErrorContains string
}

func (f Filter) args() []any { return []any{f.Flow, f.Scope, f.RecoveryPoint, f.ErrorContains} }

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
WHERE scope = $1 AND idempotency_key = $2 AND status = 'dead' AND ` + bulkFilter(5)

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

// BulkKey is a key a bulk scan found, and its place in the scan's order.
type BulkKey struct {
	Scope, Key, Flow string
	CreatedAt        time.Time
}

// BulkScan returns up to limit keys of status (StatusDead or StatusInProgress)
// matching f, in claim order after the key after (nil: from the first). It locks
// nothing.
func (s *Store) BulkScan(ctx context.Context, db DBTX, status string, f Filter, after *BulkKey, limit int) ([]BulkKey, error) {
	if status != StatusDead && status != StatusInProgress {
		return nil, fmt.Errorf("scan keys: %w: %q", ErrUnknownStatus, status)
	}
	from := BulkKey{CreatedAt: time.Unix(0, 0).UTC()}
	if after != nil {
		from = *after
	}
	args := append(append([]any{status}, f.args()...), from.CreatedAt, from.Scope, from.Key, limit)
	rows, err := db.Query(ctx, s.admin.bulkScan, args...)
	if err != nil {
		return nil, fmt.Errorf("scan keys: %w", Classify(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BulkKey, error) {
		var k BulkKey
		err := r.Scan(&k.Scope, &k.Key, &k.Flow, &k.CreatedAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("scan keys: %w", Classify(err))
	}
	return out, nil
}

// BulkRedrive is Redrive of one key that still matches f. It returns ErrNotFound when
// no dead-lettered key (scope, key) matching f exists.
func (s *Store) BulkRedrive(ctx context.Context, db DBTX, scope, key string, f Filter, h History) error {
	e, keep := h.args()
	args := append([]any{scope, key, e, keep}, f.args()...)
	return s.execOne(ctx, db, "re-drive key", s.admin.bulkRedrive, args)
}

// BulkRelease is ReleaseKey of one key in progress that still matches f (keep history
// entries kept). It returns ErrNotFound when no such key exists.
func (s *Store) BulkRelease(ctx context.Context, db DBTX, scope, key string, f Filter, keep int) error {
	args := append([]any{scope, key, max(keep, 0)}, f.args()...)
	return s.execOne(ctx, db, "release key", s.admin.bulkRelease, args)
}

// Cancel is what CancelKey stores, and the row it expects.
type Cancel struct {
	ID            string
	LockVersion   int64
	RecoveryPoint string
	// CreatedAt is the row's created_at (Row.CreatedAt).
	CreatedAt time.Time
	// Response is the answer stored; its History the operator's entry.
	Response StoredResponse
}

// CancelKey finishes the key (scope, key) with c.Response if its row is still the one
// c describes (same id, lock version and recovery point, in progress or dead-lettered),
// bumping its lock version. It returns ErrNotFound when it is not.
func (s *Store) CancelKey(ctx context.Context, db DBTX, scope, key string, c Cancel) error {
	e, keep := c.Response.History.args()
	body := c.Response.Body
	if body == nil {
		body = []byte{}
	}
	args := []any{scope, key, c.ID, c.LockVersion, c.RecoveryPoint, c.Response.Status,
		json.RawMessage(c.Response.Headers), body, e, keep, c.CreatedAt}
	return s.execOne(ctx, db, "cancel key", s.admin.cancel, args)
}

// execOne runs a statement on one key: ErrNotFound unless it changed exactly one row.
func (s *Store) execOne(ctx context.Context, db DBTX, what, sql string, args []any) error {
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return nil
}
