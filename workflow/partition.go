package workflow

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/store"
)

// PartitionReport is what one maintenance step did to a partitioned key table
// (docs/PARTITIONS.md): an alias of the store's, so that nobody imports store for it.
type PartitionReport = store.PartitionReport

// MaintainPartitions runs one maintenance step of a partitioned key table on one
// connection of the engine's pool: partitions created ahead, partitions past retention
// removed (see store.Store.MaintainPartitions). It returns store.ErrNotPartitioned,
// after asking once and without a connection afterwards, when the key table is not
// partitioned.
func (m Maintenance) MaintainPartitions(ctx context.Context, retention time.Duration) (PartitionReport, error) {
	if m.e.store.KnownUnpartitioned() {
		return PartitionReport{}, store.ErrNotPartitioned
	}
	conn, err := m.e.pool.Acquire(ctx)
	if err != nil {
		return PartitionReport{}, fmt.Errorf("workflow: maintain partitions: %w", store.Classify(err))
	}
	defer conn.Release()
	return m.e.store.MaintainPartitions(ctx, conn, retention)
}
