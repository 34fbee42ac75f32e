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

// EraseScope erases the keys of scope: the finished and dead-lettered ones, and the
// unfinished ones too when force, batch keys a statement until none is left. It
// returns how many it erased, how many of those were unfinished keys with a live lease
// (fenced), and, without force, how many unfinished keys it left. dryRun erases
// nothing: it counts, in one statement that locks nothing, what would be erased,
// fenced and left. After an error, what was erased so far is returned with it.
func (s *Store) EraseScope(ctx context.Context, db DBTX, scope string, force, dryRun bool, batch int) (erased, fenced, left int64, err error) {
	if dryRun {
		done, inProgress, leased, err := s.eraseCount(ctx, db, scope)
		if err != nil {
			return 0, 0, 0, err
		}
		if force {
			return done + inProgress, leased, 0, nil
		}
		return done, 0, inProgress, nil
	}
	for {
		n, leased, err := s.eraseBatch(ctx, db, scope, force, batch)
		erased += int64(n)
		fenced += int64(leased)
		if err != nil {
			return erased, fenced, 0, err
		}
		if n < batch {
			break
		}
	}
	if !force {
		_, inProgress, _, err := s.eraseCount(ctx, db, scope)
		if err != nil {
			return erased, fenced, 0, err
		}
		left = inProgress
	}
	return erased, fenced, left, nil
}

// eraseCount counts the keys of scope: finished and dead-lettered ones (done),
// unfinished ones, and those of them with a live lease. It locks nothing.
func (s *Store) eraseCount(ctx context.Context, db DBTX, scope string) (done, inProgress, leased int64, err error) {
	if err := queryRow(ctx, db, []any{&done, &inProgress, &leased}, s.admin.eraseCount, scope); err != nil {
		return 0, 0, 0, fmt.Errorf("count scope: %w", Classify(err))
	}
	return done, inProgress, leased, nil
}

// eraseBatch deletes up to limit keys of scope: finished and dead-lettered ones, and
// unfinished ones too when inProgress. It returns how many it deleted and how many of
// those were unfinished keys with a live lease. Fewer than limit deleted means none
// that it may delete was left when it ran.
func (s *Store) eraseBatch(ctx context.Context, db DBTX, scope string, inProgress bool, limit int) (deleted, leased int, err error) {
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
