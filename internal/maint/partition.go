package maint

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/store"
)

// Partitions is the maintenance of a partitioned key table (docs/PARTITIONS.md). An
// engine's maintenance API implements it besides Engine; a sweeper finds it with a type
// assertion, so that an Engine without it still works.
type Partitions interface {
	// MaintainPartitions creates the partitions missing ahead and removes those past
	// retention that hold no unfinished or dead-lettered key (store.MaintainPartitions).
	// It returns store.ErrNotPartitioned when the key table is not partitioned.
	MaintainPartitions(ctx context.Context, retention time.Duration) (store.PartitionReport, error)
}
