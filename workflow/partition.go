package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/store"
)

// MaintainPartitions runs one maintenance step of a partitioned key table on one
// connection of the engine's pool: partitions created ahead, partitions past retention
// removed (see store.Store.EnsurePartitions and RemovePartitions). It returns
// store.ErrNotPartitioned, after asking once and without a connection afterwards,
// when the key table is not partitioned.
func (m maintenance) MaintainPartitions(ctx context.Context, retention time.Duration) (store.PartitionReport, error) {
	if m.e.store.KnownUnpartitioned() {
		return store.PartitionReport{}, keytable.ErrNotPartitioned
	}
	conn, err := m.e.pool.Acquire(ctx)
	if err != nil {
		return store.PartitionReport{}, fmt.Errorf("workflow: maintain partitions: %w", keytable.Classify(err))
	}
	defer conn.Release()
	return m.e.store.MaintainPartitions(ctx, conn, retention)
}

// CheckPartitions reports how many partitions of a partitioned key table exist ahead
// of now, and how many the default calls for (store.PartitionReport's Ahead, Want; Low
// says a warning is due), from the catalog, changing nothing. It returns
// store.ErrNotPartitioned when the key table is not partitioned. The engine runs it
// once by itself, on its first connection (see startupCheck); otelidemflow reports it
// as the idemflow.partitions.ahead gauge.
func (e *Engine) CheckPartitions(ctx context.Context) (store.PartitionReport, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	r, err := e.store.CheckPartitions(ctx, e.pool)
	if err != nil {
		return r, fmt.Errorf("workflow: %w", err)
	}
	return r, nil
}

// startupCheck runs once, on the engine's first connection, before that request's
// own statements (one catalog read): on a partitioned key table the Store learns its
// layout, so that its look-ups prune partitions from the first request on
// (docs/PARTITIONS.md), and the engine warns when too few partitions exist ahead (a
// claim whose creation time has no partition fails, retryably, until a sweeper's pass
// creates it). A failure is logged at debug level: nothing depends on the check.
func (e *Engine) startupCheck(ctx context.Context, conn keytable.DBTX) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startupCheckTimeout)
	defer cancel()
	r, err := e.store.CheckPartitions(ctx, conn)
	switch {
	case errors.Is(err, keytable.ErrNotPartitioned):
	case err != nil:
		e.cfg.Logger.DebugContext(ctx, "workflow: start-up check of the key table's layout failed", "err", err)
	case r.Low():
		e.cfg.Logger.WarnContext(ctx, "workflow: too few partitions of the key table exist ahead; a sweeper's pass creates them (docs/PARTITIONS.md)",
			slog.Int("ahead", r.Ahead), slog.Int("want", r.Want))
	}
}

// startupCheckTimeout bounds the start-up check.
const startupCheckTimeout = 5 * time.Second
