package workflow

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/maint"
	"github.com/idemflow/idemflow/store"
)

var _ maint.Partitions = maintenance{}

// MaintainPartitions runs one maintenance step of a partitioned key table on one
// connection of the engine's pool: partitions created ahead, partitions past retention
// removed (see store.Store.MaintainPartitions). It returns store.ErrNotPartitioned,
// after asking once, when the key table is not partitioned.
func (m maintenance) MaintainPartitions(ctx context.Context, retention time.Duration) (store.PartitionReport, error) {
	if m.e.store.KnownUnpartitioned() {
		return store.PartitionReport{}, store.ErrNotPartitioned
	}
	conn, err := m.e.pool.Acquire(ctx)
	if err != nil {
		return store.PartitionReport{}, fmt.Errorf("workflow: maintain partitions: %w", store.Classify(err))
	}
	defer conn.Release()
	return m.e.store.MaintainPartitions(ctx, conn, retention)
}
