package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
)

// PartitionerConfig is a Partitioner's settings.
type PartitionerConfig struct {
	// Retention is the finished keys' retention, counted on this layout from a key's
	// creation: a partition is removed once its newest possible row is Retention old
	// (and it holds no unfinished or dead-lettered key). Not positive: none is removed.
	Retention time.Duration
	// RemoveAt, when not nil, says whether the database clock's time is in the window in
	// which partitions may be removed (SweeperConfig.PartitionRemoval.Contains, true all
	// day without a window); outside it a step only creates partitions ahead.
	RemoveAt func(time.Time) bool
}

// Partitioner maintains a partitioned key table (docs/PARTITIONS.md): it creates
// partitions ahead and removes those past retention. On a key table that is not
// partitioned it does nothing, and after the first pass it does not ask again.
type Partitioner struct {
	Env    *Env
	Config PartitionerConfig
	// Warned is the engine's: the low-partitions warning was logged and not cleared
	// since, so that every pass of every sweeper of the engine does not log it again.
	Warned *atomic.Bool
}

// RunOnce runs one maintenance step on one connection of the pool (see
// keytable.Store.MaintainPartitions) and logs what it removed and, once until it is
// cleared, that few partitions exist ahead. On a key table that is not partitioned it
// returns a zero report and no error.
func (s *Partitioner) RunOnce(ctx context.Context) (keytable.PartitionReport, error) {
	r, err := s.maintain(ctx)
	if errors.Is(err, keytable.ErrNotPartitioned) {
		return keytable.PartitionReport{}, nil
	}
	log := s.Env.Logger
	if r.Removed > 0 || r.Contended > 0 {
		log.InfoContext(ctx, "sweeper: removed key table partitions",
			slog.Int("removed", r.Removed), slog.Int("kept", r.Kept), slog.Int("contended", r.Contended),
			slog.Duration("took", r.Removal), slog.Duration("drop_lock", r.DropLock), slog.Duration("stall", r.Stall))
	}
	switch {
	case r.Low() && !s.Warned.Swap(true):
		log.WarnContext(ctx, "sweeper: few key table partitions ahead",
			slog.Int("ahead", r.Ahead), slog.Int("want", r.Want))
	case !r.Low() && r.Want > 0:
		s.Warned.Store(false)
	}
	if err != nil {
		return r, fmt.Errorf("maintain partitions: %w", err)
	}
	return r, nil
}

// maintain runs one maintenance step of a partitioned key table on one connection of
// the pool: partitions created ahead, partitions past retention removed. It returns
// keytable.ErrNotPartitioned, after asking once and without a connection afterwards,
// when the key table is not partitioned.
func (s *Partitioner) maintain(ctx context.Context) (keytable.PartitionReport, error) {
	st := s.Env.Store
	if st.KnownUnpartitioned() {
		return keytable.PartitionReport{}, keytable.ErrNotPartitioned
	}
	conn, err := s.Env.Pool.Acquire(ctx)
	if err != nil {
		return keytable.PartitionReport{}, fmt.Errorf("workflow: maintain partitions: %w", keytable.Classify(err))
	}
	defer conn.Release()
	return st.MaintainPartitions(ctx, conn, s.Config.Retention, s.Config.RemoveAt)
}
