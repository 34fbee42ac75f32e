package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStandbyBehind: a call phase did not start because no streaming standby confirmed,
// within Config.StandbyWait, the commit that precedes it. The key was released; a
// retry tries again. It comes inside a *TransientError.
var ErrStandbyBehind = errors.New("no standby confirmed the commit before the call")

// standbyPoll is how often the standby wait reads pg_stat_replication.
const standbyPoll = time.Millisecond

// awaitStandby waits, when Config.StandbyWait is set, until a streaming standby has
// flushed the WAL past every commit of the key so far, so that a failover to that
// standby cannot lose the commit that precedes the call (and with it the key row whose
// id the call's derived key is built from).
func (x *exec) awaitStandby(ctx context.Context) error {
	if x.e.cfg.StandbyWait <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, x.e.cfg.StandbyWait)
	defer cancel()
	pc, err := x.e.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: acquire connection: %w", ErrStandbyBehind, err)
	}
	defer pc.Release()
	lsn, err := x.e.store.WALPosition(ctx, pc)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStandbyBehind, err)
	}
	t := time.NewTicker(standbyPoll)
	defer t.Stop()
	for {
		ok, err := x.e.store.StandbyFlushed(ctx, pc, lsn)
		switch {
		case err != nil:
			return fmt.Errorf("%w: WAL %s: %w", ErrStandbyBehind, lsn, err)
		case ok:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: WAL %s not flushed by a standby within %s", ErrStandbyBehind, lsn, x.e.cfg.StandbyWait)
		case <-t.C:
		}
	}
}
