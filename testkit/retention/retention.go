// Package retention gives the benchmark the engine's batched retention statement on
// its own, one call a batch, so that it can measure batched deletes side by side with
// partition removal (bench/partcleanup.go) and attribute each batch's WAL to its
// transaction. A service never needs it: the engine's sweeper runs the same
// statement (engine.Start, engine.Sweep with sweeper.Config.Retention).
//
// It may import the standard library, store and the library's internal/keytable.
package retention

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/store"
)

// ExpireFinished deletes, in one statement on db, up to limit finished keys of the
// key table in the default schema that finished more than olderThan ago (by the
// database clock), oldest first, as the sweeper's cleanup does, and returns how many
// it deleted: fewer than limit means none is left. Unfinished and dead-lettered keys
// are never deleted.
func ExpireFinished(ctx context.Context, db store.DBTX, olderThan time.Duration, limit int) (int64, error) {
	return keytable.New().ExpireFinished(ctx, db, olderThan, limit)
}

// RemovePartitions is store.Store.RemovePartitions on the key table in the default
// schema, with the removal's two modes told apart for the benchmark: oneDrop drops a
// detached partition with all its indexes in one transaction (the library's removal);
// otherwise its indexes are shed one at a time, paced, before the drop (the
// experiment). trace, when not nil, is called with the name of each phase of a
// removal as it starts ("check", "detach", "recheck", "verify", "shed", "rest",
// "drop").
func RemovePartitions(ctx context.Context, db store.PartitionDB, olderThan time.Duration, oneDrop bool,
	trace func(phase string)) (store.PartitionReport, error) {
	st := keytable.New()
	st.SetRemovalOptions(!oneDrop, trace)
	return st.RemovePartitions(ctx, db, olderThan)
}

// PartitionName is the name the Store gives the partition of width w of the key table
// that begins at from (UTC): the bench makes partitions in the past by hand under the
// names the Store's removal finds.
func PartitionName(from time.Time, w time.Duration) string {
	return keytable.PartitionName(from, w)
}
