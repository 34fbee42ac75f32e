package attempt

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/vocab"
)

const (
	// standbyPoll is how often the standby wait reads pg_stat_replication.
	standbyPoll = time.Millisecond
	// standbyFlushAfter is how long the standby wait lets the primary flush the
	// target by itself (other sessions' commits) before it makes it flush with a
	// commit of its own; at once when the session's synchronous_commit is off, where
	// only the WAL writer would, within 3 × wal_writer_delay. A standby is sent only
	// flushed WAL.
	standbyFlushAfter = 5 * time.Millisecond
)

// awaitStandby waits, when Config.StandbyWait is set, until a standby that can be
// promoted has flushed the WAL past every commit of the key so far, so that a failover
// to that standby cannot lose the commit that precedes the call (and with it the key
// row whose id the call's derived key is built from). What it cannot learn (the
// role cannot read the positions, no standby counts) fails closed: the call does not
// start.
func (x *Exec) awaitStandby(ctx context.Context) error {
	if x.env.StandbyWait <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, x.env.StandbyWait)
	defer cancel()
	pc, err := x.env.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: acquire connection: %w", vocab.ErrStandbyBehind, err)
	}
	defer pc.Release()
	// Read after the commit before the call was answered: at or past its record's end.
	lsn, async, err := x.env.Store.WALTarget(ctx, pc)
	if err != nil {
		return fmt.Errorf("%w: %w", vocab.ErrStandbyBehind, err)
	}
	t := time.NewTicker(standbyPoll)
	defer t.Stop()
	flushAt, flushed := time.Now().Add(standbyFlushAfter), false
	if async {
		flushAt = time.Time{}
	}
	unreadable := false // the last read said the role cannot read the positions
	for {
		st, err := x.env.Store.ReadStandbyState(ctx, pc, lsn, x.env.StandbyNames)
		if err == nil {
			unreadable = !st.CanRead
		}
		switch {
		case err != nil:
			return x.standbyFailed(ctx, lsn, unreadable, err)
		case st.Flushed:
			return nil
		case unreadable:
			x.warnStandbyUnreadable(ctx)
		case !st.LocalFlushed && !flushed && !time.Now().Before(flushAt):
			flushed = true
			if err := x.env.Store.FlushWAL(ctx, pc); err != nil {
				return x.standbyFailed(ctx, lsn, unreadable, err)
			}
		}
		select {
		case <-ctx.Done():
			return x.standbyFailed(ctx, lsn, unreadable, nil)
		case <-t.C:
		}
	}
}

// standbyFailed is the error of a standby wait that failed with err or, once its bound
// passed, ran out, saying what it last saw.
func (x *Exec) standbyFailed(ctx context.Context, lsn string, unreadable bool, err error) error {
	if ctx.Err() == nil {
		return fmt.Errorf("%w: WAL %s: %w", vocab.ErrStandbyBehind, lsn, err)
	}
	why := "not flushed by a standby that counts"
	if unreadable {
		why = "unknown: the role cannot read pg_stat_replication's positions (grant it pg_monitor)"
	}
	return fmt.Errorf("%w: WAL %s %s within %s", vocab.ErrStandbyBehind, lsn, why, x.env.StandbyWait)
}

// warnStandbyUnreadable logs, once per engine, that the standby wait cannot pass
// because the role cannot read the standbys' positions.
func (x *Exec) warnStandbyUnreadable(ctx context.Context) {
	if x.env.standbyWarned.CompareAndSwap(false, true) {
		x.env.Logger.WarnContext(ctx, "workflow: StandbyWait cannot read the standbys' WAL positions (pg_stat_replication): the role lacks pg_monitor; no call phase starts until it has it")
	}
}
