package keytable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/vocab"
)

// Operators' actions on many keys, and the cancel of one. A bulk action never changes
// rows in one statement: a scan reads, without locking, a page of the keys that match
// a filter, and each key is then acted on by a statement of its own that re-checks the
// filter and the key's status on the row it updates, so that a key that changed since
// the scan (a live attempt advanced or finished it) is left alone. Their SQL is in
// sql_operator.go.

// Filter selects the keys of a bulk action. Empty fields match every key.
type Filter struct {
	Flow, Scope, RecoveryPoint string
	// ErrorContains matches keys whose last error contains it.
	ErrorContains string
}

func (f Filter) args() []any { return []any{f.Flow, f.Scope, f.RecoveryPoint, f.ErrorContains} }

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
		return nil, fmt.Errorf("scan keys: %w: %q", vocab.ErrUnknownStatus, status)
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
	if !c.Response.storable() {
		return fmt.Errorf("cancel key: %w: response status %d is never stored", errInvalid, c.Response.Status)
	}
	return s.execOne(ctx, db, "cancel key", s.admin.cancel, c.args(scope, key))
}

// args are the arguments of the cancel's statements (sqlCancel, sqlCancelFenced).
func (c *Cancel) args(scope, key string) []any {
	e, keep := c.Response.History.args()
	status, headers, body := c.Response.columns()
	return []any{scope, key, c.ID, c.LockVersion, c.RecoveryPoint, status, headers, body, e, keep, c.CreatedAt}
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
