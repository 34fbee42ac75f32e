package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/store"
)

// PartitionStats is what a pass did to a partitioned key table (docs/PARTITIONS.md).
// All zero when the key table is not partitioned.
type PartitionStats struct {
	// Ahead is how many partitions exist ahead of now: the metric to watch. The sweeper
	// logs a warning when fewer than half of the default (a week, for day partitions)
	// exist: a claim whose creation time has no partition fails (retryably).
	Ahead int
	// Created and Removed count partitions created ahead and removed past retention;
	// Kept counts partitions past retention kept because they hold an unfinished or
	// dead-lettered key.
	Created, Removed, Kept int
	// Removal is how long removing the partitions past retention took (their checks,
	// concurrent detaches and drops); DropLock is the longest a drop held its detached
	// table's lock, the most a live statement planned before the detach could have
	// waited on it; Stall, on Citus only, the longest plain detach, the most a live
	// statement on the key table may have waited (store.PartitionReport).
	Removal, DropLock, Stall time.Duration
}

// partitionState is what a sweeper remembers between passes about partitions.
type partitionState struct {
	warned atomic.Bool // the low-partitions warning was logged and not cleared since
}

// maintainPartitions runs the partition maintenance step of a pass, if the key table
// is partitioned. Retention counts from a key's creation on this
// layout: a partition is removed once its newest possible row is Config.Retention old.
func (s *Sweeper) maintainPartitions(ctx context.Context, st *Stats) error {
	r, err := s.engine.MaintainPartitions(ctx, s.cfg.Retention)
	if errors.Is(err, store.ErrNotPartitioned) {
		return nil
	}
	st.Partitions = PartitionStats{Ahead: r.Ahead, Created: r.Created, Removed: r.Removed, Kept: r.Kept,
		Removal: r.Removal, DropLock: r.DropLock, Stall: r.Stall}
	if r.Removed > 0 {
		s.cfg.Logger.InfoContext(ctx, "sweeper: removed key table partitions",
			slog.Int("removed", r.Removed), slog.Int("kept", r.Kept), slog.Duration("took", r.Removal),
			slog.Duration("drop_lock", r.DropLock), slog.Duration("stall", r.Stall))
	}
	switch {
	case r.Low() && !s.partitions.warned.Swap(true):
		s.cfg.Logger.WarnContext(ctx, "sweeper: few key table partitions ahead",
			slog.Int("ahead", r.Ahead), slog.Int("want", r.Want))
	case !r.Low() && r.Want > 0:
		s.partitions.warned.Store(false)
	}
	if err != nil {
		return fmt.Errorf("maintain partitions: %w", err)
	}
	return nil
}
