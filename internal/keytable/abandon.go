package keytable

import (
	"context"
	"fmt"
)

// Abandon takes the key of fence f away from its holder, in the holder's own process,
// when that process gives up on the attempt (a drain whose deadline passed): the lock
// version is bumped, so that the attempt can commit nothing more should it still run;
// the lease is cleared and the key is due at once for a retry or a sweeper. lastError
// is recorded (cut to 2000 bytes) and h appended to the history. It returns
// ErrLeaseLost if the fence does not match or the key is not leased (the attempt
// already released it, or lost it).
func (s *Store) Abandon(ctx context.Context, db DBTX, f Fence, lastError string, h History) error {
	e, keep := h.args()
	tag, err := db.Exec(ctx, s.onPartition(s.sql.abandon, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, truncate(lastError, 2000), e, keep, f.CreatedAt)
	if err != nil {
		return fmt.Errorf("abandon key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("abandon key: %w", ErrLeaseLost)
	}
	return nil
}
