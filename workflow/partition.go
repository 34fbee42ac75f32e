package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/store"
)

// CheckPartitions reports how many partitions of a partitioned key table exist ahead
// of now, and how many the default calls for (store.PartitionReport's Ahead, Want; Low
// says a warning is due), from the catalog, changing nothing. It returns
// store.ErrNotPartitioned when the key table is not partitioned. The engine runs it
// by itself, on its first connection, and until it succeeds (see startupCheck);
// otelidemflow reports it as the idemflow.partitions.ahead gauge.
func (e *Engine) CheckPartitions(ctx context.Context) (store.PartitionReport, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	r, err := e.store.CheckPartitions(ctx, e.pool)
	if err != nil {
		return r, fmt.Errorf("workflow: %w", err)
	}
	return r, nil
}

// layoutCheck is the engine's learning of the key table's layout (startupCheck): until
// it succeeds the Store treats the layout as unknown, its strictest case (every claim
// that inserts takes the claim lock and checks that no partition holds the key; see
// keytable's queueClaimChecks), and the check is tried again, on a later request's
// connection, after a backoff that doubles from layoutRetryFirst to layoutRetryMax.
type layoutCheck struct {
	learnt atomic.Bool // the check succeeded: the one load on the request path once true

	mu      sync.Mutex
	running bool          // a check is under way
	next    time.Time     // no check before it
	wait    time.Duration // the backoff after the next failure
	first   time.Duration // the first backoff; layoutRetryFirst unless a test set it
}

// The backoff between tries at learning the layout.
const (
	layoutRetryFirst = time.Second
	layoutRetryMax   = time.Minute
)

// begin reports whether a check may run now, and if so marks it running.
func (c *layoutCheck) begin(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running || now.Before(c.next) || c.learnt.Load() {
		return false
	}
	c.running = true
	return true
}

// end records a check's result: learnt, or the time of the next try.
func (c *layoutCheck) end(now time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running = false
	if ok {
		c.learnt.Store(true)
		return
	}
	if c.wait == 0 {
		c.wait = cmp.Or(c.first, layoutRetryFirst)
	}
	c.next = now.Add(c.wait)
	c.wait = min(2*c.wait, layoutRetryMax)
}

// startupCheck runs on the engine's first connection, before that request's own
// statements (one catalog read), and again on a later request's connection, after a
// backoff, until it succeeds: on a partitioned key table the Store learns its layout,
// so that its look-ups prune partitions (docs/PARTITIONS.md), and the engine warns
// when too few partitions exist ahead (a claim whose creation time has no partition
// fails, retryably, until a sweeper's pass creates it). Until it succeeds the Store
// acts as on the strictest layout; a failure (a pooled connection terminated by a
// pooler's restart, an idle timeout or a failover) is a warning and the key event
// OutcomeLayoutUnknown. Once learnt it costs one atomic load.
func (e *Engine) startupCheck(ctx context.Context, conn keytable.DBTX) {
	c := &e.layout
	if c.learnt.Load() || !c.begin(time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startupCheckTimeout)
	defer cancel()
	r, err := e.store.CheckPartitions(ctx, conn)
	failed := err != nil && !errors.Is(err, keytable.ErrNotPartitioned)
	c.end(time.Now(), !failed)
	switch {
	case failed:
		e.cfg.Logger.WarnContext(ctx, "workflow: the key table's layout is not learnt; claims take the partitioned layout's checks until it is, and it is tried again (docs/PARTITIONS.md)", "err", err)
		e.acted(ctx, KeyEvent{Kind: OutcomeLayoutUnknown, Err: err})
	case err == nil && r.Low():
		e.cfg.Logger.WarnContext(ctx, "workflow: too few partitions of the key table exist ahead; a sweeper's pass creates them (docs/PARTITIONS.md)",
			slog.Int("ahead", r.Ahead), slog.Int("want", r.Want))
	}
}

// startupCheckTimeout bounds the start-up check.
const startupCheckTimeout = 5 * time.Second
