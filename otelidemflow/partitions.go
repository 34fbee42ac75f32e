package otelidemflow

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemflow/idemflow/store"
)

// Partitioner is what ObservePartitions reads; *workflow.Engine satisfies it.
type Partitioner interface {
	CheckPartitions(ctx context.Context) (store.PartitionReport, error)
}

// ObservePartitions reports, at every collection of the meter provider's readers,
// how many partitions of a partitioned key table (docs/PARTITIONS.md) exist ahead of
// now, from the catalog (workflow.Engine.CheckPartitions):
//
//   - idemflow.partitions.ahead: partitions that begin after now. A claim whose
//     creation time has no partition fails (retryably), so this must never reach 0;
//     the sweepers' passes create them a week ahead.
//   - idemflow.partitions.wanted: how many the default ahead calls for (7 for day
//     partitions, 168 for hours). Alert when ahead falls below half of it, as the
//     engine and the sweepers warn.
//
// On a key table that is not partitioned nothing is reported. Unregister the returned
// registration to stop.
func (o *Observer) ObservePartitions(engine Partitioner) (metric.Registration, error) {
	ahead, err := o.meter.Int64ObservableGauge("idemflow.partitions.ahead", metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions of the partitioned key table that begin after now."))
	if err != nil {
		return nil, err
	}
	wanted, err := o.meter.Int64ObservableGauge("idemflow.partitions.wanted", metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions ahead the default calls for; fewer than half of it is worth an alert."))
	if err != nil {
		return nil, err
	}
	return o.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, o.cfg.GaugeTimeout)
		defer cancel()
		r, err := engine.CheckPartitions(ctx)
		switch {
		case errors.Is(err, store.ErrNotPartitioned):
			return nil
		case err != nil:
			return err
		}
		obs.ObserveInt64(ahead, int64(r.Ahead))
		obs.ObserveInt64(wanted, int64(r.Want))
		return nil
	}, ahead, wanted)
}
