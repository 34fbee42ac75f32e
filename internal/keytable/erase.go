package keytable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The erasure of every key of a scope (a data subject's request). The keys are
// deleted a batch at a time, each batch by one statement that picks its rows by
// (scope, idempotency key) and re-checks the status on the row it deletes. Its SQL is
// in sql_operator.go.

// ScopeCount is what EraseCount found in a scope.
type ScopeCount struct {
	// Done counts the finished and dead-lettered keys.
	Done int64
	// InProgress counts the unfinished keys; Leased those of them with a live lease.
	InProgress, Leased int64
}

// EraseCount counts the keys of scope, by what EraseBatch does with them. It locks
// nothing.
func (s *Store) EraseCount(ctx context.Context, db DBTX, scope string) (ScopeCount, error) {
	var c ScopeCount
	if err := queryRow(ctx, db, []any{&c.Done, &c.InProgress, &c.Leased}, s.admin.eraseCount, scope); err != nil {
		return c, fmt.Errorf("count scope: %w", Classify(err))
	}
	return c, nil
}

// EraseBatch deletes up to limit keys of scope: finished and dead-lettered ones, and
// unfinished ones too when inProgress. It returns how many it deleted and how many of
// those were unfinished keys with a live lease. Fewer than limit deleted means none
// that it may delete was left when it ran.
func (s *Store) EraseBatch(ctx context.Context, db DBTX, scope string, inProgress bool, limit int) (deleted, leased int, err error) {
	var now time.Time
	if err := queryRow(ctx, db, []any{&now}, sqlDatabaseTime); err != nil {
		return 0, 0, fmt.Errorf("erase keys: %w", Classify(err))
	}
	rows, err := db.Query(ctx, s.admin.eraseBatch, scope, inProgress, limit, now)
	if err != nil {
		return 0, 0, fmt.Errorf("erase keys: %w", Classify(err))
	}
	live, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return 0, 0, fmt.Errorf("erase keys: %w", Classify(err))
	}
	for _, l := range live {
		if l {
			leased++
		}
	}
	return len(live), leased, nil
}
