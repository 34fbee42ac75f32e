package sweeper

import "time"

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
	// concurrent detaches and drops); DropLock is the longest a transaction of the
	// removal held a detached table's lock (its check for live keys, its drop), the
	// most a live statement planned before the detach could have waited on it; Stall, on Citus only, the longest plain detach, the most a live
	// statement on the key table may have waited (store.PartitionReport).
	Removal, DropLock, Stall time.Duration
}
